// The DFlash drafter: llama.cpp's `draft-dflash` (common_speculative_impl_draft_dflash in common/speculative.cpp,
// driven as llama-speculative-simple drives it). A block drafter of its own (a `dflash` GGUF, Session.open(
// draft_model=...), llama.cpp's -md) reads the inputs of given target layers: after every target decode their rows
// are injected into its memory at the target's positions (one fused decode runs its fc and writes K/V into every
// layer). To draft it decodes the block [id_last, <mask> x n] at the next positions in ONE pass (attention inside
// the block non-causal unless the head says causal) and reads the greedy token of each mask slot, stopping where the
// top-10-renormalised confidence falls below p_min; n is n_max clamped to block_size - 1, as llama.cpp clamps it,
// and the draft is then cut to the step's cap. The block leaves its memory before the verify batch is injected.
// Every slot of a non-causal block sees the others, so n changes the drafts: llama.cpp fixes n when the drafter is
// made (the configured --spec-draft-n-max) and cuts each draft to the step's n_max after the decode (a server
// request's n_max, the budget); here n is the n_max of the generation's first draft, and a later set_params(n_max)
// cuts drafts alike. The same class runs llama.cpp's `draft-dspark` (a DSpark head: DFlash with a Markov head in its
// graph): anchor-first, its block is [id_last, <mask> x (n - 1)] and slot 0 drafts too (n up to block_size), and
// p_min is compared with its confidence head's value (p_min > 0 without one is refused, as llama.cpp refuses it).
#pragma once

#include <cstdint>
#include <vector>

#include "draft_head.h"
#include "drafter.h"
#include "llama.h"

struct DFlashDrafter final : HeadDrafter {
    // ctx_dft: the head's context (ctx_other = the target's, nextn output on, attention causal as the head says).
    DFlashDrafter(DrafterId id, const NextnApi & api, llama_context * ctx_dft, DraftHead head);

    // begin() forgets the sequence; draft() decodes one block and reads up to req.n_cap tokens from it (throws on a
    // decode failure); keep() (accept()) drops the head's memory past what the target keeps
    // (llama-speculative-simple's seq_rm(ctx_dft, n_past)).
    void begin(const std::vector<llama_token> & prompt) override;
    bool draft(const DraftRequest & req, Draft & out) override;

    // Injects the rows' target features at their positions (llama.cpp's process()).
    void observe_target(const TargetRows & rows) override;
    void keep(int32_t n_rows, llama_pos keep_until) override;

  private:
    // After rank() of block slot `slot`: its top token joins the draft unless its confidence is below p_min (the
    // top-10 probability; a DSpark head's confidence head where it has one).
    bool take(const DraftRequest & req, int32_t slot, const float * logits, int64_t t_start, Draft & out);

    int32_t n_embd_dft = 0;
    std::vector<float> feats;  // one chunk's features, [n][target_layers * n_embd]
    int32_t n_block = 0;       // mask slots of this generation's blocks (0: not drafted yet)
};
