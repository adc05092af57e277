// Engine::step, in named phases, for every active sequence at once: cap (how far each may draft),
// propose (each chain's drafters draft; the MTP heads of all sequences together, one decode per
// depth), choose (each chain policy picks the draft to verify), verify (one target batch with every
// sequence's rows), accept / rollback (the longest prefix the target agrees with, per sequence; every
// drafter told) and record (a telemetry row per sequence).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine.h"
#include "errors.h"
#include "timing.h"

namespace {

float cosine(const float * a, const float * b, int32_t n) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        ab += (double) a[i] * b[i];
        aa += (double) a[i] * a[i];
        bb += (double) b[i] * b[i];
    }
    return (aa > 0.0 && bb > 0.0) ? (float) (ab / std::sqrt(aa * bb)) : NAN;
}

}  // namespace

bool Engine::step() {
    std::lock_guard<std::mutex> lk(run_mutex);
    ClockScope clock(opts.cpu_clock);
    check_open();
    if (cancel_requested.exchange(false)) {
        for (auto & q : reqs) {
            if (q->finish == FINISH_NONE) {
                q->finish = FINISH_CANCELLED;
                q->finished_step = batch_index;
                release(*q);
            }
        }
        return false;
    }
    admit(batch_index);
    active.clear();
    for (Sequence * q : slots) {
        if (q != nullptr) {
            active.push_back(q);
        }
    }
    if (active.empty()) {  // idle until the next request arrives
        const int32_t next = next_arrival();
        batch_index = std::max(batch_index + 1, next);
        return next >= 0;
    }
    BatchStep & b = batch_scratch;
    b.reset(batch_index);
    b.n_active = (int32_t) active.size();
    for (Sequence * q : active) {
        cap(*q);
    }
    propose(active, b);
    for (Sequence * q : active) {
        choose(*q);
    }
    b.t_draft_ns = now_ns() - b.t_draft0;
    verify(active, b);
    const int64_t t = now_ns();
    for (Sequence * q : active) {
        accept_or_rollback(*q);
    }
    b.t_sample_ns = now_ns() - t;
    for (Sequence * q : active) {
        q->totals.add(q->s, b);
        if (opts.telemetry != TelemetryLevel::OFF) {
            record(*q, b);
        }
        q->n_past = q->s.keep_until;
        q->id_last = q->s.correction;
        ++q->n_step;
        check_finish(*q, q->s.correction);
        if (q->finish != FINISH_NONE) {
            q->finished_step = batch_index;
            release(*q);
        }
    }
    ++batch_index;
    return std::any_of(reqs.begin(), reqs.end(), [](const auto & q) { return q->finish == FINISH_NONE; });
}

void Engine::run() {
    while (step()) {
        if (interrupted()) {
            cancel();  // the next step finishes every running request as cancelled
        }
    }
}

// cap: the live parameters, and the draft length the budget and the sequence's context leave
void Engine::cap(Sequence & q) const {
    StepState & s = q.s;
    s = StepState{};
    {
        std::lock_guard<std::mutex> lk(params_mutex);
        s.p = q.params;
    }
    s.length = q.schedule.length(s.p.n_max);
    s.n_cap = s.length;
    s.cap_reason = STOP_N_MAX;
    const int32_t cap_budget = q.request.config.max_tokens - (int32_t) q.generated.size() - 1;
    const int32_t cap_ctx = n_ctx_seq() - q.n_past - 2;
    if (cap_budget < s.n_cap) { s.n_cap = cap_budget; s.cap_reason = STOP_BUDGET; }
    if (cap_ctx < s.n_cap) { s.n_cap = cap_ctx; s.cap_reason = STOP_CONTEXT; }
    s.n_cap = std::max(s.n_cap, 0);
    s.drafting = s.p.n_max > 0;
    const bool first_of_slot = q.request.config.server_slot && q.generated.empty();  // sampled before any draft
    if (first_of_slot || q.replay) {  // a replay drafts nothing: its token after the correction is the step's
        s.p.n_max = s.p.n_min = s.n_cap = s.length = 0;
        s.drafting = false;
    }
}

