// The MTP drafter: feeds the target's nextn hidden states to the MTP head (catch-up) and drafts
// tokens autoregressively on an LLAMA_CONTEXT_TYPE_MTP context. Same algorithm as llama.cpp's
// common_speculative_impl_draft_mtp (single sequence, single head).
#pragma once

#include <cstdint>
#include <vector>

#include "hidden_probe.h"
#include "llama.h"
#include "nextn_api.h"

enum StopReason : int8_t {
    STOP_N_MAX = 0,    // the draft reached n_max
    STOP_P_MIN = 1,    // the next draft token's confidence fell below p_min
    STOP_EOS = 2,      // the draft reached an end-of-generation token
    STOP_BUDGET = 3,   // the token budget left no room for more
    STOP_CONTEXT = 4,  // the context window left no room for more
    STOP_EXHAUSTED = 5,  // the drafter had no (more) tokens to propose (n-gram: no match, or its continuation ended)
};

// llama.cpp's MTP draft sampler keeps the 10 most likely tokens and renormalises over them;
// the draft confidence compared with p_min is that renormalised probability.
constexpr int DRAFT_N_CANDIDATES = 10;

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

    // requests (kept by clear()): record top-k even with telemetry off, and the oracle's extras
    bool want_topk = false;
    bool want_oracle = false;

    void clear();
};

struct MtpDrafter {
    MtpDrafter(const NextnApi & api, llama_context * ctx_tgt, llama_context * ctx_mtp, HiddenProbe & probe);
    ~MtpDrafter();
    MtpDrafter(const MtpDrafter &) = delete;
    MtpDrafter & operator=(const MtpDrafter &) = delete;

    // Forget everything: MTP memory cleared, pending hidden state zeroed.
    void reset();

    // After a target decode of n rows (toks[i] at pos0 + i): keep their h_nextn rows and queue the
    // catch-up rows (token i paired with the target hidden state of the position before it).
    void observe_target(const llama_token * toks, int32_t n, llama_pos pos0);

    // Decode the queued catch-up rows on the MTP context. Returns llama_process's code.
    int32_t catch_up();
    bool has_queue() const { return !queue_tok.empty(); }

    // Draft up to n_cap tokens after id_last (at pos0). Throws on a decode failure.
    void draft(llama_token id_last, llama_pos pos0, int32_t n_cap, StopReason cap_reason, float p_min,
               int32_t n_min, int32_t topk, bool telemetry, Draft & out);

    // n_accepted drafts were accepted; MTP memory keeps positions < keep_until.
    void accept(int32_t n_accepted, llama_pos keep_until);

    // Oracle cost probe, leaving the drafter untouched: copy the target's first n h_nextn rows into
    // rows (what observe_target does), and decode n catch-up rows (toks[i] at pos0 + i, with
    // pending_h then rows[0..n-2]) on the MTP context, then drop them from its memory.
    void copy_target_rows(int32_t n, std::vector<float> & rows) const;
    int32_t probe_catch_up(const llama_token * toks, int32_t n, llama_pos pos0, const std::vector<float> & rows);

    // Target h_nextn row i of the last observed decode.
    const float * verify_row(int32_t i) const { return verify_h.data() + (size_t) i * n_embd; }

    int32_t n_embd = 0;

  private:
    const NextnApi & api;
    llama_context * ctx_tgt;
    llama_context * ctx_mtp;
    const llama_vocab * vocab;
    HiddenProbe & probe;
    llama_batch_ext * batch = nullptr;

    std::vector<float> pending_h;         // target h_nextn at the position before id_last
    std::vector<llama_token> queue_tok;   // catch-up rows not yet decoded on the MTP context
    std::vector<llama_pos> queue_pos;
    std::vector<float> queue_h;
    bool caught_up = false;               // the last observed rows were decoded (eagerly)
    std::vector<float> verify_h;
    int32_t verify_rows = 0;
    std::vector<int32_t> order;           // scratch for the candidate sort
};
