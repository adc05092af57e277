// The MTP drafter: feeds the target's nextn hidden states to the MTP head (catch-up) and drafts
// tokens autoregressively on an LLAMA_CONTEXT_TYPE_MTP context. Same algorithm as llama.cpp's
// common_speculative_impl_draft_mtp (single head). One MtpDrafter follows one sequence; the drafters
// of several sequences share the MTP context and decode together: draft_together() drafts them depth
// by depth, one decode per depth with a row for each sequence still drafting, and catch_up_together()
// decodes all their queued rows at once, as llama.cpp's draft-mtp does for a server's slots.
//
// It reads the target's nextn rows (features()), which the engine extracts after every target decode and
// hands over in observe_target(); it queues the catch-up rows there, and keep() / accept() settle them once
// the step's outcome is known, whether or not it drafts.
//
// Chained heads (Step-3.5's mtp3, llama.cpp's chain_heads: a model with n_layer_nextn > 1 trained heads): head i
// drafts depth i (llama_set_nextn_layer_offset), so a draft is at most n_heads long, and as in llama.cpp each head
// rebuilds its own layer's memory: the catch-up decodes every batch once per head, and depth i decodes the whole
// draft prefix [id_last, d_1 .. d_i] again under head i (the head's hidden rows chained from one depth to the next).
//
// A shared-memory head (Gemma-4's assistant, llama.cpp's is_mem_shared: a head file whose context reads the target's
// memory through ctx_other) has no memory of its own: no catch-up, and every depth decodes one row at the position
// after the target's last (pos0), with the previous depth's hidden row.
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
    // ctx_mtp must take the target's nextn rows (llama_set_embeddings_nextn on both contexts, set by the engine).
    MtpDrafter(const NextnApi & api, llama_context * ctx_mtp, HiddenProbe & probe);

    // Drafter: begin() forgets everything (its sequence leaves the MTP memory, pending hidden state zeroed);
    // draft() drafts up to req.n_cap tokens after req.id_last (draft_together with this one sequence);
    // the expected accepted length is the sum over k of the product of the first k confidences;
    // accept() keeps the verified rows.
    void begin(const std::vector<llama_token> & prompt) override;
    bool draft(const DraftRequest & req, Draft & out) override;
    double expected_accepted(const Draft & d) const override;
    void accept(const DraftOutcome & outcome) override {
        keep(outcome.row0 + outcome.n_accepted, outcome.keep_until);
    }

    FeatureNeeds features() const override { return FeatureNeeds{/*nextn*/ true}; }

    // After a target decode of n rows (toks[i] at pos0 + i): its nextn rows are the next draft's start, and
    // the catch-up rows are queued (token i paired with the target hidden state of the position before it).
    void observe_target(const TargetRows & rows) override;

    // Rows 0 .. n_rows of the last observed decode stand (the next draft starts from row n_rows's hidden
    // state); MTP memory keeps positions < keep_until.
    void keep(int32_t n_rows, llama_pos keep_until) override;

    bool has_queue() const override { return !queue_tok.empty(); }

    // Decodes the catch-up rows of `rows` (toks[i] at pos0 + i, with pending_h then rows 0 .. n-2) on the MTP
    // context, then drops them from its memory.
    int32_t probe_follow(const TargetRows & rows) override;

    // DrafterEntry::draft_together: every job in one batch per depth (jobs whose n_cap is 0 take part with an
    // empty draft). DrafterEntry::catch_up_together: the queued rows of every drafter in one batch (chunks of
    // n_batch). Both take MtpDrafters only.
    static void draft_together(const std::vector<DraftJob> & jobs, std::vector<int32_t> * rows_per_depth);
    static int32_t catch_up_together(const std::vector<Drafter *> & drafters);

    int32_t n_embd = 0;
    int32_t n_heads = 1;       // the model's MTP heads (llama_model_n_layer_nextn)
    bool chained = false;      // n_heads > 1: head i drafts depth i
    bool shared = false;       // a head that reads the target's memory (its context's ctx_other)

  private:
    // Appends what telemetry records of the drafted token's hidden row (its norm, the row) to out.
    void record_hidden(const DraftRequest & req, const float * h_row, float h_norm, Draft & out) const;
    const float * verify_row(int32_t i) const { return verify_h + (size_t) i * n_embd; }
    // draft_together's work after each decode (the jobs still drafting are in its scratch list).
    static void take_rows(llama_context * ctx, int32_t n_vocab, int64_t t_start, const std::vector<float> & norms);
    // catch_up_together's decode of the queued rows in its scratch list, under the context's current head.
    static int32_t decode_rows(MtpDrafter & first);
    // Adds the row (tok at pos of this drafter's sequence, hidden state h) to `into`, with logits if `out`;
    // returns its index in the batch.
    int32_t add_row(llama_batch_ext * into, llama_token tok, llama_pos pos, const float * h, bool out = true) const;
    // The rows of draft depth `depth` for job j (tok: id_last at depth 0, else the token drafted last; h: its
    // hidden row), the last with logits: one row, or for chained heads the whole prefix.
    void add_depth(llama_batch_ext * into, const DraftJob & j, int32_t depth, llama_token tok, const float * h);
    // Chained heads: the draft prefix [id_last, d_1 .. d_n] with its chained hidden rows (the last with logits).
    void add_prefix(llama_batch_ext * into, const DraftRequest & req, const Draft & out);
    // Chained heads: head `head` decodes next; its memory is rebuilt from `pos` on.
    void select_head(int32_t head, llama_pos pos) const;

    const NextnApi & api;
    llama_context * ctx_mtp;
    const llama_vocab * vocab;
    HiddenProbe & probe;
    llama_batch_ext_ptr batch;

    std::vector<float> pending_h;         // target h_nextn at the position before id_last
    std::vector<llama_token> queue_tok;   // catch-up rows not yet decoded on the MTP context
    std::vector<llama_pos> queue_pos;
    std::vector<float> queue_h;
    std::vector<size_t> queue_batches;   // where each observed decode's rows start in the queue (chained heads
                                         // catch up decode by decode, as llama.cpp's process() is called)
    std::vector<float> chain_h;          // chained heads: the draft prefix's hidden rows (pending_h, h_1 .. h_n)
    int32_t i_last = 0;                  // its row with logits in the current draft decode
    bool caught_up = false;               // the last observed rows were decoded (eagerly)
    const float * verify_h = nullptr;     // the last observed decode's nextn rows (the engine's extraction)
    int32_t verify_rows = 0;
    CandidateRanking ranking;             // the current row's candidates
};