DraftRequest Engine::draft_request(const Sequence & q, bool oracle) const {
    DraftRequest req;
    req.id_last = q.id_last;
    req.n_past = q.n_past;
    req.history = q.tokens_all.data();
    req.n_history = (size_t) q.n_past;
    req.n_cap = q.s.n_cap;
    req.cap_reason = q.s.cap_reason;
    req.params = q.s.p;
    req.topk = opts.topk;
    req.telemetry = full_telemetry();
    req.oracle = oracle;
    return req;
}

// propose: the drafters that queued rows while drafting was off catch up, then each chain drafts in order:
// every drafter under BEST, under FIRST until one has a usable draft (the later ones are not asked). Chain
// place by chain place: the drafters that draft alone are asked sequence by sequence, then those that draft
// together (the MTP heads) for every sequence still asking, in one batch per kind.
void Engine::propose(std::vector<Sequence *> & batch, BatchStep & b) {
    size_t longest = 0;
    for (Sequence * q : batch) {
        for (int32_t i = 0; i < N_DRAFTERS; ++i) {
            q->candidates[i].clear(q->s.cap_reason);
            q->asked[i] = false;
            q->expected[i] = NAN;
        }
        longest = std::max(longest, q->drafters.size());
    }
    int64_t t = now_ns();
    if (catch_up(batch, /*queued_only*/ true)) {
        b.t_catchup_ns += now_ns() - t;
        t = now_ns();
    }
    b.t_draft0 = t;
    std::vector<DraftRequest> & requests = step_requests;
    requests.assign(batch.size(), DraftRequest{});
    for (size_t i = 0; i < batch.size(); ++i) {
        if (batch[i]->s.drafting) {
            requests[i] = draft_request(*batch[i], /*oracle*/ false);
        }
    }
    for (size_t k = 0; k < longest; ++k) {
        uint64_t together = 0;  // the kinds at this chain place that draft together
        for (size_t i = 0; i < batch.size(); ++i) {
            Sequence & q = *batch[i];
            if (!q.s.drafting || q.s.settled || k >= q.drafters.size()) {
                continue;
            }
            Drafter & d = *q.drafters[k];
            if (DRAFTER_TABLE[d.id].draft_together != nullptr) {
                together |= uint64_t(1) << d.id;
            } else {
                ask_drafter(q, d, requests[i]);
            }
        }
        for (int32_t id = 0; id < N_DRAFTERS; ++id) {
            if (together & (uint64_t(1) << id)) {
                draft_together((DrafterId) id, batch, requests, b);
            }
        }
    }
    for (Sequence * q : batch) {
        for (auto & d : q->drafters) {
            if (q->asked[d->id]) {
                q->expected[d->id] = d->expected_accepted(q->candidates[d->id]);
            }
        }
    }
}

namespace {

// a drafter took part: its proposal counts; under FIRST a usable one settles the step
void took_part(Sequence & q, Drafter & d) {
    q.asked[d.id] = true;
    d.stats.on_draft(q.candidates[d.id]);
    if (q.chain.policy == ChainPolicy::FIRST && q.candidates[d.id].usable()) {
        q.s.settled = true;
    }
}

// q's drafter of kind `id` (nullptr: its chain has none)
Drafter * drafter_of(Sequence & q, int32_t id) {
    for (auto & d : q.drafters) {
        if (d->id == id) {
            return d.get();
        }
    }
    return nullptr;
}

}  // namespace

void Engine::ask_drafter(Sequence & q, Drafter & d, const DraftRequest & req) {
    const int64_t t_call = wall_ns();
    const bool took = d.draft(req, q.candidates[d.id]);
    d.stats.t_draft_ns += wall_ns() - t_call;
    if (took) {
        took_part(q, d);
    }
}

void Engine::draft_together(DrafterId id, const std::vector<Sequence *> & batch,
                            const std::vector<DraftRequest> & requests, BatchStep & b) {
    std::vector<DraftJob> & jobs = group_jobs;
    std::vector<Sequence *> & who = group_who;
    jobs.clear();
    who.clear();
    for (size_t i = 0; i < batch.size(); ++i) {
        Sequence & q = *batch[i];
        Drafter * d = q.s.drafting && !q.s.settled ? drafter_of(q, id) : nullptr;
        if (d != nullptr && !q.asked[id]) {
            jobs.push_back(DraftJob{d, &requests[i], &q.candidates[id]});
            who.push_back(&q);
        }
    }
    if (jobs.empty()) {
        return;
    }
    const int64_t t_call = wall_ns();
    DRAFTER_TABLE[id].draft_together(jobs, &b.draft_rows);
    const int64_t dt = wall_ns() - t_call;
    for (size_t k = 0; k < jobs.size(); ++k) {
        jobs[k].drafter->stats.t_draft_ns += dt;
        took_part(*who[k], *jobs[k].drafter);
    }
}

