// What every drafter shares: the drafting parameters, the draft it hands back and why it stopped.
#pragma once

#include <cstdint>
#include <vector>

#include "llama.h"
#include "names.h"

// Live-tunable drafting parameters: Engine::set_params() takes effect at the next step.
struct DraftParams {
    int32_t n_max = 3;     // longest draft (at most the session's capacity n_rs_seq)
    float p_min = 0.0f;    // MTP: stop drafting below this confidence
    int32_t n_min = 0;     // drafts shorter than this are dropped (not verified)
};

// Why a draft ended (the per-step `stop_reason` column indexes STOP_REASON_NAMES).
enum StopReason : int8_t {
    STOP_N_MAX = 0,      // the draft reached n_max
    STOP_P_MIN = 1,      // the next draft token's confidence fell below p_min
    STOP_EOS = 2,        // the draft reached an end-of-generation token
    STOP_BUDGET = 3,     // the token budget left no room for more
    STOP_CONTEXT = 4,    // the context window left no room for more
    STOP_EXHAUSTED = 5,  // the drafter had no (more) tokens to propose (n-gram: no match, or its continuation ended)
};
constexpr const char * STOP_REASON_NAMES[] = {"n_max", "p_min", "eos", "budget", "context", "exhausted"};
static_assert(count_of(STOP_REASON_NAMES) == STOP_EXHAUSTED + 1, "one name per StopReason");

// llama.cpp's MTP draft sampler keeps the 10 most likely tokens and renormalises over them;
// the draft confidence compared with p_min is that renormalised probability.
constexpr int DRAFT_N_CANDIDATES = 10;

// One drafter's proposal for one step. Only `tokens`, `stop` and `dropped` are common to every
// drafter; the rest is filled by the MTP drafter (confidences, top-k, hidden rows, oracle extras).
struct Draft {
    std::vector<llama_token> tokens;
    std::vector<float> prob;             // confidence of each drafted token
    std::vector<llama_token> topk_ids;   // [depth][topk]
    std::vector<float> topk_probs;       // [depth][topk]
    std::vector<float> h_norm;           // pre-norm residual L2 norm of each draft row
    std::vector<float> hidden;           // post-norm h_nextn of each draft row, [depth][n_embd]
    std::vector<float> margin;           // oracle only: top-1 minus top-2 draft logit per depth
    std::vector<int64_t> t_decode_ns;    // oracle only: time from the start of draft() to the end of each decode
    StopReason stop = STOP_N_MAX;
    bool dropped = false;                // shorter than n_min, so not verified
    int64_t n_decodes = 0;

    // Empties the draft; `stop` is what an empty draft reports (the step's cap reason).
    void clear(StopReason empty_stop = STOP_N_MAX) {
        tokens.clear();
        prob.clear();
        topk_ids.clear();
        topk_probs.clear();
        h_norm.clear();
        hidden.clear();
        margin.clear();
        t_decode_ns.clear();
        stop = empty_stop;
        dropped = false;
        n_decodes = 0;
    }

    // Verifiable: neither dropped nor empty.
    bool usable() const { return !dropped && !tokens.empty(); }
};
