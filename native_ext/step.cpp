// Engine::step, in named phases: cap (how far this step may draft), propose (every drafter of
// the chain drafts), choose (the chain policy picks the draft to verify), verify (one target
// batch), accept / rollback (the longest prefix the target agrees with; every drafter told) and
// record (the telemetry row).
#include <algorithm>
#include <cmath>

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

llama_token argmax(const float * logits, int32_t n_vocab) {
    return (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
}

bool Engine::step() {
    std::lock_guard<std::mutex> lk(run_mutex);
    ClockScope clock(opts.cpu_clock);
    check_open();
    if (finish != FINISH_NONE) {
        return false;
    }
    if (cancel_requested.exchange(false)) {
        finish = FINISH_CANCELLED;
        return false;
    }
    StepState s = cap();
    propose(s);
    choose(s);
    verify(s);
    accept_or_rollback(s);
    record(s);
    n_past = s.keep_until;
    id_last = s.correction;
    ++n_step;
    check_finish(s.correction);
    return finish == FINISH_NONE;
}

void Engine::run() {
    while (step()) {
    }
}

// cap: the live parameters, and the draft length the budget and the context window leave
StepState Engine::cap() const {
    StepState s;
    s.p = params();
    s.n_cap = s.p.n_max;
    s.cap_reason = STOP_N_MAX;
    const int32_t cap_budget = cfg.max_tokens - (int32_t) generated.size() - 1;
    const int32_t cap_ctx = n_ctx() - n_past - 2;
    if (cap_budget < s.n_cap) { s.n_cap = cap_budget; s.cap_reason = STOP_BUDGET; }
    if (cap_ctx < s.n_cap) { s.n_cap = cap_ctx; s.cap_reason = STOP_CONTEXT; }
    s.n_cap = std::max(s.n_cap, 0);
    s.drafting_mtp = mtp != nullptr && s.p.n_max > 0;
    return s;
}

DraftRequest Engine::request(const StepState & s, bool oracle) const {
    DraftRequest req;
    req.id_last = id_last;
    req.n_past = n_past;
    req.history = tokens_all.data();
    req.n_history = (size_t) n_past;
    req.n_cap = s.n_cap;
    req.cap_reason = s.cap_reason;
    req.params = s.p;
    req.topk = opts.topk;
    req.telemetry = opts.telemetry;
    req.oracle = oracle;
    return req;
}

// propose: the MTP head catches up (after steps with drafting off), then the drafters draft in chain
// order: every one under BEST, under FIRST until one has a usable draft (the later ones are not asked)
void Engine::propose(StepState & s) {
    for (int32_t i = 0; i < N_DRAFTERS; ++i) {
        candidates[i].clear(s.cap_reason);
        asked[i] = false;
        expected[i] = NAN;
    }
    int64_t t = now_ns();
    if (s.drafting_mtp && mtp->has_queue()) {
        check_decode(mtp->catch_up(), "MTP catch-up");
        s.t_catchup_ns += now_ns() - t;
        t = now_ns();
    }
    s.t_draft0 = t;
    if (s.p.n_max <= 0) {
        return;
    }
    const DraftRequest req = request(s, /*oracle*/ false);
    for (auto & d : drafters) {
        Draft & out = candidates[d->id];
        const int64_t t_call = wall_ns();
        const bool took_part = d->draft(req, out);
        d->stats.t_draft_ns += wall_ns() - t_call;
        if (took_part) {
            asked[d->id] = true;
            d->stats.on_draft(out);
            if (chain.policy == ChainPolicy::FIRST && out.usable()) {
                break;
            }
        }
    }
    for (auto & d : drafters) {
        if (asked[d->id]) {
            expected[d->id] = d->expected_accepted(candidates[d->id]);
        }
    }
}

// choose: the chain policy picks the draft to verify; with none usable, the first drafter's
// (empty or dropped) proposal stands for the step, and nothing is verified
void Engine::choose(StepState & s) {
    switch (chain.policy) {
        case ChainPolicy::FIRST:
            choose_first(s);
            break;
        case ChainPolicy::BEST:
            choose_best(s);
            break;
    }
    if (s.chosen == nullptr) {
        s.chosen = &candidates[chain.ids.front()];
        s.source = DRAFTER_NONE;
    }
    s.n_d = s.chosen->dropped ? 0 : (int32_t) s.chosen->tokens.size();
    s.t_draft_ns = now_ns() - s.t_draft0;
}

// FIRST: the first usable draft in chain order (propose asked no drafter after it)
void Engine::choose_first(StepState & s) const {
    for (const auto & d : drafters) {
        const DrafterId id = d->id;
        if (asked[id] && candidates[id].usable()) {
            s.source = id;
            s.expected = expected[id];
            s.chosen = &candidates[id];
            return;
        }
    }
}

// BEST: the usable draft with the highest expected accepted length, the earlier drafter on a tie
void Engine::choose_best(StepState & s) const {
    for (const auto & d : drafters) {
        const DrafterId id = d->id;
        if (!asked[id] || !candidates[id].usable()) {
            continue;
        }
        if (s.source == DRAFTER_NONE || expected[id] > s.expected) {
            s.source = id;
            s.expected = expected[id];
            s.chosen = &candidates[id];
        }
    }
}

// verify: [id_last, d0, ..., d_{n-1}] in one target batch; the drafters follow it (the MTP head keeps
// its rows, a draft model decodes the batch: catch-up time)
void Engine::verify(StepState & s) {
    int64_t t = now_ns();
    verify_tokens.assign(1, id_last);
    verify_tokens.insert(verify_tokens.end(), s.chosen->tokens.begin(), s.chosen->tokens.begin() + s.n_d);
    check_decode(decode_target(verify_tokens.data(), s.n_d + 1, n_past), "target decode");
    const int64_t t_follow = follow_target(verify_tokens.data(), s.n_d + 1, n_past);
    s.t_verify_ns = now_ns() - t - t_follow;
    s.t_catchup_ns += t_follow;

    // catch-up: the MTP head sees the verified rows with the target's hidden states
    if (s.drafting_mtp) {
        t = now_ns();
        check_decode(mtp->catch_up(), "MTP catch-up");
        s.t_catchup_ns += now_ns() - t;
    }
}

// accept / rollback: the longest prefix the target agrees with; the rejected drafts leave the
// target memory; the emitted tokens join the history; every drafter hears the outcome
void Engine::accept_or_rollback(StepState & s) {
    const int64_t t = now_ns();
    sample_verified(s);
    s.n_rollback = s.n_d - s.n_acc;
    s.keep_until = n_past + 1 + s.n_acc;
    if (s.n_rollback > 0 && !llama_memory_seq_rm(llama_get_memory(ctx_tgt.get()), 0, s.keep_until, -1)) {
        fail(ErrorKind::ROLLBACK, "rollback of " + std::to_string(s.n_rollback) + " tokens failed (n_rs_seq=" +
                                      std::to_string(rs_slots()) + ")");
    }
    generated.insert(generated.end(), verify_tokens.begin() + 1, verify_tokens.begin() + 1 + s.n_acc);
    generated.push_back(s.correction);
    tokens_all.insert(tokens_all.end(), generated.end() - (s.n_acc + 1), generated.end());
    tell_drafters(s);
    s.t_sample_ns = now_ns() - t;
}

void Engine::sample_verified(StepState & s) {
    target_row.assign((size_t) tel.depth + 1, -1);
    int32_t i = 0;
    for (; i <= s.n_d; ++i) {
        const llama_token tok = sample(i);
        target_row[i] = tok;
        if (i < s.n_d && tok == verify_tokens[i + 1] && !llama_vocab_is_eog(vocab, tok)) {
            ++s.n_acc;
            continue;
        }
        s.correction = tok;
        break;
    }
    if (opts.telemetry) {
        for (int32_t j = i + 1; j <= s.n_d; ++j) {  // beyond the first rejection: the target's argmax
            target_row[j] = argmax(llama_get_logits_ith(ctx_tgt.get(), j), llama_vocab_n_tokens(vocab));
        }
    }
}

void Engine::tell_drafters(const StepState & s) {
    DraftOutcome o;
    o.n_drafted = s.n_d;
    o.n_accepted = s.n_acc;
    o.emitted = generated.data() + generated.size() - (s.n_acc + 1);
    o.n_emitted = s.n_acc + 1;
    o.keep_until = s.keep_until;
    if (s.source != DRAFTER_NONE) {
        last_verified = s.source;
    }
    for (auto & d : drafters) {
        o.proposal = asked[d->id] ? &candidates[d->id] : nullptr;
        o.verified = d->id == s.source;
        if (o.verified) {
            d->stats.on_verified(s.n_d);
        }
        o.last = d->id == last_verified;
        if (o.last) {
            d->stats.on_accept(s.n_acc);
        }
        const int64_t t = wall_ns();
        d->accept(o);
        d->stats.t_accept_ns += wall_ns() - t;
    }
}

// record: the step's telemetry row
void Engine::record(const StepState & s) {
    const size_t r = tel.add_row();
    const int32_t D = tel.depth, S = N_DRAFTERS;
    tel.step[r] = n_step;
    tel.pos[r] = n_past;
    tel.n_max[r] = s.p.n_max;
    tel.p_min[r] = s.p.p_min;
    tel.n_min[r] = s.p.n_min;
    tel.stop_reason[r] = (int8_t) s.chosen->stop;
    tel.drafter[r] = s.source;
    tel.expected_accepted[r] = s.source == DRAFTER_NONE ? NAN : (float) s.expected;
    for (int32_t id = 0; id < S; ++id) {
        if (asked[id]) {
            tel.candidate_len[r * S + id] = (int32_t) candidates[id].tokens.size();
            tel.candidate_expected[r * S + id] = (float) expected[id];
        }
    }
    tel.t_catchup_ns[r] = s.t_catchup_ns;
    tel.t_draft_ns[r] = s.t_draft_ns;
    tel.t_verify_ns[r] = s.t_verify_ns;
    tel.t_sample_ns[r] = s.t_sample_ns;
    tel.n_drafted[r] = s.n_d;
    tel.n_accepted[r] = s.n_acc;
    tel.correction[r] = s.correction;
    tel.rollback[r] = s.n_rollback;
    tel.rs_slot[r] = (recurrent && s.n_rollback > 0) ? s.n_rollback : -1;
    std::copy(target_row.begin(), target_row.begin() + s.n_d + 1, tel.target_tokens.begin() + r * (D + 1));
    record_draft(s, r);
    if (opts.telemetry) {
        const size_t n_rows = std::min<size_t>(probe_tgt.row_norms.size(), (size_t) s.n_d + 1);
        for (size_t j = 0; j < n_rows; ++j) {
            tel.h_norm_target[r * (D + 1) + j] = probe_tgt.row_norms[j];
        }
    }
}

// the verified draft's tokens and, from a drafter with a confidence (the MTP head, a draft model), its
// confidences and top-k; from the MTP head also its hidden-state columns
void Engine::record_draft(const StepState & s, size_t r) {
    const int32_t D = tel.depth, K = tel.topk;
    const Draft & d = *s.chosen;
    const bool has_prob = s.source != DRAFTER_NONE && (int32_t) d.prob.size() >= s.n_d;
    for (int32_t j = 0; j < s.n_d; ++j) {
        tel.drafted[r * D + j] = d.tokens[j];
        tel.draft_prob[r * D + j] = has_prob ? d.prob[j] : NAN;
    }
    if (!opts.telemetry || !has_prob || d.topk_ids.size() < (size_t) s.n_d * K) {
        return;
    }
    for (int32_t j = 0; j < s.n_d; ++j) {
        for (int32_t k = 0; k < K; ++k) {
            tel.topk_ids[(r * D + j) * K + k] = d.topk_ids[j * K + k];
            tel.topk_probs[(r * D + j) * K + k] = d.topk_probs[j * K + k];
        }
    }
    if (s.source != DRAFTER_MTP) {
        return;
    }
    for (int32_t j = 0; j < s.n_d; ++j) {
        tel.h_norm_draft[r * D + j] = d.h_norm[j];
        tel.draft_target_cos[r * D + j] = cosine(d.hidden.data() + (size_t) j * mtp->n_embd, mtp->verify_row(j), mtp->n_embd);
    }
}

void Engine::check_finish(llama_token last) {
    if (llama_vocab_is_eog(vocab, last)) {
        finish = FINISH_EOS;
    } else if ((int32_t) generated.size() >= cfg.max_tokens) {
        finish = FINISH_BUDGET;
    } else if (n_past > n_ctx() - 1) {
        finish = FINISH_CONTEXT;
    }
}

llama_token Engine::sample(int32_t row) {
    if (smpl) {
        return llama_sampler_sample(smpl.get(), ctx_tgt.get(), row);
    }
    return argmax(llama_get_logits_ith(ctx_tgt.get(), row), llama_vocab_n_tokens(vocab));
}

int64_t Engine::follow_target(const llama_token * tokens, int32_t n, llama_pos pos0) {
    int64_t t_model = 0;
    for (auto & d : drafters) {
        if (DRAFTER_TABLE[d->id].needs != DrafterNeeds::DRAFT_MODEL) {
            d->observe_target(tokens, n, pos0);
            continue;
        }
        const int64_t t = now_ns();
        d->observe_target(tokens, n, pos0);
        const int64_t dt = now_ns() - t;
        d->stats.t_accept_ns += dt;
        t_model += dt;
    }
    return t_model;
}

int32_t Engine::decode_target(const llama_token * tokens, int32_t n, llama_pos pos0) {
    llama_batch_ext_clear(batch_tgt.get());
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch_tgt.get(), 0, tokens[i]);
        const llama_pos pos = pos0 + i;
        llama_batch_ext_set_pos(batch_tgt.get(), idx, &pos);
        llama_batch_ext_set_output_logits(batch_tgt.get(), idx, true);
    }
    if (opts.telemetry) {
        probe_tgt.start();
    }
    const int32_t rc = llama_process(ctx_tgt.get(), LLAMA_PROCESS_TYPE_DECODE, batch_tgt.get());
    probe_tgt.stop();
    return rc;
}