// choose: the chain policy picks the draft to verify; with none usable, the first drafter's
// (empty or dropped) proposal stands for the step, and nothing is verified
void Engine::choose(Sequence & q) {
    switch (q.chain.policy) {
        case ChainPolicy::FIRST:
            choose_first(q);
            break;
        case ChainPolicy::BEST:
            choose_best(q);
            break;
    }
    StepState & s = q.s;
    if (s.chosen == nullptr) {
        s.chosen = &q.candidates[q.chain.ids.front()];
        s.source = DRAFTER_NONE;
    }
    s.n_d = s.chosen->dropped ? 0 : (int32_t) s.chosen->tokens.size();
}

// FIRST: the first usable draft in chain order (propose asked no drafter after it)
void Engine::choose_first(Sequence & q) const {
    for (const auto & d : q.drafters) {
        const DrafterId id = d->id;
        if (q.asked[id] && q.candidates[id].usable()) {
            q.s.source = id;
            q.s.expected = q.expected[id];
            q.s.chosen = &q.candidates[id];
            return;
        }
    }
}

// BEST: the usable draft with the highest expected accepted length, the earlier drafter on a tie
void Engine::choose_best(Sequence & q) const {
    StepState & s = q.s;
    for (const auto & d : q.drafters) {
        const DrafterId id = d->id;
        if (!q.asked[id] || !q.candidates[id].usable()) {
            continue;
        }
        if (s.source == DRAFTER_NONE || q.expected[id] > s.expected) {
            s.source = id;
            s.expected = q.expected[id];
            s.chosen = &q.candidates[id];
        }
    }
}

bool Engine::catch_up(const std::vector<Sequence *> & batch, bool queued_only) {
    std::vector<Drafter *> & queued = seq_drafters;
    queued.clear();
    for (Sequence * q : batch) {
        for (auto & d : q->drafters) {
            if (q->s.drafting && DRAFTER_TABLE[d->id].catch_up_together != nullptr && (!queued_only || d->has_queue())) {
                queued.push_back(d.get());
            }
        }
    }
    if (queued.empty()) {
        return false;
    }
    catch_up_drafters(queued, "catch-up");
    return true;
}

const std::vector<Drafter *> & Engine::drafters_of(Sequence & q) {
    seq_drafters.clear();
    for (auto & d : q.drafters) {
        seq_drafters.push_back(d.get());
    }
    return seq_drafters;
}

void Engine::catch_up_drafters(const std::vector<Drafter *> & drafters, const char * what) {
    for (int32_t id = 0; id < N_DRAFTERS; ++id) {
        if (DRAFTER_TABLE[id].catch_up_together == nullptr) {
            continue;
        }
        std::vector<Drafter *> & group = group_drafters;
        group.clear();
        for (Drafter * d : drafters) {
            if (d->id == id) {
                group.push_back(d);
            }
        }
        if (!group.empty()) {
            check_decode(DRAFTER_TABLE[id].catch_up_together(group), what);
        }
    }
}

