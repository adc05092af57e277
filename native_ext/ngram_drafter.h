// The n-gram prompt-lookup drafter: llama.cpp's `ngram-simple` (common/ngram-map.cpp,
// common_ngram_simple_draft): match the last `size_n` tokens (ending with the last sampled token)
// earlier in the context and propose the `size_m` tokens that followed the most recent match.
// No model, no confidence. Its explicit state is only the running per-depth acceptance it needs to
// estimate its expected accepted length (used by the chain's BEST policy).
#pragma once

#include <cstdint>
#include <vector>

#include "drafter.h"
#include "llama.h"
#include "lookup_vocab.h"

struct NgramConfig {
    int32_t size_n = 12;  // n-gram looked up (option "ngram_simple_size_n"; llama.cpp: --spec-ngram-simple-size-n)
    int32_t size_m = 48;  // m-gram proposed after the match (option "ngram_simple_size_m"; llama.cpp: --spec-ngram-simple-size-m)

    // The sizes from the drafter options (missing keys: the defaults above); throws a parameter
    // error when one is below 1.
    static NgramConfig from(const DrafterOptions & options);
};

// Exactly llama.cpp's common_ngram_simple_draft: `tokens[0, cur_len)` is the history before the
// last sampled token `sampled`. Returns the draft (empty: no match).
std::vector<llama_token> ngram_simple_draft(const NgramConfig & cfg, const llama_token * tokens, size_t cur_len,
                                            llama_token sampled);

// What every look-up drafter (no model, no confidence) shares.
//
// fill_lookup_draft: the look-up's tokens `found` as the step's draft: cut after an end-of-generation
// token and to req.n_cap; stop reason cap_reason at n_cap, `eos` at an end-of-generation token,
// `exhausted` when the look-up had no (more) tokens; dropped when shorter than req.params.n_min.
void fill_lookup_draft(const std::vector<llama_token> & found, const DraftRequest & req, const LookupVocab & vocab,
                       Draft & out);

// The running acceptance per depth that estimates a look-up draft's expected accepted length (the chain's
// BEST policy compares it): depth j counts as tested when the first j-1 proposal tokens matched and the
// emitted tokens reach depth j.
struct RunningAcceptance {
    std::vector<int64_t> tested, accepted;  // per depth (index 0 = depth 1)

    void clear();
    // Sum over k of prod_{j<=k} a_j, with a_j = (accepted_j + 1) / (tested_j + 2), for a draft of n tokens.
    double expected(int32_t n) const;
    // The drafter's proposal (verified or not) against the tokens the step emitted.
    void observe(const DraftOutcome & outcome, const LookupVocab & vocab);
};

// A look-up drafter (no model, no confidence): the Drafter interface once for all of them. begin() forgets the
// running acceptance and calls on_begin(); draft() takes no part when n_cap is 0, else cuts lookup()'s tokens
// with fill_lookup_draft; the expected accepted length is the running acceptance's; accept() lets it observe
// the step, then on_outcome() updates the drafter's own state.
struct LookupDrafter : Drafter {
    LookupDrafter(DrafterId id, const LookupVocab & vocab) : Drafter(id), vocab(vocab) {}

    void begin(const std::vector<llama_token> & prompt) final;
    bool draft(const DraftRequest & req, Draft & out) final;
    double expected_accepted(const Draft & d) const final;
    void accept(const DraftOutcome & outcome) final;

    RunningAcceptance acceptance;

  protected:
    // The drafter's look-up after req.id_last in req.history (its state advanced as llama.cpp's draft advances it).
    virtual std::vector<llama_token> lookup(const DraftRequest & req) = 0;
    virtual void on_begin(const std::vector<llama_token> & /*prompt*/) {}
    virtual void on_outcome(const DraftOutcome & /*outcome*/) {}

    const LookupVocab & vocab;  // the engine's (or the walk's): outlives its drafters
};

// llama.cpp's ngram-simple: stateless (ngram_simple_draft).
struct NgramSimpleDrafter final : LookupDrafter {
    NgramSimpleDrafter(DrafterId id, const LookupVocab & vocab, const NgramConfig & config)
        : LookupDrafter(id, vocab), config(config) {}

    const NgramConfig config;

  protected:
    std::vector<llama_token> lookup(const DraftRequest & req) override {
        return ngram_simple_draft(config, req.history, req.n_history, req.id_last);
    }
};
