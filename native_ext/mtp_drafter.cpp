#include "mtp_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "timing.h"

void Draft::clear() {
    tokens.clear();
    prob.clear();
    topk_ids.clear();
    topk_probs.clear();
    h_norm.clear();
    hidden.clear();
    margin.clear();
    t_decode_ns.clear();
    stop = STOP_N_MAX;
    dropped = false;
    n_decodes = 0;
}

MtpDrafter::MtpDrafter(const NextnApi & api, llama_context * ctx_tgt, llama_context * ctx_mtp, HiddenProbe & probe)
    : api(api), ctx_tgt(ctx_tgt), ctx_mtp(ctx_mtp), probe(probe) {
    const llama_model * model = llama_get_model(ctx_mtp);
    n_embd = llama_model_n_embd_out(model);
    vocab = llama_model_get_vocab(model);
    batch = llama_batch_ext_init(ctx_mtp);
    api.set_embeddings_nextn(ctx_tgt, true, /*masked*/ false);
    api.set_embeddings_nextn(ctx_mtp, true, /*masked*/ true);
    reset();
}

MtpDrafter::~MtpDrafter() {
    if (batch) {
        llama_batch_ext_free(batch);
    }
}

void MtpDrafter::reset() {
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
    verify_h.resize(row * n);
    for (int32_t i = 0; i < n; ++i) {
        const float * h = api.get_embeddings_nextn_ith(ctx_tgt, i);
        if (h == nullptr) {
            throw std::runtime_error("llama_get_embeddings_nextn_ith returned no row " + std::to_string(i));
        }
        std::memcpy(verify_h.data() + i * row, h, row * sizeof(float));
    }
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
        llama_batch_ext_clear(batch);
        for (size_t i = off; i < end; ++i) {
            const int32_t idx = llama_batch_ext_add_token(batch, 0, queue_tok[i]);
            llama_batch_ext_set_pos(batch, idx, &queue_pos[i]);
            llama_batch_ext_set_embd_token(batch, idx, {queue_h.data() + i * row, 1, row});
        }
        const int32_t rc = llama_process(ctx_mtp, LLAMA_PROCESS_TYPE_DECODE, batch);
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

void MtpDrafter::draft(llama_token id_last, llama_pos pos0, int32_t n_cap, StopReason cap_reason, float p_min,
                       int32_t n_min, int32_t topk, bool telemetry, Draft & out) {
    out.clear();
    const size_t row = (size_t) n_embd;
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    const int32_t n_cand = std::min(DRAFT_N_CANDIDATES, n_vocab);

    llama_batch_ext_clear(batch);
    int32_t idx = llama_batch_ext_add_token(batch, 0, id_last);
    llama_batch_ext_set_pos(batch, idx, &pos0);
    llama_batch_ext_set_embd_token(batch, idx, {pending_h.data(), 1, row});
    llama_batch_ext_set_output_logits(batch, idx, true);

    const bool want_topk = telemetry || out.want_topk;
    const int64_t t_start = out.want_oracle ? now_ns() : 0;
    if (telemetry) {
        probe.start();
    }
    for (int32_t i = 0;; ++i) {
        const int32_t rc = llama_process(ctx_mtp, LLAMA_PROCESS_TYPE_DECODE, batch);
        out.n_decodes++;
        if (rc != 0) {
            probe.stop();
            throw std::runtime_error("MTP draft decode failed (llama_process returned " + std::to_string(rc) + ")");
        }
        const float * logits = llama_get_logits_ith(ctx_mtp, 0);
        const float * h_row = api.get_embeddings_nextn_ith(ctx_mtp, 0);

        // the 10 most likely tokens, softmax over them: the quantity llama.cpp compares with p_min
        order.resize(n_vocab);
        for (int32_t t = 0; t < n_vocab; ++t) {
            order[t] = t;
        }
        std::partial_sort(order.begin(), order.begin() + n_cand, order.end(),
                          [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
        float probs[DRAFT_N_CANDIDATES];
        double sum = 0.0;
        const float max_l = logits[order[0]];
        for (int32_t c = 0; c < n_cand; ++c) {
            probs[c] = expf(logits[order[c]] - max_l);
            sum += probs[c];
        }
        for (int32_t c = 0; c < n_cand; ++c) {
            probs[c] = (float) (probs[c] / sum);
        }
        const llama_token id = order[0];

        if (probs[0] < p_min) {
            out.stop = STOP_P_MIN;
            break;
        }
        out.tokens.push_back(id);
        out.prob.push_back(probs[0]);
        if (want_topk) {
            for (int32_t c = 0; c < topk; ++c) {
                out.topk_ids.push_back(c < n_cand ? order[c] : -1);
                out.topk_probs.push_back(c < n_cand ? probs[c] : NAN);
            }
        }
        if (out.want_oracle) {
            out.margin.push_back(n_cand > 1 ? logits[order[0]] - logits[order[1]] : INFINITY);
            out.t_decode_ns.push_back(now_ns() - t_start);
        }
        if (telemetry) {
            out.h_norm.push_back(probe.row_norms.empty() ? NAN : probe.row_norms.back());
            out.hidden.insert(out.hidden.end(), h_row, h_row + row);
        }
        if (llama_vocab_is_eog(vocab, id)) {
            out.stop = STOP_EOS;
            break;
        }
        if ((int32_t) out.tokens.size() >= n_cap) {
            out.stop = cap_reason;
            break;
        }
        llama_batch_ext_clear(batch);
        const llama_pos pos = pos0 + i + 1;
        idx = llama_batch_ext_add_token(batch, 0, id);
        llama_batch_ext_set_pos(batch, idx, &pos);
        llama_batch_ext_set_embd_token(batch, idx, {h_row, 1, row});
        llama_batch_ext_set_output_logits(batch, idx, true);
    }
    probe.stop();

    // the draft rows leave the MTP memory: catch-up re-decodes the verified ones with target states
    llama_memory_seq_rm(llama_get_memory(ctx_mtp), 0, pos0, -1);

    if ((int32_t) out.tokens.size() < n_min) {
        out.dropped = true;
    }
}

void MtpDrafter::accept(int32_t n_accepted, llama_pos keep_until) {
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
            throw std::runtime_error("llama_get_embeddings_nextn_ith returned no row " + std::to_string(i));
        }
        std::memcpy(rows.data() + i * row, h, row * sizeof(float));
    }
}

int32_t MtpDrafter::probe_catch_up(const llama_token * toks, int32_t n, llama_pos pos0, const std::vector<float> & rows) {
    const size_t row = (size_t) n_embd;
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, 0, toks[i]);
        const llama_pos pos = pos0 + i;
        llama_batch_ext_set_pos(batch, idx, &pos);
        const float * h = i == 0 ? pending_h.data() : rows.data() + (size_t) (i - 1) * row;
        llama_batch_ext_set_embd_token(batch, idx, {h, 1, row});
    }
    const int32_t rc = llama_process(ctx_mtp, LLAMA_PROCESS_TYPE_DECODE, batch);
    llama_memory_seq_rm(llama_get_memory(ctx_mtp), 0, pos0, -1);
    return rc;
}
