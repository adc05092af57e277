#include "ngram_cache_drafter.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "errors.h"

NgramCacheConfig NgramCacheConfig::from(const DrafterOptions & options) {
    return NgramCacheConfig{option_text(options, "lookup_cache_static"), option_text(options, "lookup_cache_dynamic")};
}

CacheNgram::CacheNgram() { std::fill(tokens, tokens + NGRAM_CACHE_MAX, LLAMA_TOKEN_NULL); }

CacheNgram::CacheNgram(const llama_token * input, int size) {
    for (int i = 0; i < NGRAM_CACHE_MAX; ++i) {
        tokens[i] = i < size ? input[i] : LLAMA_TOKEN_NULL;
    }
}

bool CacheNgram::operator==(const CacheNgram & other) const {
    return std::equal(tokens, tokens + NGRAM_CACHE_MAX, other.tokens);
}

size_t CacheNgramHash::operator()(const CacheNgram & ngram) const {
    size_t hash = 0;
    for (const llama_token t : ngram.tokens) {
        hash ^= (size_t) t * 11400714819323198485llu;  // common_token_hash_function
    }
    return hash;
}

void ngram_cache_update(NgramCache & cache, int ngram_min, int ngram_max, const std::vector<llama_token> & inp, int nnew) {
    const int64_t inp_size = (int64_t) inp.size();
    for (int64_t ngram_size = ngram_min; ngram_size <= ngram_max; ++ngram_size) {
        for (int64_t i = std::max(inp_size - nnew, ngram_size); i < inp_size; ++i) {
            const CacheNgram ngram(&inp[i - ngram_size], (int) ngram_size);
            const llama_token token = inp[i];
            const auto part_it = cache.find(ngram);
            if (part_it == cache.end()) {
                NgramCachePart part;  // (built, then copied in, as llama.cpp's: the same bucket layout)
                part.emplace(token, 1);
                cache.emplace(ngram, part);
                continue;
            }
            const auto count_it = part_it->second.find(token);
            if (count_it == part_it->second.end()) {
                part_it->second.emplace(token, 1);
            } else {
                ++count_it->second;
            }
        }
    }
}

namespace {

// If the sample size or the share of the most frequent token is below these, the cache has no draft token
// (per n-gram size 1 .. 4; common/ngram-cache.cpp's draft_min_sample_size_* and draft_min_percent_*).
constexpr int MIN_SAMPLE_SIZE_LAX[NGRAM_CACHE_MAX] = {2, 2, 1, 1};
constexpr int MIN_PERCENT_LAX[NGRAM_CACHE_MAX] = {66, 50, 50, 50};
constexpr int MIN_SAMPLE_SIZE_STRICT[NGRAM_CACHE_MAX] = {4, 3, 2, 2};
constexpr int MIN_PERCENT_STRICT[NGRAM_CACHE_MAX] = {75, 66, 66, 66};

// try_draft from the static cache alone: its most frequent token after ngram_static (the first of a tie)
llama_token try_draft_static(const NgramCache & nc_static, const CacheNgram & ngram_static) {
    const auto it = nc_static.find(ngram_static);
    if (it == nc_static.end()) {
        return LLAMA_TOKEN_NULL;
    }
    int64_t max_count = 0, sum_count = 0;
    llama_token max_token = LLAMA_TOKEN_NULL;
    for (const auto & [token, count] : it->second) {
        if (count > max_count) {
            max_token = token;
            max_count = count;
        }
        sum_count += count;
    }
    const int k = NGRAM_CACHE_STATIC - 1;
    if (sum_count < MIN_SAMPLE_SIZE_LAX[k] || 100 * max_count < MIN_PERCENT_LAX[k] * sum_count) {
        return LLAMA_TOKEN_NULL;
    }
    return max_token;
}

// try_draft from a primary cache (context or dynamic), the longest n-gram first, its counts weighed by the static
// part (x 100 its count, 1 where it has none); products in 64 bits (llama.cpp's int products could overflow)
llama_token try_draft_primary(const NgramCache & nc_primary, const CacheNgram * ngrams, const NgramCachePart & part_static,
                              const int * min_sample_size, const int * min_percent) {
    for (int i = NGRAM_CACHE_MAX - NGRAM_CACHE_MIN; i >= 0; --i) {
        const auto it = nc_primary.find(ngrams[i]);
        if (it == nc_primary.end()) {
            continue;
        }
        int64_t max_count_primary = 0, max_count_static = 0, sum_count_primary = 0;
        llama_token max_token = LLAMA_TOKEN_NULL;
        for (const auto & [token, count_primary] : it->second) {
            const auto static_it = part_static.find(token);
            const int64_t count_static = static_it != part_static.end() ? 100 * (int64_t) static_it->second : 1;
            if (count_primary * count_static > max_count_primary * max_count_static) {
                max_token = token;
                max_count_primary = count_primary;
                max_count_static = count_static;
            }
            sum_count_primary += count_primary;
        }
        if (sum_count_primary < min_sample_size[i] || 100 * max_count_primary < min_percent[i] * sum_count_primary) {
            continue;
        }
        return max_token;
    }
    return LLAMA_TOKEN_NULL;
}

}  // namespace

