#include "mtp_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "errors.h"
#include "timing.h"

MtpDrafter::MtpDrafter(const NextnApi & api, llama_context * ctx_mtp, HiddenProbe & probe)
    : Drafter(DRAFTER_MTP), api(api), ctx_mtp(ctx_mtp), probe(probe) {
    const llama_model * model = llama_get_model(ctx_mtp);
    n_embd = llama_model_n_embd_out(model);
    n_heads = std::max(1, api.model_n_layer_nextn(model));
    shared = api.get_ctx_other(ctx_mtp) != nullptr;
    chained = n_heads > 1 && !shared;
    vocab = llama_model_get_vocab(model);
    batch.reset(llama_batch_ext_init(ctx_mtp));
}

void MtpDrafter::begin(const std::vector<llama_token> & /*prompt*/) {
    if (!shared) {  // a shared-memory head's memory is the target's
        llama_memory_seq_rm(llama_get_memory(ctx_mtp), seq_id, -1, -1);
    }
    pending_h.assign(n_embd, 0.0f);
    queue_tok.clear();
    queue_pos.clear();
    queue_h.clear();
    queue_batches.clear();
    chain_h.clear();
    caught_up = false;
    verify_h = nullptr;
    verify_rows = 0;
}

void MtpDrafter::observe_target(const TargetRows & rows) {
    const size_t row = (size_t) n_embd;
    if (rows.nextn == nullptr || rows.n_embd != n_embd) {
        fail(ErrorKind::PARAMETER, "the MTP drafter was handed no nextn rows of width " + std::to_string(n_embd));
    }
    verify_h = rows.nextn;
    verify_rows = rows.n;
    if (shared) {  // nothing to catch up: the head reads the target's memory
        return;
    }
    queue_batches.push_back(queue_tok.size());
    for (int32_t i = 0; i < rows.n; ++i) {
        const float * h = i == 0 ? pending_h.data() : verify_row(i - 1);
        queue_tok.push_back(rows.toks[i]);
        queue_pos.push_back(rows.pos0 + i);
        queue_h.insert(queue_h.end(), h, h + row);
    }
    caught_up = false;
}

namespace {

// The batched calls' working lists, kept between calls so that a step allocates nothing (a step of a small model
// takes about 100 us, where a few allocations show).
struct BatchScratch {
    std::vector<DraftJob> drafting, all, next;
    std::vector<std::pair<llama_token, const float *>> next_rows;
    std::vector<std::pair<const MtpDrafter *, size_t>> rows;  // catch-up: (drafter, queued row)
    std::vector<DraftJob> one_job{1};
};

MtpDrafter & head(const DraftJob & j) { return static_cast<MtpDrafter &>(*j.drafter); }

float row_norm(const float * h, int32_t n) {
    double acc = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        acc += (double) h[i] * h[i];
    }
    return (float) std::sqrt(acc);
}

thread_local BatchScratch scratch;

}  // namespace

