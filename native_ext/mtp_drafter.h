// The MTP drafter: feeds the target's nextn hidden states to the MTP head (catch-up) and drafts
// tokens autoregressively on an LLAMA_CONTEXT_TYPE_MTP context. Same algorithm as llama.cpp's
// common_speculative_impl_draft_mtp (single sequence, single head).
//
// Besides the Drafter interface it follows the target: the engine calls observe_target() after
// every target decode, catch_up() to decode the queued rows on the MTP context and commit() once
// the step's outcome is known (the Drafter::accept of this drafter), whether or not it drafts.
#pragma once

#include <cstdint>
#include <vector>

#include "draft_ranking.h"
#include "drafter.h"
#include "hidden_probe.h"
#include "llama-cpp.h"
#include "llama.h"
#include "nextn_api.h"

struct MtpDrafter final : Drafter {
    // ctx_tgt must expose its nextn rows and ctx_mtp take them (llama_set_embeddings_nextn, set by the engine).
    MtpDrafter(const NextnApi & api, llama_context * ctx_tgt, llama_context * ctx_mtp, HiddenProbe & probe);

    // Drafter: begin() forgets everything (MTP memory cleared, pending hidden state zeroed);
    // draft() drafts up to req.n_cap tokens after req.id_last (throws on a decode failure);
    // the expected accepted length is the sum over k of the product of the first k confidences;
    // accept() commits the verified rows.
    void begin(const std::vector<llama_token> & prompt) override;
    bool draft(const DraftRequest & req, Draft & out) override;
    double expected_accepted(const Draft & d) const override;
    void accept(const DraftOutcome & outcome) override { commit(outcome.n_accepted, outcome.keep_until); }

    // After a target decode of n rows (toks[i] at pos0 + i): keep their h_nextn rows and queue the
    // catch-up rows (token i paired with the target hidden state of the position before it).
    void observe_target(const llama_token * toks, int32_t n, llama_pos pos0) override;

    // Decode the queued catch-up rows on the MTP context. Returns llama_process's code.
    int32_t catch_up();
    bool has_queue() const { return !queue_tok.empty(); }

    // Rows 0 .. n_accepted of the last observed decode stand (the next draft starts from row
    // n_accepted's hidden state); MTP memory keeps positions < keep_until.
    void commit(int32_t n_accepted, llama_pos keep_until);

    // Oracle cost probe, leaving the drafter untouched: copy the target's first n h_nextn rows into
    // rows (what observe_target does), and decode n catch-up rows (toks[i] at pos0 + i, with
    // pending_h then rows[0..n-2]) on the MTP context, then drop them from its memory.
    void copy_target_rows(int32_t n, std::vector<float> & rows) const;
    int32_t probe_catch_up(const llama_token * toks, int32_t n, llama_pos pos0, const std::vector<float> & rows);

    // Target h_nextn row i of the last observed decode.
    const float * verify_row(int32_t i) const { return verify_h.data() + (size_t) i * n_embd; }

    int32_t n_embd = 0;

  private:
    // Appends what telemetry records of the drafted token's hidden row (its norm, the row) to out.
    void record_hidden(const DraftRequest & req, const float * h_row, Draft & out) const;
    // Puts the single row (tok at pos, hidden state h) with logits into the batch.
    void set_row(llama_token tok, llama_pos pos, const float * h);

    const NextnApi & api;
    llama_context * ctx_tgt;
    llama_context * ctx_mtp;
    const llama_vocab * vocab;
    HiddenProbe & probe;
    llama_batch_ext_ptr batch;

    std::vector<float> pending_h;         // target h_nextn at the position before id_last
    std::vector<llama_token> queue_tok;   // catch-up rows not yet decoded on the MTP context
    std::vector<llama_pos> queue_pos;
    std::vector<float> queue_h;
    bool caught_up = false;               // the last observed rows were decoded (eagerly)
    std::vector<float> verify_h;
    int32_t verify_rows = 0;
    CandidateRanking ranking;             // the current row's candidates
};
