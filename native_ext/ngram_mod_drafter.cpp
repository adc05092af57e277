#include "ngram_mod_drafter.h"

#include <algorithm>
#include <mutex>

#include "errors.h"

NgramModConfig NgramModConfig::from(const DrafterOptions & options) {
    const NgramModConfig d;
    const NgramModConfig c{option_or(options, "ngram_mod_n_match", d.n_match), option_or(options, "ngram_mod_n_min", d.n_min),
                           option_or(options, "ngram_mod_n_max", d.n_max)};
    if (c.n_match < 1 || c.n_match > 1024 || c.n_min < 0 || c.n_min > 1024 || c.n_max < 0 || c.n_max > 1024) {
        fail(ErrorKind::PARAMETER, "ngram-mod: n_match must be in [1, 1024], n_min and n_max in [0, 1024]");
    }
    return c;
}

namespace {

// cleared tables ready for the next generation (at most two are kept)
std::mutex pool_mutex;
std::vector<std::vector<int32_t>> pool;

}  // namespace

void NgramModTable::acquire() {
    if (!entries.empty()) {
        return;
    }
    {
        std::lock_guard<std::mutex> lk(pool_mutex);
        if (!pool.empty()) {
            entries = std::move(pool.back());
            pool.pop_back();
        }
    }
    if (entries.size() != SIZE) {
        entries.assign(SIZE, EMPTY);
    }
}

NgramModTable::~NgramModTable() {
    if (entries.empty()) {
        return;
    }
    reset();
    std::lock_guard<std::mutex> lk(pool_mutex);
    if (pool.size() < 2) {
        pool.push_back(std::move(entries));
    }
}

size_t NgramModTable::idx(const llama_token * tokens) const {
    size_t res = 0;
    for (size_t i = 0; i < n; ++i) {
        res = res * 6364136223846793005ULL + (size_t) tokens[i];
    }
    return res % entries.size();
}

void NgramModTable::add(const llama_token * tokens) {
    const size_t i = idx(tokens);
    if (entries[i] == EMPTY) {
        ++used;
        filled.push_back((uint32_t) i);
    }
    entries[i] = tokens[n];
}

int32_t NgramModTable::get(const llama_token * tokens) const { return entries[idx(tokens)]; }

void NgramModTable::reset() {
    if (filled.size() < entries.size() / 16) {
        for (const uint32_t i : filled) {
            entries[i] = EMPTY;
        }
    } else {
        std::fill(entries.begin(), entries.end(), EMPTY);
    }
    filled.clear();
    used = 0;
}

void NgramModDrafter::on_begin(const std::vector<llama_token> & prompt) {
    i_last = 0;
    n_draft_last = 0;
    n_low = 0;
    table.acquire();
    const size_t n = table.n, P = prompt.empty() ? 0 : prompt.size() - 1;  // without the last token
    if (P < n) {
        return;
    }
    for (size_t i = 0; i < P - n; ++i) {
        table.add(prompt.data() + i);
    }
    i_last = P - n;
    if ((double) table.used / (double) table.entries.size() > 0.25) {
        table.reset();
    }
}

std::vector<llama_token> NgramModDrafter::lookup(const DraftRequest & req) {
    const size_t n = table.n, cur_len = req.n_history;
    const llama_token * history = req.history;
    std::vector<llama_token> found;
    n_draft_last = 0;
    if (cur_len < n) {
        return found;
    }
    table.acquire();  // begun: a no-op
    if (i_last + 32 < cur_len) {
        for (size_t i = i_last; i < cur_len - n; ++i) {
            table.add(history + i);
        }
        i_last = cur_len - n;
    }
    window.assign(history + cur_len - n + 1, history + cur_len);
    window.push_back(req.id_last);
    for (int32_t i = 0; i < config.n_max; ++i) {
        const int32_t t = table.get(window.data() + i);
        if (t == NgramModTable::EMPTY) {
            if (i < config.n_min) {
                return found;
            }
            break;
        }
        window.push_back(t);
    }
    found.assign(window.begin() + (std::ptrdiff_t) n, window.end());
    n_draft_last = found.size();
    return found;
}

void NgramModDrafter::on_outcome(const DraftOutcome & outcome) {
    if (outcome.proposal == nullptr && !outcome.replay) {
        n_draft_last = 0;  // not asked this step: no draft of its to judge
    }
    if (!outcome.last || n_draft_last == 0) {
        return;
    }
    if ((double) outcome.n_accepted / (double) n_draft_last < 0.25) {
        if (++n_low >= 5) {
            table.reset();
            n_low = 0;
            i_last = 0;
            ++stats.n_resets;
        }
    } else {
        n_low = 0;
    }
}
