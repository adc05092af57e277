// llama.cpp's `ngram-mod` drafter (common/ngram-mod.{h,cpp} and common_speculative_impl_ngram_mod in
// common/speculative.cpp, 0.3.36): a hash table of 4 Mi entries maps each n_match-gram of the context to the
// token that followed it (a collision overwrites); the draft follows the table from the last n_match tokens
// for up to n_max tokens, empty when the table runs out before n_min. Its explicit state: the table, how far
// into the context it has been filled (i_last, refilled in chunks of more than 32 tokens), the length of its
// last draft and the streak of low-acceptance steps that resets the table. No model, no confidence.
#pragma once

#include <cstdint>
#include <vector>

#include "drafter.h"
#include "llama.h"
#include "ngram_drafter.h"

struct NgramModConfig {
    int32_t n_match = 24;  // tokens hashed (option "ngram_mod_n_match"; llama.cpp: --spec-ngram-mod-n-match)
    int32_t n_min = 48;    // a draft that runs out before this is empty (--spec-ngram-mod-n-min)
    int32_t n_max = 64;    // longest draft (--spec-ngram-mod-n-max)

    // The sizes from the drafter options (missing keys: the defaults above); throws a parameter error out of
    // llama.cpp's ranges (n_match in [1, 1024], n_min and n_max in [0, 1024]).
    static NgramModConfig from(const DrafterOptions & options);
};

// common_ngram_mod: the table. idx() hashes n tokens (res = res * 6364136223846793005 + token, modulo the
// size, in size_t arithmetic); add() stores the token after them; get() reads it (EMPTY when none).
// A table starts empty, as llama.cpp's does in a new process. Its 16 MB of entries come from a small
// process-wide pool when the drafter begins (acquire), after the engine has released the last generation's
// drafters, and go back to it cleared (only the entries it filled), so that a generation does not pay for
// allocating, faulting in and clearing the whole table (llama.cpp allocates its table before its timed loop).
struct NgramModTable {
    static constexpr int32_t EMPTY = -1;
    static constexpr size_t SIZE = 4 * 1024 * 1024;  // llama.cpp's size

    explicit NgramModTable(size_t n) : n(n) {}
    void acquire();  // the entries, from the pool or new; none before
    ~NgramModTable();
    NgramModTable(const NgramModTable &) = delete;
    NgramModTable & operator=(const NgramModTable &) = delete;

    size_t idx(const llama_token * tokens) const;
    void add(const llama_token * tokens);       // tokens[0 .. n] (n + 1 tokens)
    int32_t get(const llama_token * tokens) const;
    void reset();

    const size_t n;
    size_t used = 0;
    std::vector<int32_t> entries;
    std::vector<uint32_t> filled;  // the indices of the entries in use (used of them)
};

struct NgramModDrafter final : LookupDrafter {
    NgramModDrafter(DrafterId id, const LookupVocab & vocab, const NgramModConfig & config)
        : LookupDrafter(id, vocab), config(config), table((size_t) config.n_match) {}

    const NgramModConfig config;
    NgramModTable table;
    size_t i_last = 0;        // context positions before this are in the table
    size_t n_draft_last = 0;  // length of its last draft (before the cap), 0: none
    int32_t n_low = 0;        // consecutive low-acceptance steps (a reset counts in stats.n_resets)

  protected:
    // common_speculative_impl_ngram_mod::begin over the prompt but its last token (llama.cpp's prompt_tgt):
    // its n-grams enter the table, i_last after them; the table is reset past 25 % occupancy.
    void on_begin(const std::vector<llama_token> & prompt) override;
    // draft_one: new n-grams enter the table once more than 32 tokens are pending, then the look-up chain
    // after the last n_match tokens, empty when the table runs out before n_min.
    std::vector<llama_token> lookup(const DraftRequest & req) override;
    // As the drafter verified last (llama.cpp's accept with is_other false): its last draft's acceptance
    // fraction below 0.25 five steps in a row resets the table (refilled from the start at its next draft).
    void on_outcome(const DraftOutcome & outcome) override;

  private:
    std::vector<llama_token> window;  // scratch: the n_match tokens, then the draft
};
