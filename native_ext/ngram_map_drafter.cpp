#include "ngram_map_drafter.h"

#include <algorithm>

#include "errors.h"

NgramMapConfig NgramMapConfig::from(const DrafterOptions & options, const std::string & prefix, bool key_only) {
    const NgramMapConfig d;
    NgramMapConfig c;
    c.size_n = option_or(options, (prefix + "_size_n").c_str(), d.size_n);
    c.size_m = option_or(options, (prefix + "_size_m").c_str(), d.size_m);
    c.min_hits = option_or(options, (prefix + "_min_hits").c_str(), d.min_hits);
    c.key_only = key_only;
    if (c.size_n < 1 || c.size_n > 1024 || c.size_m < 1 || c.size_m > 1024 || c.min_hits < 1 || c.min_hits > 65535) {
        fail(ErrorKind::PARAMETER, prefix + ": the sizes must be in [1, 1024], min_hits in [1, 65535]");
    }
    return c;
}

namespace {

// common_ngram_map_hash: the 32-bit LCG hash of tokens[start .. start + len)
uint32_t lcg_hash(const llama_token * tokens, size_t start, size_t len) {
    uint32_t hash = 0;
    for (size_t i = 0; i < len; ++i) {
        hash = (uint32_t) (hash * 2654435761UL + (unsigned long) tokens[start + i]);
    }
    return hash;
}

}  // namespace

void NgramMap::begin(size_t n_prompt) {
    // a fresh map (one per generation): llama.cpp's clean-up of a shrunk context does not arise
    idx_last_check = n_prompt;
    size_last_begin = n_prompt;
}

bool NgramMap::key_at(const llama_token * inp, size_t j) const {
    for (size_t k = 0; k < key.size(); ++k) {
        if (inp[j + k] != key[k]) {
            return false;
        }
    }
    return true;
}

// the hash map's entry if it is the key and old enough, else the latest match among the positions not hashed
// yet: first those of the prompt, then the generated ones
size_t NgramMap::find_match(const llama_token * inp, size_t cur_len) const {
    const size_t n = (size_t) config.size_n, m = (size_t) config.size_m;
    const uint32_t idx_key = key_map[lcg_hash(key.data(), 0, n) % key_map.size()];
    if (idx_key != 0 && idx_key < cur_len - n - m - 1 && key_at(inp, idx_key)) {
        return idx_key;
    }
    if (size_last_begin > n + m + 1) {
        for (size_t j = size_last_begin - n - m - 1; j > key_map_last_idx; --j) {
            if (key_at(inp, j)) {
                return j;
            }
        }
    }
    for (size_t j = cur_len - n - m - 1; j > size_last_begin && j > key_map_last_idx; --j) {
        if (key_at(inp, j)) {
            return j;
        }
    }
    return 0;
}

// the n-grams not hashed yet enter the hash map (a slot keeps its first index), in the order of the search
void NgramMap::hash_new(const llama_token * inp, size_t cur_len) {
    const size_t n = (size_t) config.size_n, m = (size_t) config.size_m;
    auto add = [&](size_t j) {
        uint32_t & slot = key_map[lcg_hash(inp, j, n) % key_map.size()];
        if (slot == 0) {
            slot = (uint32_t) j;
        }
    };
    if (size_last_begin > n + m + 1) {
        for (size_t j = size_last_begin - n - m - 1; j > key_map_last_idx; --j) {
            add(j);
        }
    }
    for (size_t j = cur_len - n - m - 1; j > size_last_begin && j > key_map_last_idx; --j) {
        add(j);
    }
    key_map_last_idx = std::max((uint32_t) (cur_len - n - m - 1), key_map_last_idx);
}

// the statistics entry of the current key (a new one at match_pos if none)
size_t NgramMap::key_entry(const llama_token * inp, size_t match_pos) {
    for (size_t i = 0; i < keys.size(); ++i) {
        if (key_at(inp, keys[i].key_idx)) {
            return i;
        }
    }
    NgramMapKey k;
    k.key_idx = match_pos;
    for (NgramMapValue & v : k.values) {
        v.n_accepted = config.size_m;
    }
    keys.push_back(k);
    return keys.size() - 1;
}

// ngram-map-k4v: count the m-grams after the key up to match_pos; false when the most frequent one is not at
// least twice as frequent as the others together (no draft), else its slot
bool NgramMap::count_values(NgramMapKey & k, const llama_token * inp, size_t match_pos, int & slot) const {
    const size_t n = (size_t) config.size_n, m = (size_t) config.size_m;
    for (size_t i = k.stat_idx; i <= match_pos; ++i) {
        if (!key_at(inp, i)) {
            continue;
        }
        const size_t begin = i + n;
        for (NgramMapValue & v : k.values) {
            const bool fresh = v.value_idx == 0;
            if (fresh || std::equal(inp + begin, inp + begin + m, inp + v.value_idx)) {
                if (fresh) {
                    v = NgramMapValue{begin, 0, config.size_m};
                }
                v.value_num = std::min(v.value_num + 1, MAX_COUNT);
                break;
            }
        }
    }
    k.stat_idx = match_pos;
    int32_t max_occur = 0, sum_occur = 0;
    slot = 0;
    for (int v = 0; v < NgramMapKey::N_VALUES; ++v) {
        if (k.values[v].value_num > max_occur) {
            max_occur = k.values[v].value_num;
            slot = v;
        }
    }
    for (int v = 0; v < NgramMapKey::N_VALUES; ++v) {
        sum_occur += v == slot ? 0 : k.values[v].value_num;
    }
    return !(sum_occur > 0 && max_occur < 2 * sum_occur);
}

std::vector<llama_token> NgramMap::draft(const llama_token * inp, size_t cur_len, llama_token sampled) {
    last_draft_created = false;
    last_draft_key = 0;
    last_draft_value = 0;
    std::vector<llama_token> out;
    const size_t n = (size_t) config.size_n, m = (size_t) config.size_m;
    if (cur_len < 2 * n + m) {
        return out;
    }
    idx_last_check = cur_len;
    key.assign(inp + cur_len - n + 1, inp + cur_len);
    key.push_back(sampled);
    const size_t match_pos = find_match(inp, cur_len);
    hash_new(inp, cur_len);
    if (match_pos == 0) {
        return out;
    }
    const size_t offset = key_entry(inp, match_pos);
    NgramMapKey & k = keys[offset];
    k.key_num = std::min(k.key_num + 1, MAX_COUNT);
    int slot = 0;
    if (!config.key_only && (k.key_num < config.min_hits || !count_values(k, inp, match_pos, slot))) {
        return out;
    }
    const int32_t n_draft = std::min(config.size_m, (int32_t) k.values[slot].n_accepted);
    for (int32_t i = 0; i < n_draft; ++i) {
        out.push_back(inp[match_pos + n + (size_t) i]);
    }
    last_draft_created = true;
    last_draft_key = offset;
    last_draft_value = slot;
    return out;
}

void NgramMap::accept(int32_t n_accepted) {
    if (last_draft_created) {
        keys[last_draft_key].values[last_draft_value].n_accepted = n_accepted;
    }
}

void NgramMapDrafter::on_outcome(const DraftOutcome & outcome) {
    if (outcome.proposal == nullptr && !outcome.replay) {
        map.last_draft_created = false;  // not asked this step: no draft of its to judge
    }
    if (outcome.last) {
        map.accept(outcome.n_accepted);
    }
}
