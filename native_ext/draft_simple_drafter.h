// The draft-model drafter: llama.cpp's `draft-simple` (common_speculative_impl_draft_simple, driven as
// llama-speculative-simple drives it). A separate, smaller model with the target's vocabulary keeps
// its own context in step with the target: it decodes every batch the target decodes (the prompt,
// each verify batch) and drops what the target drops. To draft, it decodes the last sampled token
// and then its own greedy choices one at a time, stopping when the next token's confidence (the
// top-10 renormalised probability, as llama.cpp's draft sampler gives it) is below p_min.
#pragma once

#include <cstdint>
#include <vector>

#include "draft_ranking.h"
#include "drafter.h"
#include "llama-cpp.h"
#include "llama.h"

struct DraftSimpleDrafter final : Drafter {
    DraftSimpleDrafter(DrafterId id, llama_context * ctx_dft);

    // begin() drops its sequence from the draft context; draft() drafts up to req.n_cap tokens after req.id_last and
    // removes them from the draft context again (throws on a decode failure); the expected accepted
    // length is the sum over k of the product of the first k confidences; accept() drops the
    // positions the target dropped.
    void begin(const std::vector<llama_token> & prompt) override;
    bool draft(const DraftRequest & req, Draft & out) override;
    double expected_accepted(const Draft & d) const override { return expected_from_confidences(d); }
    void accept(const DraftOutcome & outcome) override;

    // Decodes the target's batch on the draft context (logits for its last row only, as llama.cpp's
    // draft-simple process() asks).
    void observe_target(const TargetRows & rows) override;

  private:
    // Puts the single row (tok at pos) with logits into the batch.
    void set_row(llama_token tok, llama_pos pos);

    llama_context * ctx_dft;
    const llama_vocab * vocab;
    llama_batch_ext_ptr batch;
    CandidateRanking ranking;
};
