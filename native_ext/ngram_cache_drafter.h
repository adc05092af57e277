// llama.cpp's `ngram-cache` drafter (common/ngram-cache.{h,cpp} and common_speculative_impl_ngram_cache in
// common/speculative.cpp, 0.3.36): n-gram caches map each n-gram to the counts of the tokens that followed it.
//
// - The context cache holds the 1- to 4-grams (LLAMA_NGRAM_MIN .. LLAMA_NGRAM_MAX) of the generation. llama.cpp
//   grows it at each draft call with the tokens since the previous call (the first call: the whole history) and the
//   last sampled token, updating it with that chunk alone: n-grams that straddle two chunks never enter it.
// - The dynamic cache (-lcd) and the static cache (-lcs, 2-grams: LLAMA_NGRAM_STATIC) are read from files written by
//   common_ngram_cache_save (llama-lookup-create writes a static one) and never change: llama.cpp 0.3.36's
//   ngram-cache neither updates nor saves the dynamic cache (its accept is a no-op, save_dynamic is false), so
//   neither do we.
//
// A draft (common_ngram_cache_draft) extends the last tokens one token at a time, up to 8 (create_state_ngram_cache's
// n_draft; then cut to the step's cap): from the context cache's longest n-gram that passes the lax sample-size and
// share thresholds, else the dynamic cache's under the strict ones, else the static cache alone; a candidate's count
// is weighed by its count in the static cache after the last two tokens. Ties go to the first candidate in the
// iteration order of std::unordered_map, as llama.cpp's (the same types, filled in the same order). Its explicit
// state: the three caches and how many tokens the context cache has seen. No model, no confidence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "drafter.h"
#include "llama.h"
#include "ngram_drafter.h"

constexpr int NGRAM_CACHE_MIN = 1;      // LLAMA_NGRAM_MIN: shortest n-gram of the context and dynamic caches
constexpr int NGRAM_CACHE_MAX = 4;      // LLAMA_NGRAM_MAX: longest n-gram (and the size of an n-gram record)
constexpr int NGRAM_CACHE_STATIC = 2;   // LLAMA_NGRAM_STATIC: the static cache's n-grams
constexpr int NGRAM_CACHE_N_DRAFT = 8;  // longest draft (create_state_ngram_cache's n_draft, not configurable)

struct NgramCacheConfig {
    std::string lookup_cache_static;   // option "lookup_cache_static" (llama.cpp: -lcs, --lookup-cache-static); "": none
    std::string lookup_cache_dynamic;  // option "lookup_cache_dynamic" (-lcd, --lookup-cache-dynamic); "": none

    // The file names from the drafter options (missing keys: none).
    static NgramCacheConfig from(const DrafterOptions & options);
};

// common_ngram: up to NGRAM_CACHE_MAX tokens, the unused ones LLAMA_TOKEN_NULL (the file's record layout too).
struct CacheNgram {
    llama_token tokens[NGRAM_CACHE_MAX];

    CacheNgram();
    CacheNgram(const llama_token * input, int size);
    bool operator==(const CacheNgram & other) const;
};
static_assert(sizeof(CacheNgram) == NGRAM_CACHE_MAX * sizeof(llama_token), "common_ngram's record layout");

// common_ngram_hash_function: the tokens' Fibonacci hashes (token * 11400714819323198485) xor-ed.
struct CacheNgramHash {
    size_t operator()(const CacheNgram & ngram) const;
};

using NgramCachePart = std::unordered_map<llama_token, int32_t>;                     // token -> times seen after it
using NgramCache = std::unordered_map<CacheNgram, NgramCachePart, CacheNgramHash>;  // n-gram -> its part

// common_ngram_cache_update: the ngram_min- to ngram_max-grams of inp that end in its last nnew tokens enter the cache.
void ngram_cache_update(NgramCache & cache, int ngram_min, int ngram_max, const std::vector<llama_token> & inp, int nnew);

// common_ngram_cache_draft after inp (the history and the last sampled token): up to n_draft tokens (the draft
// without llama.cpp's leading last token). Where an n-gram would reach before inp's start (llama.cpp reads out of its
// vector there), it is looked up with LLAMA_TOKEN_NULL in those places, which no cache entry has.
std::vector<llama_token> ngram_cache_draft(const std::vector<llama_token> & inp, int n_draft, const NgramCache & nc_context,
                                           const NgramCache & nc_dynamic, const NgramCache & nc_static);

// common_ngram_cache_load: the cache in `path` (records of common_ngram, int32 ntokens, then ntokens x (token,
// int32 count)). Throws a parameter error naming the file and `flag` when it cannot be read, is malformed (a
// truncated record, also a partial one at the end, which llama.cpp ignores; ntokens or a count below 1) or holds a
// token outside [0, n_vocab) (drafting it would fail the verify).
NgramCache ngram_cache_load(const std::string & path, int32_t n_vocab, const char * flag);

// ngram_cache_load, shared: while a drafter holds the cache of a file, another one asking for the same unchanged file
// (path, size, modification time) and vocabulary size gets it without reading it again (a generation's drafters are
// built while the previous generation's are still alive, so a sweep reads a large static cache once).
std::shared_ptr<const NgramCache> ngram_cache_file(const std::string & path, int32_t n_vocab, const char * flag);

struct NgramCacheDrafter final : LookupDrafter {
    NgramCacheDrafter(DrafterId id, const LookupVocab & vocab, const NgramCacheConfig & config);

    NgramCache nc_context;                         // grown along the generation
    std::shared_ptr<const NgramCache> nc_dynamic;  // read from lookup_cache_dynamic (empty: none)
    std::shared_ptr<const NgramCache> nc_static;   // read from lookup_cache_static (empty: none)
    size_t cache_size = 0;  // history tokens (and the last sampled one) the context cache has seen

  protected:
    // A fresh context cache (llama.cpp's begin is a no-op: its state is one process's generation).
    void on_begin(const std::vector<llama_token> & prompt) override;
    // draft_one: the tokens since the last call and req.id_last enter the context cache, then the draft.
    std::vector<llama_token> lookup(const DraftRequest & req) override;

  private:
    std::vector<llama_token> chunk, inp;  // scratch: the context cache's new tokens; the history and id_last
};