// verify: [id_last, d0, ..., d_{n-1}] of every sequence in one target batch; the drafters follow it
// (the MTP heads keep their rows and catch up together, a draft model decodes its rows: catch-up time)
void Engine::verify(std::vector<Sequence *> & batch, BatchStep & b) {
    int64_t t = now_ns();
    llama_batch_ext_clear(batch_tgt.get());
    int32_t rows = 0, out_rows = 0;
    for (Sequence * q : batch) {  // [prompt rows a server slot left for its first step], id_last, drafts
        StepState & s = q->s;
        const int32_t n_pre = q->n_prompt_pending;
        q->verify_tokens.assign(q->tokens_all.begin() + q->n_past, q->tokens_all.begin() + q->n_past + n_pre);
        q->verify_tokens.push_back(q->id_last);
        q->verify_tokens.insert(q->verify_tokens.end(), s.chosen->tokens.begin(), s.chosen->tokens.begin() + s.n_d);
        add_target_rows(q->slot, q->verify_tokens.data(), n_pre, q->n_past, /*logits*/ q->replay);
        add_target_rows(q->slot, q->verify_tokens.data() + n_pre, s.n_d + 1, q->n_past + n_pre, /*logits*/ true);
        s.n_prompt_rows = n_pre;
        s.row0 = rows + n_pre;
        const int32_t n_pre_out = q->replay ? n_pre : 0;
        s.out_row0 = out_rows + n_pre_out;
        rows += n_pre + s.n_d + 1;
        out_rows += n_pre_out + s.n_d + 1;
        if (checkpoints() && s.n_d > 0) {
            save_checkpoint(*q);
        }
    }
    b.verify_rows = rows;
    check_decode(decode_target(), "target decode");
    int64_t t_follow = 0;
    for (Sequence * q : batch) {
        const int32_t n_pre = q->s.n_prompt_rows;
        t_follow += follow_target(*q, q->verify_tokens.data(), n_pre + q->s.n_d + 1, q->n_past, q->s.row0 - n_pre);
        q->verify_tokens.erase(q->verify_tokens.begin(), q->verify_tokens.begin() + n_pre);
        q->n_past += n_pre;
        q->n_prompt_pending = 0;
    }
    b.t_verify_ns = now_ns() - t - t_follow;
    b.t_catchup_ns += t_follow;

    // catch-up: the MTP heads see the verified rows with the target's hidden states
    t = now_ns();
    if (catch_up(batch, /*queued_only*/ false)) {
        b.t_catchup_ns += now_ns() - t;
    }
}

// accept / rollback: the longest prefix the target agrees with; the rejected drafts leave the
// sequence's target memory; the emitted tokens join its history; every drafter hears the outcome
void Engine::accept_or_rollback(Sequence & q) {
    StepState & s = q.s;
    if (q.replay) {
        sample_replayed(q);
    }
    sample_verified(q);
    s.n_rollback = s.n_d - s.n_acc;
    s.keep_until = q.n_past + 1 + s.n_acc;
    if (s.n_rollback > 0 && checkpoints()) {
        restore_checkpoint(q);
    } else if (s.n_rollback > 0 && !llama_memory_seq_rm(llama_get_memory(ctx_tgt.get()), q.slot, s.keep_until, -1)) {
        fail(ErrorKind::ROLLBACK, "rollback of " + std::to_string(s.n_rollback) + " tokens failed (n_rs_seq=" +
                                      std::to_string(rs_slots()) + ")");
    }
    q.generated.insert(q.generated.end(), q.verify_tokens.begin() + 1, q.verify_tokens.begin() + 1 + s.n_acc);
    q.generated.push_back(s.correction);
    q.tokens_all.insert(q.tokens_all.end(), q.generated.end() - (s.n_acc + 1), q.generated.end());
    tell_drafters(q);
    if (s.n_replayed == 0) {  // a checkpoint's replay drafted nothing: the schedule hears only the steps it capped
        q.schedule.observe(s.n_d, s.n_acc, s.p.n_max);
    }
}

