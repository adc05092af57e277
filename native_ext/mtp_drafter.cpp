#include "mtp_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "errors.h"
#include "timing.h"

MtpDrafter::MtpDrafter(const NextnApi & api, llama_context * ctx_tgt, llama_context * ctx_mtp, HiddenProbe & probe)
    : Drafter(DRAFTER_MTP), api(api), ctx_tgt(ctx_tgt), ctx_mtp(ctx_mtp), probe(probe) {
    const llama_model * model = llama_get_model(ctx_mtp);
    n_embd = llama_model_n_embd_out(model);
    vocab = llama_model_get_vocab(model);
    batch.reset(llama_batch_ext_init(ctx_mtp));
}

void MtpDrafter::begin(const std::vector<llama_token> & /*prompt*/) {
    llama_memory_clear(llama_get_memory(ctx_mtp), true);
    pending_h.assign(n_embd, 0.0f);
    queue_tok.clear();
    queue_pos.clear();
    queue_h.clear();
    caught_up = false;
    verify_rows = 0;
}

void MtpDrafter::observe_target(const llama_token * toks, int32_t n, llama_pos pos0) {
    const size_t row = (size_t) n_embd;
    copy_target_rows(n, verify_h);
    verify_rows = n;
    for (int32_t i = 0; i < n; ++i) {
        const float * h = i == 0 ? pending_h.data() : verify_row(i - 1);
        queue_tok.push_back(toks[i]);
        queue_pos.push_back(pos0 + i);
        queue_h.insert(queue_h.end(), h, h + row);
    }
    caught_up = false;
}

int32_t MtpDrafter::catch_up() {
    if (queue_tok.empty()) {
        return 0;
    }
    const size_t row = (size_t) n_embd;
    const int32_t n_batch = (int32_t) llama_n_batch(ctx_mtp);
    for (size_t off = 0; off < queue_tok.size(); off += n_batch) {
        const size_t end = std::min(queue_tok.size(), off + (size_t) n_batch);
        llama_batch_ext_clear(batch.get());
        for (size_t i = off; i < end; ++i) {
            const int32_t idx = llama_batch_ext_add_token(batch.get(), 0, queue_tok[i]);
            llama_batch_ext_set_pos(batch.get(), idx, &queue_pos[i]);
            llama_batch_ext_set_embd_token(batch.get(), idx, {queue_h.data() + i * row, 1, row});
        }
        const int32_t rc = llama_process(ctx_mtp, LLAMA_PROCESS_TYPE_DECODE, batch.get());
        if (rc != 0) {
            return rc;
        }
    }
    queue_tok.clear();
    queue_pos.clear();
    queue_h.clear();
    caught_up = true;
    return 0;
}

void MtpDrafter::set_row(llama_token tok, llama_pos pos, const float * h) {
    llama_batch_ext_clear(batch.get());
    const int32_t idx = llama_batch_ext_add_token(batch.get(), 0, tok);
    llama_batch_ext_set_pos(batch.get(), idx, &pos);
    llama_batch_ext_set_embd_token(batch.get(), idx, {h, 1, (size_t) n_embd});
    llama_batch_ext_set_output_logits(batch.get(), idx, true);
}

void MtpDrafter::record_hidden(const DraftRequest & req, const float * h_row, Draft & out) const {
    if (req.telemetry) {
        out.h_norm.push_back(probe.row_norms.empty() ? NAN : probe.row_norms.back());
        out.hidden.insert(out.hidden.end(), h_row, h_row + n_embd);
    }
}

bool MtpDrafter::draft(const DraftRequest & req, Draft & out) {
    if (req.n_cap <= 0) {
        return true;  // a candidate of length 0: the MTP head still follows the generation
    }
    out.clear();
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    const llama_pos pos0 = req.n_past;
    set_row(req.id_last, pos0, pending_h.data());

    const int64_t t_start = req.oracle ? now_ns() : 0;
    if (req.telemetry) {
        probe.start();
    }
    for (int32_t i = 0;; ++i) {
        const int32_t rc = llama_process(ctx_mtp, LLAMA_PROCESS_TYPE_DECODE, batch.get());
        out.n_decodes++;
        if (rc != 0) {
            probe.stop();
            check_decode(rc, "MTP draft decode");
        }
        const float * logits = llama_get_logits_ith(ctx_mtp, 0);
        const float * h_row = api.get_embeddings_nextn_ith(ctx_mtp, 0);
        ranking.rank(logits, n_vocab);
        if (!ranking.take(req, logits, t_start, out)) {
            break;
        }
        record_hidden(req, h_row, out);
        if (CandidateRanking::ended(req, vocab, out)) {
            break;
        }
        set_row(ranking.top(), pos0 + i + 1, h_row);
    }
    probe.stop();

    // the draft rows leave the MTP memory: catch-up re-decodes the verified ones with target states
    llama_memory_seq_rm(llama_get_memory(ctx_mtp), 0, pos0, -1);

    if ((int32_t) out.tokens.size() < req.params.n_min) {
        out.dropped = true;
    }
    return true;
}

double MtpDrafter::expected_accepted(const Draft & d) const { return expected_from_confidences(d); }

void MtpDrafter::commit(int32_t n_accepted, llama_pos keep_until) {
    const int32_t i_h = std::min(n_accepted, verify_rows - 1);
    if (i_h >= 0) {
        std::memcpy(pending_h.data(), verify_row(i_h), (size_t) n_embd * sizeof(float));
    }
    if (caught_up) {
        llama_memory_seq_rm(llama_get_memory(ctx_mtp), 0, keep_until, -1);
        return;
    }
    size_t keep = 0;
    while (keep < queue_pos.size() && queue_pos[keep] < keep_until) {
        ++keep;
    }
    queue_tok.resize(keep);
    queue_pos.resize(keep);
    queue_h.resize(keep * (size_t) n_embd);
}

void MtpDrafter::copy_target_rows(int32_t n, std::vector<float> & rows) const {
    const size_t row = (size_t) n_embd;
    rows.resize(row * n);
    for (int32_t i = 0; i < n; ++i) {
        const float * h = api.get_embeddings_nextn_ith(ctx_tgt, i);
        if (h == nullptr) {
            fail(ErrorKind::DECODE, "llama_get_embeddings_nextn_ith returned no row " + std::to_string(i));
        }
        std::memcpy(rows.data() + i * row, h, row * sizeof(float));
    }
}

int32_t MtpDrafter::probe_catch_up(const llama_token * toks, int32_t n, llama_pos pos0, const std::vector<float> & rows) {
    const size_t row = (size_t) n_embd;
    llama_batch_ext_clear(batch.get());
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch.get(), 0, toks[i]);
        const llama_pos pos = pos0 + i;
        llama_batch_ext_set_pos(batch.get(), idx, &pos);
        const float * h = i == 0 ? pending_h.data() : rows.data() + (size_t) (i - 1) * row;
        llama_batch_ext_set_embd_token(batch.get(), idx, {h, 1, row});
    }
    const int32_t rc = llama_process(ctx_mtp, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    llama_memory_seq_rm(llama_get_memory(ctx_mtp), 0, pos0, -1);
    return rc;
}