// Decodes scratch.rows (queued rows of the drafters) in chunks of n_batch under the context's current head.
int32_t MtpDrafter::decode_rows(MtpDrafter & first) {
    const auto & rows = scratch.rows;
    const int32_t n_batch = (int32_t) llama_n_batch(first.ctx_mtp);
    for (size_t off = 0; off < rows.size(); off += n_batch) {
        const size_t end = std::min(rows.size(), off + (size_t) n_batch);
        llama_batch_ext_clear(first.batch.get());
        for (size_t k = off; k < end; ++k) {
            const MtpDrafter & d = *rows[k].first;
            const size_t i = rows[k].second;
            d.add_row(first.batch.get(), d.queue_tok[i], d.queue_pos[i], d.queue_h.data() + i * (size_t) d.n_embd,
                      /*out*/ false);
        }
        const int32_t rc = llama_process(first.ctx_mtp, LLAMA_PROCESS_TYPE_DECODE, first.batch.get());
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int32_t MtpDrafter::catch_up_together(const std::vector<Drafter *> & drafters) {
    auto & rows = scratch.rows;
    MtpDrafter & first = static_cast<MtpDrafter &>(*drafters.front());
    if (!first.chained) {  // every queued row at once
        rows.clear();
        for (Drafter * dr : drafters) {
            const MtpDrafter * d = static_cast<const MtpDrafter *>(dr);
            for (size_t i = 0; i < d->queue_tok.size(); ++i) {
                rows.emplace_back(d, i);
            }
        }
        const int32_t rc = rows.empty() ? 0 : decode_rows(first);
        if (rc != 0) {
            return rc;
        }
    } else {  // decode by decode, each under every head in turn from where the decode's rows start
        size_t n_decodes = 0;
        for (Drafter * dr : drafters) {
            n_decodes = std::max(n_decodes, static_cast<const MtpDrafter *>(dr)->queue_batches.size());
        }
        for (size_t b = 0; b < n_decodes; ++b) {
            rows.clear();
            for (Drafter * dr : drafters) {
                const MtpDrafter * d = static_cast<const MtpDrafter *>(dr);
                if (b >= d->queue_batches.size()) {
                    continue;
                }
                const size_t end = b + 1 < d->queue_batches.size() ? d->queue_batches[b + 1] : d->queue_tok.size();
                for (size_t i = d->queue_batches[b]; i < end; ++i) {
                    rows.emplace_back(d, i);
                }
            }
            for (int32_t head = 0; head < first.n_heads && !rows.empty(); ++head) {
                for (Drafter * dr : drafters) {
                    const MtpDrafter * d = static_cast<const MtpDrafter *>(dr);
                    if (b < d->queue_batches.size() && d->queue_batches[b] < d->queue_pos.size()) {
                        d->select_head(head, d->queue_pos[d->queue_batches[b]]);
                    }
                }
                const int32_t rc = decode_rows(first);
                if (rc != 0) {
                    first.select_head(0, -1);
                    return rc;
                }
            }
        }
        first.select_head(0, -1);  // llama.cpp restores the default head for other decodes
    }
    for (Drafter * dr : drafters) {
        MtpDrafter * d = static_cast<MtpDrafter *>(dr);
        if (!d->queue_tok.empty()) {
            d->queue_tok.clear();
            d->queue_pos.clear();
            d->queue_h.clear();
            d->queue_batches.clear();
            d->caught_up = true;
        }
    }
    return 0;
}

int32_t MtpDrafter::add_row(llama_batch_ext * into, llama_token tok, llama_pos pos, const float * h, bool out) const {
    const int32_t idx = llama_batch_ext_add_token(into, seq_id, tok);
    llama_batch_ext_set_pos(into, idx, &pos);
    llama_batch_ext_set_embd_token(into, idx, {h, 1, (size_t) n_embd});
    if (out) {
        llama_batch_ext_set_output_logits(into, idx, true);
    }
    return idx;
}

void MtpDrafter::add_depth(llama_batch_ext * into, const DraftJob & j, int32_t depth, llama_token tok, const float * h) {
    if (chained) {  // the whole prefix again, its hidden rows chained from depth to depth
        if (depth == 0) {
            chain_h.clear();
        }
        chain_h.insert(chain_h.end(), h, h + n_embd);
        add_prefix(into, *j.req, *j.out);
    } else {  // a shared-memory head drafts every depth at the position after the target's last
        i_last = add_row(into, tok, j.req->n_past + (shared ? 0 : depth), h);
    }
}

void MtpDrafter::add_prefix(llama_batch_ext * into, const DraftRequest & req, const Draft & out) {
    const int32_t n = (int32_t) out.tokens.size();
    for (int32_t t = 0; t <= n; ++t) {
        const llama_token tok = t == 0 ? req.id_last : out.tokens[t - 1];
        i_last = add_row(into, tok, req.n_past + t, chain_h.data() + (size_t) t * n_embd, t == n);
    }
}

void MtpDrafter::select_head(int32_t head, llama_pos pos) const {
    if (pos >= 0) {
        llama_memory_seq_rm(llama_get_memory(ctx_mtp), seq_id, pos, -1);
    }
    api.set_nextn_layer_offset(ctx_mtp, head);
}

void MtpDrafter::record_hidden(const DraftRequest & req, const float * h_row, float h_norm, Draft & out) const {
    if (req.telemetry) {
        out.h_norm.push_back(h_norm);
        out.hidden.insert(out.hidden.end(), h_row, h_row + n_embd);
    }
}

bool MtpDrafter::draft(const DraftRequest & req, Draft & out) {
    scratch.one_job[0] = DraftJob{this, &req, &out};
    draft_together(scratch.one_job, nullptr);
    return true;
}

// After a draft decode of one row per job still drafting: each job's top candidate joins its draft (or its draft
// ends); the jobs that go on, and their next rows (token, hidden state), into scratch.next / next_rows.
void MtpDrafter::take_rows(llama_context * ctx, int32_t n_vocab, int64_t t_start, const std::vector<float> & norms) {
    const std::vector<DraftJob> & drafting = scratch.drafting;
    const int32_t n_rows = (int32_t) drafting.size();
    scratch.next.clear();
    scratch.next_rows.clear();
    for (int32_t k = 0; k < n_rows; ++k) {
        const DraftJob & j = drafting[k];
        MtpDrafter & d = head(j);
        j.out->n_decodes++;
        const float * logits = llama_get_logits_ith(ctx, d.i_last);
        const float * h_row = d.api.get_embeddings_nextn_ith(ctx, d.i_last);
        d.ranking.rank(logits, n_vocab);
        if (!d.ranking.take(*j.req, logits, t_start, *j.out)) {
            continue;
        }
        if (d.chained || d.shared) {  // the probe sees a prefix's rows, or another model: the drafted row's norm
            d.record_hidden(*j.req, h_row, j.req->telemetry ? row_norm(h_row, d.n_embd) : NAN, *j.out);
        } else {
            const size_t i_norm = norms.size() + k;  // this decode's rows are the last n_rows norms
            d.record_hidden(*j.req, h_row, i_norm >= (size_t) n_rows ? norms[i_norm - n_rows] : NAN, *j.out);
        }
        if (CandidateRanking::ended(*j.req, d.vocab, *j.out)) {
            continue;
        }
        if (d.chained && (int32_t) j.out->tokens.size() >= d.n_heads) {
            j.out->stop = STOP_N_MAX;  // llama.cpp clamps n_max to the heads
            continue;
        }
        scratch.next.push_back(j);
        scratch.next_rows.emplace_back(d.ranking.top(), h_row);
    }
}

void MtpDrafter::draft_together(const std::vector<DraftJob> & jobs, std::vector<int32_t> * rows_per_depth) {
    std::vector<DraftJob> & drafting = scratch.drafting;  // the jobs still drafting, in batch row order
    drafting.clear();
    bool telemetry = false, oracle = false;
    for (const DraftJob & j : jobs) {
        if (j.req->n_cap > 0) {  // n_cap 0: a candidate of length 0, the MTP head still follows the generation
            j.out->clear(j.req->cap_reason);
            drafting.push_back(j);
            telemetry = telemetry || j.req->telemetry;
            oracle = oracle || j.req->oracle;
        }
    }
    if (drafting.empty()) {
        return;
    }
    MtpDrafter & first = head(drafting.front());
    llama_batch_ext * batch = first.batch.get();
    llama_context * ctx = first.ctx_mtp;
    const int32_t n_vocab = llama_vocab_n_tokens(first.vocab);
    llama_batch_ext_clear(batch);
    for (const DraftJob & j : drafting) {
        head(j).add_depth(batch, j, 0, j.req->id_last, head(j).pending_h.data());
    }
    std::vector<DraftJob> & all = scratch.all;
    all = drafting;
    auto end_drafts = [&]() {  // the draft rows leave the MTP memory: catch-up re-decodes the verified ones
        first.probe.stop();
        if (first.chained) {
            first.select_head(0, -1);  // llama.cpp restores the default head for other decodes
        }
        for (const DraftJob & j : all) {
            if (!head(j).shared) {
                llama_memory_seq_rm(llama_get_memory(ctx), j.drafter->seq_id, j.req->n_past, -1);
            }
        }
    };
    const int64_t t_start = oracle ? now_ns() : 0;
    if (telemetry) {
        first.probe.start();
    }
    for (int32_t i = 0; !drafting.empty(); ++i) {
        const int32_t n_rows = (int32_t) drafting.size();
        if (rows_per_depth != nullptr) {
            rows_per_depth->push_back(n_rows);
        }
        if (first.chained) {  // head i drafts depth i, its memory rebuilt over the draft region
            for (const DraftJob & j : drafting) {
                head(j).select_head(i, j.req->n_past);
            }
        }
        const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
        if (rc != 0) {
            end_drafts();
            check_decode(rc, "MTP draft decode");
        }
        take_rows(ctx, n_vocab, t_start, first.probe.row_norms);
        std::vector<DraftJob> & next = scratch.next;
        llama_batch_ext_clear(batch);
        for (size_t k = 0; k < next.size(); ++k) {
            head(next[k]).add_depth(batch, next[k], i + 1, scratch.next_rows[k].first, scratch.next_rows[k].second);
        }
        std::swap(drafting, next);
    }
    end_drafts();
    for (const DraftJob & j : all) {
        if ((int32_t) j.out->tokens.size() < j.req->params.n_min) {
            j.out->dropped = true;
        }
    }
}

double MtpDrafter::expected_accepted(const Draft & d) const { return expected_from_confidences(d); }

void MtpDrafter::keep(int32_t n_rows, llama_pos keep_until) {
    const int32_t i_h = std::min(n_rows, verify_rows - 1);
    if (i_h >= 0) {
        std::memcpy(pending_h.data(), verify_row(i_h), (size_t) n_embd * sizeof(float));
    }
    if (shared) {
        return;
    }
    if (caught_up) {
        llama_memory_seq_rm(llama_get_memory(ctx_mtp), seq_id, keep_until, -1);
        return;
    }
    size_t keep = 0;
    while (keep < queue_pos.size() && queue_pos[keep] < keep_until) {
        ++keep;
    }
    queue_tok.resize(keep);
    queue_pos.resize(keep);
    queue_h.resize(keep * (size_t) n_embd);
    while (!queue_batches.empty() && queue_batches.back() >= keep) {
        queue_batches.pop_back();
    }
}

int32_t MtpDrafter::probe_follow(const TargetRows & rows) {
    if (shared) {  // no catch-up to price
        return 0;
    }
    const size_t row = (size_t) n_embd;
    llama_batch_ext_clear(batch.get());
    for (int32_t i = 0; i < rows.n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch.get(), seq_id, rows.toks[i]);
        const llama_pos pos = rows.pos0 + i;
        llama_batch_ext_set_pos(batch.get(), idx, &pos);
        const float * h = i == 0 ? pending_h.data() : rows.nextn_row(i - 1);
        llama_batch_ext_set_embd_token(batch.get(), idx, {h, 1, row});
    }
    int32_t rc = 0;
    for (int32_t head = 0; head < n_heads && rc == 0; ++head) {  // chained heads: once under each, as catch-up
        if (chained) {
            select_head(head, rows.pos0);
        }
        rc = llama_process(ctx_mtp, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    }
    if (chained) {
        select_head(0, -1);
    }
    llama_memory_seq_rm(llama_get_memory(ctx_mtp), seq_id, rows.pos0, -1);
    return rc;
}
