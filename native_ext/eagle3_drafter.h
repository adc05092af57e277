// The EAGLE-3 drafter: llama.cpp's `draft-eagle3` (common_speculative_impl_draft_eagle3 in
// common/speculative.cpp, driven as llama-speculative-simple drives it). A one-layer head of its own
// (an `eagle3` GGUF, Session.open(draft_model=...), llama.cpp's -md) reads the target's hidden states at
// three layers (the head's eagle3.target_layers: inputs of trunk layers, or id n_layer for the target's
// nextn row). After every target decode its encoder turns each row's features into g (fc of the three
// layers side by side) and its decoder writes (token at P+1, g at P) into its own memory at position P;
// the last row waits for the token after it (the deferred boundary: pending_pos, pending_g). To draft it
// decodes (id_last, pending_g) at pending_pos, then each greedy draft token with the decoder's own pre-norm
// output as the next g, stopping when the top-10-renormalised confidence is below p_min.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "draft_head.h"
#include "drafter.h"
#include "llama.h"

struct Eagle3Drafter final : HeadDrafter {
    // ctx_dft: the head's context (made with ctx_other = the target's context and nextn output on, by the engine).
    Eagle3Drafter(DrafterId id, const NextnApi & api, llama_context * ctx_dft, DraftHead head);

    // begin() forgets the sequence; draft() drafts up to req.n_cap tokens after req.id_last and leaves only the
    // seed row in the head's memory (throws on a decode failure); keep() (accept()) re-bases the deferred boundary
    // on the first row not accepted and drops the head's memory past what the target keeps (llama.cpp's accept()
    // and llama-speculative-simple's llama_memory_seq_rm(ctx_dft, n_past)).
    void begin(const std::vector<llama_token> & prompt) override;
    bool draft(const DraftRequest & req, Draft & out) override;

    // Encodes the rows' features and writes the decoder rows (llama.cpp's process()).
    void observe_target(const TargetRows & rows) override;
    void keep(int32_t n_rows, llama_pos keep_until) override;

  private:
    // rows.toks's features in the head's order ([n][3 * n_embd_tgt]) into feats.
    void gather(const TargetRows & rows);
    // Adds (tok at pos, g) to the batch, with logits when `out`.
    void add_row(llama_token tok, llama_pos pos, const float * g, bool out);

    int32_t n_embd_tgt = 0;  // the target's hidden size (one layer's row)
    int32_t n_embd_enc = 0;  // the encoder's input: the target layers side by side
    int32_t n_embd_dec = 0;  // the head's hidden size (g)
    llama_batch_ext_ptr batch_enc;
    std::vector<float> feats;            // the last observed rows' features
    std::vector<float> verify_g;         // the last observed rows' g, [n][n_embd_dec]
    llama_pos verify_pos0 = -1;
    int32_t verify_rows = 0;
    std::vector<float> pending_g;        // g at pending_pos: the row whose next token is not decoded yet
    llama_pos pending_pos = -1;
    std::vector<float> prenorm;          // the drafted row's pre-norm output: the next row's g
};
