// The MTP drafter: feeds the target's nextn hidden states to the MTP head (catch-up) and drafts
// tokens autoregressively on an LLAMA_CONTEXT_TYPE_MTP context. Same algorithm as llama.cpp's
// common_speculative_impl_draft_mtp (single head). One MtpDrafter follows one sequence; the drafters
// of several sequences share the MTP context and decode together: draft_batch() drafts them depth
// by depth, one decode per depth with a row for each sequence still drafting, and catch_up_batch()
// decodes all their queued rows at once, as llama.cpp's draft-mtp does for a server's slots.
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

struct MtpDrafter;

// One sequence's part in a batched draft: its drafter, what it is asked and where its draft goes.
struct MtpJob {
    MtpDrafter * drafter = nullptr;
    const DraftRequest * req = nullptr;
    Draft * out = nullptr;
};

struct MtpDrafter final : Drafter {
    // ctx_tgt must expose its nextn rows and ctx_mtp take them (llama_set_embeddings_nextn, set by the engine).
    MtpDrafter(const NextnApi & api, llama_context * ctx_tgt, llama_context * ctx_mtp, HiddenProbe & probe);

    // Drafter: begin() forgets everything (its sequence leaves the MTP memory, pending hidden state zeroed);
    // draft() drafts up to req.n_cap tokens after req.id_last (draft_batch with this one sequence);
    // the expected accepted length is the sum over k of the product of the first k confidences;
    // accept() commits the verified rows.
    void begin(const std::vector<llama_token> & prompt) override;
    bool draft(const DraftRequest & req, Draft & out) override;
    double expected_accepted(const Draft & d) const override;
    void accept(const DraftOutcome & outcome) override { commit(outcome.n_accepted, outcome.keep_until); }

    // After a target decode of n rows (toks[i] at pos0 + i): keep their h_nextn rows and queue the
    // catch-up rows (token i paired with the target hidden state of the position before it).
    void observe_target(const llama_token * toks, int32_t n, llama_pos pos0, int32_t row0) override;

    // Drafts for every job in one batch per depth (jobs whose n_cap is 0 take part with an empty draft);
    // rows_per_depth[i] gets the rows of the depth-i decode. Throws on a decode failure.
    static void draft_batch(const std::vector<MtpJob> & jobs, std::vector<int32_t> * rows_per_depth = nullptr);

    // Decode the queued catch-up rows of every drafter on their shared MTP context, in one batch
    // (chunks of n_batch). Returns llama_process's code.
    static int32_t catch_up_batch(const std::vector<MtpDrafter *> & drafters);
    int32_t catch_up();
    bool has_queue() const { return !queue_tok.empty(); }

    // Rows 0 .. n_accepted of the last observed decode stand (the next draft starts from row
    // n_accepted's hidden state); MTP memory keeps positions < keep_until.
    void commit(int32_t n_accepted, llama_pos keep_until);

    // Oracle cost probe, leaving the drafter untouched: copy the target's first n h_nextn rows into
    // rows (what observe_target does), and decode n catch-up rows (toks[i] at pos0 + i, with
    // pending_h then rows[0..n-2]) on the MTP context, then drop them from its memory.
    void copy_target_rows(int32_t n, std::vector<float> & rows, int32_t row0 = 0) const;
    int32_t probe_catch_up(const llama_token * toks, int32_t n, llama_pos pos0, const std::vector<float> & rows);

    // Target h_nextn row i of the last observed decode.
    const float * verify_row(int32_t i) const { return verify_h.data() + (size_t) i * n_embd; }

    int32_t n_embd = 0;

  private:
    // Appends what telemetry records of the drafted token's hidden row (its norm, the row) to out.
    void record_hidden(const DraftRequest & req, const float * h_row, float h_norm, Draft & out) const;
    // draft_batch's work after each decode (the jobs still drafting are in its scratch list).
    static void take_rows(llama_context * ctx, int32_t n_vocab, int64_t t_start, const std::vector<float> & norms);
    // Adds the row (tok at pos of this drafter's sequence, hidden state h) with logits to `into`.
    void add_row(llama_batch_ext * into, llama_token tok, llama_pos pos, const float * h) const;

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