// checkpoints: the target's state of the sequence (its recurrent rows; llama.cpp's LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
// checkpoint) and its sampler, before a verify with drafts, as llama-speculative-simple saves them
void Engine::save_checkpoint(Sequence & q) {
    const size_t size = llama_state_seq_get_size_ext(ctx_tgt.get(), q.slot, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    q.checkpoint.resize(size);
    if (llama_state_seq_get_data_ext(ctx_tgt.get(), q.checkpoint.data(), size, q.slot,
                                     LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) != size) {
        fail(ErrorKind::ROLLBACK, "the target's checkpoint could not be saved");
    }
    if (q.smpl) {
        q.smpl_saved.reset(llama_sampler_clone(q.smpl.get()));
    }
}

// a partial acceptance under checkpoints: the target and the sampler back to the checkpoint, id_last's row on
// removed, and the step's id_last, accepted tokens and correction verified again next step (llama.cpp's replay)
void Engine::restore_checkpoint(Sequence & q) {
    StepState & s = q.s;
    const size_t n = llama_state_seq_set_data_ext(ctx_tgt.get(), q.checkpoint.data(), q.checkpoint.size(), q.slot,
                                                  LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    if (n != q.checkpoint.size() || !llama_memory_seq_rm(llama_get_memory(ctx_tgt.get()), q.slot, q.n_past, -1)) {
        fail(ErrorKind::ROLLBACK, "the target's checkpoint could not be restored after a partial acceptance");
    }
    if (q.smpl_saved) {
        q.smpl = std::move(q.smpl_saved);
    }
    s.keep_until = q.n_past;
    q.n_prompt_pending = s.n_acc + 1;
    q.replay = true;
}

// a replay: the target samples the rows verified again, up to the first that differs from what was emitted (a
// batch-shape shift, recorded in replay_agreed); the row after them, id_last's, gives the step's token
void Engine::sample_replayed(Sequence & q) {
    StepState & s = q.s;
    const int32_t n = s.n_prompt_rows;
    const size_t first = (size_t) (q.n_past - n) + 1;  // the token each replayed row should give again
    int32_t agreed = 0;
    while (agreed < n && sample(q, s.row0 - n + agreed) == q.tokens_all[first + (size_t) agreed]) {
        ++agreed;
    }
    s.n_replayed = n;
    s.replay_agreed = agreed;
    q.replay = false;
}

void Engine::sample_verified(Sequence & q) {
    StepState & s = q.s;
    q.target_row.assign((size_t) q.tel.depth + 1, -1);
    int32_t i = 0;
    for (; i <= s.n_d; ++i) {
        const llama_token tok = sample(q, s.row0 + i);
        q.target_row[i] = tok;
        if (i < s.n_d && tok == q.verify_tokens[i + 1] && !llama_vocab_is_eog(vocab, tok)) {
            ++s.n_acc;
            continue;
        }
        s.correction = tok;
        break;
    }
    if (full_telemetry()) {
        for (int32_t j = i + 1; j <= s.n_d; ++j) {  // beyond the first rejection: the target's argmax
            q.target_row[j] = argmax(llama_get_logits_ith(ctx_tgt.get(), s.row0 + j), llama_vocab_n_tokens(vocab));
        }
    }
}

void Engine::tell_drafters(Sequence & q) {
    const StepState & s = q.s;
    // under checkpoints llama.cpp tells the drafters a partial acceptance only at its replay, as the replayed tokens
    // that agreed, all accepted (llama-speculative-simple's `continue` before common_speculative_accept)
    const bool restored = checkpoints() && s.n_rollback > 0;
    DraftOutcome o;
    o.replay = s.n_replayed > 0;
    o.n_drafted = s.n_d;
    o.n_accepted = o.replay ? s.replay_agreed : s.n_acc;
    o.emitted = q.generated.data() + q.generated.size() - (s.n_acc + 1);
    o.n_emitted = s.n_acc + 1;
    o.keep_until = s.keep_until;
    o.row0 = s.n_prompt_rows;
    if (s.source != DRAFTER_NONE) {
        q.last_verified = s.source;
    }
    for (auto & d : q.drafters) {
        o.proposal = q.asked[d->id] ? &q.candidates[d->id] : nullptr;
        o.verified = d->id == s.source;
        if (o.verified) {
            d->stats.on_verified(s.n_d);
        }
        o.last = !restored && d->id == q.last_verified;
        if (o.last) {
            d->stats.on_accept(o.n_accepted);
        }
        const int64_t t = wall_ns();
        d->accept(o);
        d->stats.t_accept_ns += wall_ns() - t;
    }
}

// record: the sequence's telemetry row for the step
void Engine::record(Sequence & q, const BatchStep & b) {
    const StepState & s = q.s;
    Telemetry & tel = q.tel;
    const size_t r = tel.add_row();
    const int32_t D = tel.depth, S = N_DRAFTERS;
    tel.step[r] = q.n_step;
    tel.pos[r] = q.n_past;
    tel.n_max[r] = s.length;  // the step's draft cap: n_max, or the schedule's length
    tel.p_min[r] = s.p.p_min;
    tel.n_min[r] = s.p.n_min;
    tel.stop_reason[r] = (int8_t) s.chosen->stop;
    tel.drafter[r] = s.source;
    tel.expected_accepted[r] = s.source == DRAFTER_NONE ? NAN : (float) s.expected;
    for (int32_t id = 0; id < S; ++id) {
        if (q.asked[id]) {
            tel.candidate_len[r * S + id] = (int32_t) q.candidates[id].tokens.size();
            tel.candidate_expected[r * S + id] = (float) q.expected[id];
        }
    }
    tel.t_catchup_ns[r] = b.t_catchup_ns;
    tel.t_draft_ns[r] = b.t_draft_ns;
    tel.t_verify_ns[r] = b.t_verify_ns;
    tel.t_sample_ns[r] = b.t_sample_ns;
    tel.batch_step[r] = b.index;
    tel.n_active[r] = b.n_active;
    tel.verify_rows[r] = b.verify_rows;
    for (size_t j = 0; j < b.draft_rows.size() && (int32_t) j < D; ++j) {
        tel.draft_rows[r * D + j] = b.draft_rows[j];
    }
    tel.n_drafted[r] = s.n_d;
    tel.n_accepted[r] = s.n_acc;
    tel.correction[r] = s.correction;
    tel.rollback[r] = s.n_rollback;
    tel.rs_slot[r] = (recurrent && !checkpoints() && s.n_rollback > 0) ? s.n_rollback : -1;
    tel.replayed[r] = s.n_replayed;
    tel.replay_agreed[r] = s.replay_agreed;
    std::copy(q.target_row.begin(), q.target_row.begin() + s.n_d + 1, tel.target_tokens.begin() + r * (D + 1));
    record_draft(q, r);
    if (full_telemetry()) {
        const size_t row0 = (size_t) s.out_row0;
        for (size_t j = 0; j <= (size_t) s.n_d && row0 + j < probe_tgt.row_norms.size(); ++j) {
            tel.h_norm_target[r * (D + 1) + j] = probe_tgt.row_norms[row0 + j];
        }
    }
}

// the verified draft's tokens and, from a drafter with a confidence (the MTP head, a draft model), its
// confidences and top-k; from the MTP head also its hidden-state columns
void Engine::record_draft(Sequence & q, size_t r) {
    const StepState & s = q.s;
    Telemetry & tel = q.tel;
    const int32_t D = tel.depth, K = tel.topk;
    const Draft & d = *s.chosen;
    const bool has_prob = s.source != DRAFTER_NONE && (int32_t) d.prob.size() >= s.n_d;
    for (int32_t j = 0; j < s.n_d; ++j) {
        tel.drafted[r * D + j] = d.tokens[j];
        tel.draft_prob[r * D + j] = has_prob ? d.prob[j] : NAN;
    }
    if (!full_telemetry() || !has_prob || d.topk_ids.size() < (size_t) s.n_d * K) {
        return;
    }
    for (int32_t j = 0; j < s.n_d; ++j) {
        for (int32_t k = 0; k < K; ++k) {
            tel.topk_ids[(r * D + j) * K + k] = d.topk_ids[j * K + k];
            tel.topk_probs[(r * D + j) * K + k] = d.topk_probs[j * K + k];
        }
    }
    // a draft with hidden rows (the MTP head's) beside the target's rows of the same width, read from the
    // sequence's one extraction of the verify batch
    const int32_t n_embd = n_feature_embd();
    if (d.h_norm.size() < (size_t) s.n_d || d.hidden.size() < (size_t) s.n_d * n_embd ||
        q.features.size() < (size_t) (s.n_d + 1) * n_embd) {
        return;
    }
    for (int32_t j = 0; j < s.n_d; ++j) {
        tel.h_norm_draft[r * D + j] = d.h_norm[j];
        tel.draft_target_cos[r * D + j] = cosine(d.hidden.data() + (size_t) j * n_embd,
                                                 q.features.data() + (size_t) j * n_embd, n_embd);
    }
}

void Engine::check_finish(Sequence & q, llama_token last) {
    if (llama_vocab_is_eog(vocab, last)) {
        q.finish = FINISH_EOS;
    } else if ((int32_t) q.generated.size() >= q.request.config.max_tokens) {
        q.finish = FINISH_BUDGET;
    } else if (q.n_past > n_ctx_seq() - 1) {
        q.finish = FINISH_CONTEXT;
    }
}

llama_token Engine::sample(Sequence & q, int32_t row) {
    if (q.smpl) {
        return llama_sampler_sample(q.smpl.get(), ctx_tgt.get(), row);
    }
    return argmax(llama_get_logits_ith(ctx_tgt.get(), row), llama_vocab_n_tokens(vocab));
}

int64_t Engine::follow_target(Sequence & q, const llama_token * tokens, int32_t n, llama_pos pos0, int32_t row0) {
    const TargetRows rows = extract_features(q.needs, tokens, n, pos0, row0, q.features);
    int64_t t_model = 0;
    for (auto & d : q.drafters) {
        if (!needs_draft_file(DRAFTER_TABLE[d->id].needs)) {
            d->observe_target(rows);
            continue;
        }
        const int64_t t = now_ns();
        d->observe_target(rows);
        const int64_t dt = now_ns() - t;
        d->stats.t_accept_ns += dt;
        t_model += dt;
    }
    return t_model;
}

TargetRows Engine::extract_features(const FeatureNeeds & needs, const llama_token * tokens, int32_t n,
                                    llama_pos pos0, int32_t row0, std::vector<float> & into) const {
    TargetRows rows;
    rows.toks = tokens;
    rows.n = n;
    rows.pos0 = pos0;
    rows.row0 = row0;
    rows.n_embd = n_feature_embd();
    rows.n_embd_layer = llama_model_n_embd(model.get());
    rows.n_layer_inp = (int32_t) needs.layer_inp.size();
    const size_t nextn_floats = needs.nextn ? (size_t) rows.n_embd * n : 0;
    const size_t layer_row = (size_t) rows.n_layer_inp * rows.n_embd_layer;
    into.resize(nextn_floats + layer_row * n);
    if (needs.nextn) {
        for (int32_t i = 0; i < n; ++i) {
            const float * h = api.get_embeddings_nextn_ith(ctx_tgt.get(), row0 + i);
            if (h == nullptr) {
                fail(ErrorKind::DECODE, "llama_get_embeddings_nextn_ith returned no row " + std::to_string(row0 + i));
            }
            std::memcpy(into.data() + (size_t) i * rows.n_embd, h, rows.n_embd * sizeof(float));
        }
        rows.nextn = into.data();
    }
    for (int32_t l = 0; l < rows.n_layer_inp; ++l) {
        // every row of the batch, in batch order (llama.cpp extracts layer inputs unmasked)
        const float * all = api.get_embeddings_layer_inp(ctx_tgt.get(), (uint32_t) needs.layer_inp[l]);
        for (int32_t i = 0; i < n; ++i) {
            std::memcpy(into.data() + nextn_floats + i * layer_row + (size_t) l * rows.n_embd_layer,
                        all + (size_t) (row0 + i) * rows.n_embd_layer, rows.n_embd_layer * sizeof(float));
        }
    }
    if (rows.n_layer_inp > 0) {
        rows.layer_inp = into.data() + nextn_floats;
        rows.layer_ids = needs.layer_inp.data();
    }
    return rows;
}

void Engine::add_target_rows(llama_seq_id seq, const llama_token * tokens, int32_t n, llama_pos pos0, bool logits) {
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch_tgt.get(), seq, tokens[i]);
        const llama_pos pos = pos0 + i;
        llama_batch_ext_set_pos(batch_tgt.get(), idx, &pos);
        if (logits) {
            llama_batch_ext_set_output_logits(batch_tgt.get(), idx, true);
        }
    }
}

int32_t Engine::decode_target() {
    if (full_telemetry()) {
        probe_tgt.start();
    }
    const int32_t rc = llama_process(ctx_tgt.get(), LLAMA_PROCESS_TYPE_DECODE, batch_tgt.get());
    probe_tgt.stop();
    return rc;
}

int32_t Engine::decode_tokens(Sequence & q, const llama_token * tokens, int32_t n) {
    llama_batch_ext_clear(batch_tgt.get());
    add_target_rows(q.slot, tokens, n, q.n_past, /*logits*/ true);
    return decode_target();
}