std::vector<llama_token> ngram_cache_draft(const std::vector<llama_token> & inp, int n_draft, const NgramCache & nc_context,
                                           const NgramCache & nc_dynamic, const NgramCache & nc_static) {
    std::vector<llama_token> draft;
    const int inp_size = (int) inp.size();
    if (inp_size < NGRAM_CACHE_STATIC) {
        return draft;
    }
    // the token at position i of inp followed by the draft (LLAMA_TOKEN_NULL before inp's start)
    const auto token_at = [&](int i) { return i < 0 ? LLAMA_TOKEN_NULL : i < inp_size ? inp[i] : draft[i - inp_size]; };
    const auto ngram_ending_here = [&](int size) {
        CacheNgram ngram;
        const int start = inp_size + (int) draft.size() - size;
        for (int j = 0; j < size; ++j) {
            ngram.tokens[j] = token_at(start + j);
        }
        return ngram;
    };
    static const NgramCachePart no_part;
    while ((int) draft.size() < n_draft) {
        const CacheNgram ngram_static = ngram_ending_here(NGRAM_CACHE_STATIC);
        const auto static_it = nc_static.find(ngram_static);
        const NgramCachePart & part_static = static_it != nc_static.end() ? static_it->second : no_part;
        CacheNgram ngrams_cd[NGRAM_CACHE_MAX - NGRAM_CACHE_MIN + 1];  // context + dynamic, by size
        for (int size = NGRAM_CACHE_MIN; size <= NGRAM_CACHE_MAX; ++size) {
            ngrams_cd[size - NGRAM_CACHE_MIN] = ngram_ending_here(size);
        }
        llama_token token = try_draft_primary(nc_context, ngrams_cd, part_static, MIN_SAMPLE_SIZE_LAX, MIN_PERCENT_LAX);
        if (token == LLAMA_TOKEN_NULL) {
            token = try_draft_primary(nc_dynamic, ngrams_cd, part_static, MIN_SAMPLE_SIZE_STRICT, MIN_PERCENT_STRICT);
        }
        if (token == LLAMA_TOKEN_NULL) {
            token = try_draft_static(nc_static, ngram_static);
        }
        if (token == LLAMA_TOKEN_NULL) {
            break;
        }
        draft.push_back(token);
    }
    return draft;
}

namespace {

// reads one int32 field; false at the end of the file
bool read_i32(std::ifstream & in, int32_t & value) { return (bool) in.read(reinterpret_cast<char *>(&value), sizeof value); }

}  // namespace

