#include "eagle3_drafter.h"

#include <algorithm>
#include <cstring>

#include "errors.h"
#include "timing.h"

// ---- the drafter ----------------------------------------------------------------------------------

Eagle3Drafter::Eagle3Drafter(DrafterId id, const NextnApi & api, llama_context * ctx_dft, DraftHead head_)
    : HeadDrafter(id, api, ctx_dft, std::move(head_), "draft-eagle3") {
    n_embd_dec = llama_model_n_embd(llama_get_model(ctx_dft));
    batch_enc.reset(llama_batch_ext_init(ctx_dft));
    pending_g.assign(n_embd_dec, 0.0f);
}

void Eagle3Drafter::begin(const std::vector<llama_token> & /*prompt*/) {
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, -1, -1);
    std::fill(pending_g.begin(), pending_g.end(), 0.0f);
    pending_pos = -1;
    verify_rows = 0;
    verify_pos0 = -1;
}

void Eagle3Drafter::gather(const TargetRows & rows) {
    n_embd_tgt = rows.n_embd_layer;
    n_embd_enc = (int32_t) head.target_layers.size() * n_embd_tgt;
    feats.resize((size_t) rows.n * n_embd_enc);
    for (size_t k = 0; k < head.target_layers.size(); ++k) {
        const int32_t il = head.target_layers[k];
        const int32_t slot = rows.layer_slot(il);
        const bool nextn = il == head.n_layer_tgt;
        if ((nextn && (rows.nextn == nullptr || rows.n_embd != n_embd_tgt)) || (!nextn && slot < 0)) {
            fail(ErrorKind::PARAMETER, "draft-eagle3 was handed no features of target layer " + std::to_string(il));
        }
        for (int32_t i = 0; i < rows.n; ++i) {
            const float * src = nextn ? rows.nextn_row(i) : rows.layer_inp_row(i) + (size_t) slot * n_embd_tgt;
            std::memcpy(feats.data() + (size_t) i * n_embd_enc + k * (size_t) n_embd_tgt, src,
                        (size_t) n_embd_tgt * sizeof(float));
        }
    }
}

void Eagle3Drafter::add_row(llama_token tok, llama_pos pos, const float * g, bool out) {
    const int32_t idx = llama_batch_ext_add_token(batch.get(), seq_id, tok);
    llama_batch_ext_set_pos(batch.get(), idx, &pos);
    llama_batch_ext_set_embd_token(batch.get(), idx, {g, 1, (size_t) n_embd_dec});
    llama_batch_ext_set_output_logits(batch.get(), idx, out);
}

void Eagle3Drafter::observe_target(const TargetRows & rows) {
    if (rows.n <= 0) {
        return;
    }
    gather(rows);
    // the encoder: g = fc(features) per row, in chunks of n_ubatch (it has no memory: placeholder positions)
    verify_g.resize((size_t) rows.n * n_embd_dec);
    const int32_t n_ubatch = (int32_t) llama_n_ubatch(ctx_dft);
    for (int32_t i0 = 0; i0 < rows.n; i0 += n_ubatch) {
        const int32_t n = std::min(n_ubatch, rows.n - i0);
        llama_batch_ext_clear(batch_enc.get());
        llama_pos pos = llama_memory_seq_pos_max(llama_get_memory(ctx_dft), 0) + 1;
        for (int32_t j = 0; j < n; ++j, ++pos) {
            const int32_t idx = llama_batch_ext_add_embd(
                batch_enc.get(), 0, {feats.data() + (size_t) (i0 + j) * n_embd_enc, 1, (size_t) n_embd_enc});
            llama_batch_ext_set_pos(batch_enc.get(), idx, &pos);
            llama_batch_ext_set_output_logits(batch_enc.get(), idx, true);
        }
        check_decode(llama_process(ctx_dft, LLAMA_PROCESS_TYPE_ENCODE, batch_enc.get()), "EAGLE-3 encoder");
        const float * g = api.get_embeddings_nextn(ctx_dft);
        if (g == nullptr) {
            fail(ErrorKind::DECODE, "the EAGLE-3 encoder gave no rows");
        }
        std::memcpy(verify_g.data() + (size_t) i0 * n_embd_dec, g, (size_t) n * n_embd_dec * sizeof(float));
    }
    // the decoder's memory: the deferred row before these (bridge), then (token i+1, g_i) at pos0 + i. The bridge
    // writes only after a step this drafter did not draft in (a draft seeds that row). llama.cpp 0.3.36 decodes it
    // with g of these rows' LAST row, not the deferred g: its batch holds a view of pending_g_last, which process()
    // overwrites with the new deferred g before the decode. Done here alike, for parity (a replay cannot see it:
    // Eagle3Replay.state_note).
    llama_batch_ext_clear(batch.get());
    int32_t n_rows = 0;
    if (pending_pos >= 0 && pending_pos + 1 == rows.pos0 &&
        pending_pos > llama_memory_seq_pos_max(llama_get_memory(ctx_dft), seq_id)) {
        add_row(rows.toks[0], pending_pos, verify_g.data() + (size_t) (rows.n - 1) * n_embd_dec, false);
        ++n_rows;
    }
    for (int32_t i = 0; i + 1 < rows.n; ++i, ++n_rows) {
        add_row(rows.toks[i + 1], rows.pos0 + i, verify_g.data() + (size_t) i * n_embd_dec, false);
    }
    verify_pos0 = rows.pos0;
    verify_rows = rows.n;
    pending_pos = rows.pos0 + rows.n - 1;
    std::memcpy(pending_g.data(), verify_g.data() + (size_t) (rows.n - 1) * n_embd_dec, n_embd_dec * sizeof(float));
    if (n_rows > 0) {
        check_decode(llama_process(ctx_dft, LLAMA_PROCESS_TYPE_DECODE, batch.get()), "EAGLE-3 decoder");
    }
}

