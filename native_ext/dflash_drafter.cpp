#include "dflash_drafter.h"

#include <algorithm>
#include <cstring>

#include "errors.h"
#include "timing.h"

DFlashDrafter::DFlashDrafter(DrafterId id, const NextnApi & api, llama_context * ctx_dft, DraftHead head_)
    : HeadDrafter(id, api, ctx_dft, std::move(head_), drafter_name(id)) {
    n_embd_dft = llama_model_n_embd(llama_get_model(ctx_dft));
}

void DFlashDrafter::begin(const std::vector<llama_token> & /*prompt*/) {
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, -1, -1);
    n_block = 0;
}

void DFlashDrafter::observe_target(const TargetRows & rows) {
    const int32_t n_ids = (int32_t) head.target_layers.size();
    const int32_t n_embd = rows.n_embd_layer;
    const size_t width = (size_t) n_ids * n_embd;
    std::vector<int32_t> slot(n_ids, -1);  // where each target layer sits in the extracted rows
    for (int32_t k = 0; k < n_ids; ++k) {
        slot[k] = rows.layer_slot(head.target_layers[k]);
        if (slot[k] < 0) {
            fail(ErrorKind::PARAMETER, "draft-dflash was handed no input of target layer " +
                                           std::to_string(head.target_layers[k]));
        }
    }
    const int32_t n_ubatch = (int32_t) llama_n_ubatch(ctx_dft);
    for (int32_t i0 = 0; i0 < rows.n; i0 += n_ubatch) {
        const int32_t n = std::min(n_ubatch, rows.n - i0);
        feats.resize((size_t) n * width);
        llama_batch_ext_clear(batch.get());
        for (int32_t i = 0; i < n; ++i) {
            for (int32_t k = 0; k < n_ids; ++k) {
                std::memcpy(feats.data() + i * width + (size_t) k * n_embd,
                            rows.layer_inp_row(i0 + i) + (size_t) slot[k] * n_embd, (size_t) n_embd * sizeof(float));
            }
            const llama_pos p = rows.pos0 + i0 + i;
            const llama_pos pos[4] = {p, p, p, 0};  // an embedding row on an M-RoPE head takes its 4 positions
            const int32_t idx = llama_batch_ext_add_embd(batch.get(), seq_id, {feats.data() + i * width, 1, width});
            llama_batch_ext_set_pos(batch.get(), idx, pos);
        }
        check_decode(llama_process(ctx_dft, LLAMA_PROCESS_TYPE_DECODE, batch.get()), "DFlash feature injection");
    }
}

bool DFlashDrafter::take(const DraftRequest & req, int32_t slot, const float * logits, int64_t t_start, Draft & out) {
    if (head.kind != DrafterNeeds::DSPARK_HEAD || !head.has_confidence) {
        return ranking.take(req, logits, t_start, out);  // DFlash: the top-10-renormalised probability
    }
    // DSpark: its confidence head's value for the slot (the first of the slot's nextn row) is the confidence
    const float * rows = api.get_embeddings_nextn(ctx_dft);
    if (rows == nullptr) {
        fail(ErrorKind::DECODE, "the DSpark head gave no confidence rows");
    }
    const float conf = rows[(size_t) slot * n_embd_dft];
    if (conf < req.params.p_min) {
        out.stop = STOP_P_MIN;
        return false;
    }
    ranking.record(req, logits, t_start, out);
    out.prob.back() = conf;
    return true;
}

void DFlashDrafter::keep(int32_t /*n_rows*/, llama_pos keep_until) {
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, keep_until, -1);
}

bool DFlashDrafter::draft(const DraftRequest & req, Draft & out) {
    if (req.n_cap <= 0) {
        return true;
    }
    out.clear(req.cap_reason);
    if (n_block == 0) {
        n_block = std::min(req.params.n_max, head.draft_limit());  // llama.cpp's clamp to the trained block
    }
    const int64_t t_start = req.oracle ? now_ns() : 0;
    // DFlash: [id_last, <mask> x n], slots 1..n read; anchor-first DSpark: [id_last, <mask> x (n - 1)], slots 0..n-1
    const int32_t first = head.kind == DrafterNeeds::DSPARK_HEAD && head.anchor ? 0 : 1;
    llama_batch_ext_clear(batch.get());
    for (int32_t i = 0; i < n_block + first; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch.get(), seq_id, i == 0 ? req.id_last : head.mask_token);
        const llama_pos pos = req.n_past + i;
        llama_batch_ext_set_pos(batch.get(), idx, &pos);
        llama_batch_ext_set_output_logits(batch.get(), idx, true);
    }
    const int32_t rc = llama_process(ctx_dft, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    out.n_decodes = 1;
    // the block leaves the head's memory: the verify batch's rows are injected at these positions
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, req.n_past, -1);
    check_decode(rc, "DFlash block decode");
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    out.stop = req.cap_reason;
    for (int32_t i = first; i < n_block + first; ++i) {
        const float * logits = llama_get_logits_ith(ctx_dft, i);
        ranking.rank(logits, n_vocab);
        if (!take(req, i, logits, t_start, out) || CandidateRanking::ended(req, vocab, out)) {
            break;
        }
    }
    if (n_block < req.n_cap && out.stop == req.cap_reason && (int32_t) out.tokens.size() == n_block) {
        out.stop = STOP_N_MAX;  // the block, not the step's cap, ended it
    }
    if ((int32_t) out.tokens.size() < std::min(req.params.n_min, head.draft_limit())) {
        out.dropped = true;
    }
    return true;
}
