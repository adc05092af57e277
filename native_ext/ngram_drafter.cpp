#include "ngram_drafter.h"

#include <algorithm>

#include "errors.h"

NgramConfig NgramConfig::from(const DrafterOptions & options) {
    const NgramConfig defaults;
    const NgramConfig c{option_or(options, "ngram_simple_size_n", defaults.size_n),
                        option_or(options, "ngram_simple_size_m", defaults.size_m)};
    if (c.size_n < 1 || c.size_m < 1) {
        fail(ErrorKind::PARAMETER, "the n-gram sizes must be at least 1");
    }
    return c;
}

std::vector<llama_token> ngram_simple_draft(const NgramConfig & cfg, const llama_token * tokens, size_t cur_len,
                                            llama_token sampled) {
    // line by line the algorithm of llama.cpp 0.3.36 common/ngram-map.cpp: common_ngram_simple_draft
    const size_t n_draft_min = (size_t) cfg.size_n;  // size of the n-gram looked up in the history
    const size_t n_draft_max = (size_t) cfg.size_m;  // the m-gram following the match is the draft
    std::vector<llama_token> draft_tokens;
    if (cur_len <= n_draft_min + n_draft_max + 1) {
        return draft_tokens;
    }
    std::vector<llama_token> pattern;
    pattern.reserve(n_draft_min);
    for (size_t j = cur_len - n_draft_min + 1; j < cur_len; ++j) {
        pattern.push_back(tokens[j]);
    }
    pattern.push_back(sampled);

    size_t match_pos = 0;  // position 0 is ignored: 0 == no match
    for (size_t j = cur_len - n_draft_min - 1; j > 0; --j) {
        bool match = true;
        for (size_t k = 0; k < pattern.size(); ++k) {
            if (tokens[j + k] != pattern[k]) {
                match = false;
                break;
            }
        }
        if (match) {
            match_pos = j;
            break;
        }
    }
    if (match_pos == 0) {
        return draft_tokens;
    }
    const size_t copy_max = std::min(n_draft_max, cur_len - (match_pos + n_draft_min));
    if (copy_max < n_draft_min) {
        return draft_tokens;
    }
    draft_tokens.reserve(copy_max);
    for (size_t j = 0; j < copy_max; ++j) {
        draft_tokens.push_back(tokens[match_pos + n_draft_min + j]);
    }
    return draft_tokens;
}

void fill_lookup_draft(const std::vector<llama_token> & found, const DraftRequest & req, const LookupVocab & vocab,
                       Draft & out) {
    out.stop = STOP_EXHAUSTED;
    for (const llama_token t : found) {
        out.tokens.push_back(t);
        if (vocab.is_eog(t)) {
            out.stop = STOP_EOS;
            break;
        }
        if ((int32_t) out.tokens.size() >= req.n_cap) {
            out.stop = req.cap_reason;
            break;
        }
    }
    if ((int32_t) out.tokens.size() < req.params.n_min) {
        out.dropped = true;
    }
}

void RunningAcceptance::clear() {
    tested.clear();
    accepted.clear();
}

double RunningAcceptance::expected(int32_t n) const {
    double e = 0.0, p_reach = 1.0;
    for (int32_t j = 0; j < n; ++j) {
        const double t = j < (int32_t) tested.size() ? (double) tested[j] : 0.0;
        const double a = j < (int32_t) accepted.size() ? (double) accepted[j] : 0.0;
        p_reach *= (a + 1.0) / (t + 2.0);
        e += p_reach;
    }
    return e;
}

void RunningAcceptance::observe(const DraftOutcome & outcome, const LookupVocab & vocab) {
    if (outcome.proposal == nullptr) {
        return;
    }
    const std::vector<llama_token> & proposal = outcome.proposal->tokens;
    const int32_t n = std::min((int32_t) proposal.size(), outcome.n_emitted);
    if ((int32_t) tested.size() < n) {
        tested.resize(n, 0);
        accepted.resize(n, 0);
    }
    for (int32_t j = 0; j < n; ++j) {
        ++tested[j];
        if (proposal[j] != outcome.emitted[j] || vocab.is_eog(outcome.emitted[j])) {
            break;
        }
        ++accepted[j];
    }
}

void LookupDrafter::begin(const std::vector<llama_token> & prompt) {
    acceptance.clear();
    on_begin(prompt);
}

bool LookupDrafter::draft(const DraftRequest & req, Draft & out) {
    if (req.n_cap <= 0) {
        return false;
    }
    out.clear();
    fill_lookup_draft(lookup(req), req, vocab, out);
    return true;
}

double LookupDrafter::expected_accepted(const Draft & d) const { return acceptance.expected((int32_t) d.tokens.size()); }

void LookupDrafter::accept(const DraftOutcome & outcome) {
    acceptance.observe(outcome, vocab);
    on_outcome(outcome);
}
