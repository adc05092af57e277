#include "draft_ranking.h"

#include <algorithm>
#include <cmath>

#include "logits_scan.h"
#include "timing.h"

void CandidateRanking::rank(const float * logits, int32_t n_vocab) {
    n_cand = std::min(DRAFT_N_CANDIDATES, n_vocab);
    float top[DRAFT_N_CANDIDATES];
    top_logits(logits, n_vocab, n_cand, order, top);
    double sum = 0.0;
    for (int32_t c = 0; c < n_cand; ++c) {
        probs[c] = expf(top[c] - top[0]);
        sum += probs[c];
    }
    for (int32_t c = 0; c < n_cand; ++c) {
        probs[c] = (float) (probs[c] / sum);
    }
}

void CandidateRanking::record(const DraftRequest & req, const float * logits, int64_t t_start, Draft & out) const {
    out.tokens.push_back(order[0]);
    out.prob.push_back(probs[0]);
    if (req.telemetry || req.oracle) {
        for (int32_t c = 0; c < req.topk; ++c) {
            out.topk_ids.push_back(c < n_cand ? order[c] : -1);
            out.topk_probs.push_back(c < n_cand ? probs[c] : NAN);
        }
    }
    if (req.oracle) {
        out.margin.push_back(n_cand > 1 ? logits[order[0]] - logits[order[1]] : INFINITY);
        out.t_decode_ns.push_back(now_ns() - t_start);
    }
}

bool CandidateRanking::take(const DraftRequest & req, const float * logits, int64_t t_start, Draft & out) const {
    if (confidence() < req.params.p_min) {
        out.stop = STOP_P_MIN;
        return false;
    }
    record(req, logits, t_start, out);
    return true;
}

bool CandidateRanking::ended(const DraftRequest & req, const llama_vocab * vocab, Draft & out) {
    if (llama_vocab_is_eog(vocab, out.tokens.back())) {
        out.stop = STOP_EOS;
        return true;
    }
    if ((int32_t) out.tokens.size() >= req.n_cap) {
        out.stop = req.cap_reason;
        return true;
    }
    return false;
}

double expected_from_confidences(const Draft & d) {
    double expected = 0.0, p_reach = 1.0;
    for (const float p : d.prob) {
        p_reach *= (double) p;
        expected += p_reach;
    }
    return expected;
}
