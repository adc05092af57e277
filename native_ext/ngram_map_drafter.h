// llama.cpp's `ngram-map-k` and `ngram-map-k4v` drafters (common/ngram-map.{h,cpp}, common_ngram_map_* and
// common_speculative_impl_ngram_map_k in common/speculative.cpp, 0.3.36), one generation of one sequence.
//
// The key is the last size_n tokens (ending with the last sampled token). Earlier occurrences of it are found
// through a hash map (2^18 slots, the LCG hash of the n-gram, the first index stored in a slot stays) filled as
// the context grows, or by a linear search over the positions not hashed yet. Each key that matched gets a
// statistics entry. ngram-map-k drafts the size_m tokens after the match, as many as were accepted the last
// time this key's draft was verified. ngram-map-k4v also counts the distinct size_m-grams that followed the
// key (up to 4) and drafts only when the key was seen min_hits times and its most frequent m-gram occurred at
// least twice as often as the others together. No model, no confidence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "drafter.h"
#include "llama.h"
#include "ngram_drafter.h"

struct NgramMapConfig {
    int32_t size_n = 12;    // key n-gram (option "<prefix>_size_n"; llama.cpp: --spec-<prefix>-size-n)
    int32_t size_m = 48;    // value m-gram, the longest draft (--spec-<prefix>-size-m)
    int32_t min_hits = 1;   // key hits before ngram-map-k4v drafts (--spec-<prefix>-min-hits; unused by ngram-map-k)
    bool key_only = true;   // ngram-map-k (true) or ngram-map-k4v (false)

    // The sizes from the drafter options under `prefix` ("ngram_map_k" or "ngram_map_k4v"); throws a
    // parameter error out of llama.cpp's ranges (sizes in [1, 1024], min_hits at least 1).
    static NgramMapConfig from(const DrafterOptions & options, const std::string & prefix, bool key_only);
};

struct NgramMapValue {
    size_t value_idx = 0;     // where the m-gram starts in the context (0: unused slot)
    int32_t value_num = 0;    // its occurrences after the key
    int32_t n_accepted = -1;  // tokens accepted the last time a draft of it was verified
};

struct NgramMapKey {
    static constexpr int N_VALUES = 4;
    size_t key_idx = 0;   // where the key n-gram occurs
    size_t stat_idx = 0;  // the value statistics cover the context up to here
    int32_t key_num = 0;  // key hits
    NgramMapValue values[N_VALUES];
};

// common_ngram_map for one sequence: begin / draft / accept as llama.cpp's.
struct NgramMap {
    static constexpr size_t HASH_SIZE = 262144;
    static constexpr int32_t MAX_COUNT = 16380;

    explicit NgramMap(const NgramMapConfig & config) : config(config), key_map(HASH_SIZE, 0) {}

    void begin(size_t n_prompt);  // the prompt but its last token has n_prompt tokens
    // The draft after inp[0 .. cur_len) and `sampled` (empty: none); updates the hash map and the statistics.
    std::vector<llama_token> draft(const llama_token * inp, size_t cur_len, llama_token sampled);
    void accept(int32_t n_accepted);  // the last draft's key/value remembers n_accepted

    const NgramMapConfig config;
    std::vector<NgramMapKey> keys;
    std::vector<uint32_t> key_map;  // hash -> index of an n-gram in the context (0: none)
    uint32_t key_map_last_idx = 0;
    size_t size_last_begin = 0, idx_last_check = 0;
    bool last_draft_created = false;
    size_t last_draft_key = 0;
    int last_draft_value = 0;

  private:
    bool key_at(const llama_token * inp, size_t j) const;  // inp[j .. j + n) is the current key
    size_t find_match(const llama_token * inp, size_t cur_len) const;
    void hash_new(const llama_token * inp, size_t cur_len);
    size_t key_entry(const llama_token * inp, size_t match_pos);
    bool count_values(NgramMapKey & key, const llama_token * inp, size_t match_pos, int & slot) const;

    std::vector<llama_token> key;  // scratch: the current key n-gram
};

struct NgramMapDrafter final : LookupDrafter {
    NgramMapDrafter(DrafterId id, const LookupVocab & vocab, const NgramMapConfig & config)
        : LookupDrafter(id, vocab), map(config) {}

    NgramMap map;

  protected:
    void on_begin(const std::vector<llama_token> & prompt) override { map.begin(prompt.empty() ? 0 : prompt.size() - 1); }
    std::vector<llama_token> lookup(const DraftRequest & req) override {
        return map.draft(req.history, req.n_history, req.id_last);
    }
    // As the drafter verified last (llama.cpp's accept with is_other false): the map remembers n_accepted.
    void on_outcome(const DraftOutcome & outcome) override;
};