NgramCache ngram_cache_load(const std::string & path, int32_t n_vocab, const char * flag) {
    const std::string what = std::string("ngram-cache: the lookup cache ") + path + " (" + flag + ")";
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
        fail(ErrorKind::PARAMETER, what + " does not exist");
    }
    if (!std::filesystem::is_regular_file(path, ec)) {
        fail(ErrorKind::PARAMETER, what + " is not a file");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        fail(ErrorKind::PARAMETER, what + " cannot be opened");
    }
    const auto bad = [&](const std::string & why, int64_t record) {
        fail(ErrorKind::PARAMETER, what + " is malformed: " + why + " in record " + std::to_string(record) +
                                       " (llama.cpp's common_ngram_cache_save format)");
    };
    const auto in_vocab = [&](llama_token t) { return t >= 0 && t < n_vocab; };
    NgramCache cache;
    CacheNgram ngram;
    for (int64_t record = 0; in.read(reinterpret_cast<char *>(&ngram), sizeof ngram); ++record) {
        int32_t ntokens = 0;
        if (!read_i32(in, ntokens) || ntokens < 1) {
            bad(ntokens < 1 && !in.eof() ? "a token count below 1" : "the file ends", record);
        }
        for (const llama_token t : ngram.tokens) {
            if (t != LLAMA_TOKEN_NULL && !in_vocab(t)) {
                bad("n-gram token " + std::to_string(t) + " outside the model's vocabulary", record);
            }
        }
        NgramCachePart part;
        for (int32_t i = 0; i < ntokens; ++i) {
            llama_token token = 0;
            int32_t count = 0;
            if (!read_i32(in, token) || !read_i32(in, count)) {
                bad("the file ends", record);
            }
            if (!in_vocab(token) || count < 1) {
                bad(in_vocab(token) ? "a count below 1" : "token " + std::to_string(token) + " outside the model's vocabulary",
                    record);
            }
            part.emplace(token, count);
        }
        cache.emplace(ngram, part);
    }
    if (in.gcount() != 0) {
        fail(ErrorKind::PARAMETER, what + " is malformed: a partial n-gram record at its end");
    }
    return cache;
}

namespace {

// what identifies a loaded file: its size and modification time, and the vocabulary it was checked against
struct FileStamp {
    uintmax_t size;
    std::filesystem::file_time_type mtime;
    int32_t n_vocab;

    bool operator==(const FileStamp & o) const { return size == o.size && mtime == o.mtime && n_vocab == o.n_vocab; }
};

std::mutex files_mutex;
std::map<std::string, std::pair<FileStamp, std::weak_ptr<const NgramCache>>> files;  // by path

}  // namespace

std::shared_ptr<const NgramCache> ngram_cache_file(const std::string & path, int32_t n_vocab, const char * flag) {
    std::error_code ec_size, ec_time;
    const FileStamp stamp{std::filesystem::file_size(path, ec_size), std::filesystem::last_write_time(path, ec_time),
                          n_vocab};
    std::lock_guard<std::mutex> lk(files_mutex);
    const auto it = files.find(path);
    if (!ec_size && !ec_time && it != files.end() && it->second.first == stamp) {
        if (std::shared_ptr<const NgramCache> cache = it->second.second.lock()) {
            return cache;
        }
    }
    auto cache = std::make_shared<const NgramCache>(ngram_cache_load(path, n_vocab, flag));
    files[path] = {stamp, cache};
    return cache;
}

NgramCacheDrafter::NgramCacheDrafter(DrafterId id, const LookupVocab & vocab, const NgramCacheConfig & config)
    : LookupDrafter(id, vocab) {
    const int32_t n_vocab = vocab.n_tokens;
    const auto none = std::make_shared<const NgramCache>();
    nc_static = config.lookup_cache_static.empty()
                    ? none
                    : ngram_cache_file(config.lookup_cache_static, n_vocab, "--lookup-cache-static");
    nc_dynamic = config.lookup_cache_dynamic.empty()
                     ? none
                     : ngram_cache_file(config.lookup_cache_dynamic, n_vocab, "--lookup-cache-dynamic");
}

void NgramCacheDrafter::on_begin(const std::vector<llama_token> & /*prompt*/) {
    nc_context = NgramCache();
    cache_size = 0;
}

std::vector<llama_token> NgramCacheDrafter::lookup(const DraftRequest & req) {
    const size_t n = req.n_history;
    if (cache_size < n + 1) {
        chunk.assign(req.history + std::min(cache_size, n), req.history + n);
        chunk.push_back(req.id_last);
        ngram_cache_update(nc_context, NGRAM_CACHE_MIN, NGRAM_CACHE_MAX, chunk, (int) chunk.size());
        cache_size = n + 1;
    }
    inp.assign(req.history, req.history + n);
    inp.push_back(req.id_last);
    return ngram_cache_draft(inp, NGRAM_CACHE_N_DRAFT, nc_context, *nc_dynamic, *nc_static);
}