void Eagle3Drafter::keep(int32_t n_rows, llama_pos keep_until) {
    if (verify_rows > 0) {
        const int32_t i_g = std::min(n_rows, verify_rows - 1);
        pending_pos = verify_pos0 + i_g;
        std::memcpy(pending_g.data(), verify_g.data() + (size_t) i_g * n_embd_dec, n_embd_dec * sizeof(float));
    }
    // the head's memory keeps what the target keeps, as llama-speculative-simple drops it: the row at pending_pos,
    // written with the token drafted after it (rejected when n_rows < the rows verified), stays until this drafter's
    // next draft seeds it again; a step it is not asked in (a chain's look-up drafted) leaves it, as llama.cpp does
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, keep_until, -1);
}

bool Eagle3Drafter::draft(const DraftRequest & req, Draft & out) {
    if (req.n_cap <= 0 || pending_pos < 0) {
        return true;
    }
    out.clear(req.cap_reason);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    const int64_t t_start = req.oracle ? now_ns() : 0;
    llama_memory_t mem = llama_get_memory(ctx_dft);
    llama_memory_seq_rm(mem, seq_id, pending_pos, -1);
    llama_batch_ext_clear(batch.get());
    add_row(req.id_last, pending_pos, pending_g.data(), true);
    for (int32_t i = 0;; ++i) {
        const int32_t rc = llama_process(ctx_dft, LLAMA_PROCESS_TYPE_DECODE, batch.get());
        out.n_decodes++;
        if (rc != 0) {
            llama_memory_seq_rm(mem, seq_id, pending_pos, -1);
            check_decode(rc, "EAGLE-3 draft decode");
        }
        const float * logits = llama_get_logits_ith(ctx_dft, 0);
        ranking.rank(logits, n_vocab);
        if (!ranking.take(req, logits, t_start, out) || CandidateRanking::ended(req, vocab, out)) {
            break;
        }
        const float * h = api.get_embeddings_nextn_ith(ctx_dft, 0);
        if (h == nullptr) {
            fail(ErrorKind::DECODE, "the EAGLE-3 decoder gave no pre-norm row");
        }
        prenorm.assign(h, h + n_embd_dec);
        llama_batch_ext_clear(batch.get());
        add_row(ranking.top(), pending_pos + i + 1, prenorm.data(), true);
    }
    // the drafted rows leave the head's memory, the seed (id_last, pending_g) stays: the verify batch continues it
    llama_memory_seq_rm(mem, seq_id, pending_pos + 1, -1);
    if ((int32_t) out.tokens.size() < req.params.n_min) {
        out.dropped = true;
    }
    return true;
}
