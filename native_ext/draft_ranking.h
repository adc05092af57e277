// What every model drafter (the MTP head, a draft model) shares: llama.cpp's draft sampler keeps the
// DRAFT_N_CANDIDATES most likely tokens and renormalises over them; the drafted token is the first,
// its renormalised probability the confidence compared with p_min.
#pragma once

#include <cstdint>

#include "draft.h"
#include "drafter.h"
#include "llama.h"

struct CandidateRanking {
    // Ranks one row of logits: the candidates into order[0 .. n_cand), their probabilities into probs.
    void rank(const float * logits, int32_t n_vocab);

    llama_token top() const { return order[0]; }
    float confidence() const { return probs[0]; }

    // Appends the top candidate to `out` with its confidence and what the request records about it: the
    // top-k alternatives (telemetry or oracle), the logit margin and the time since t_start (oracle).
    void record(const DraftRequest & req, const float * logits, int64_t t_start, Draft & out) const;

    // After rank(): the top candidate joins the draft (record) unless its confidence is below p_min (then
    // false, out.stop = p_min).
    bool take(const DraftRequest & req, const float * logits, int64_t t_start, Draft & out) const;

    // After take(): the draft ends at an end-of-generation token or at the cap (true, out.stop set).
    static bool ended(const DraftRequest & req, const llama_vocab * vocab, Draft & out);

    int32_t order[DRAFT_N_CANDIDATES] = {};  // the candidates' token ids, the most likely first
    float probs[DRAFT_N_CANDIDATES] = {};
    int32_t n_cand = 0;
};

// The expected accepted length of a draft with confidences: the sum over k of the product of the first k.
double expected_from_confidences(const Draft & d);
