// Engine::record_oracle, in named phases per position: record_drafts (every drafter's draft, in the
// table's order: the MTP chain first), probe_costs (verify-batch cost probes, the target restored after each),
// plain_step (the greedy truth); then tail (plain decodes after the generation).
#include <algorithm>
#include <cmath>

#include "engine.h"
#include "errors.h"
#include "timing.h"

bool Engine::record_oracle(const std::vector<llama_token> & prompt, int32_t max_tokens, int32_t depth,
                           const DrafterOptions & options, bool probe, OracleRecord & out) {
    check_open();
    if (checkpoints()) {
        fail(ErrorKind::PARAMETER, "the oracle rolls the target back through its snapshot slots: open the session "
                                   "with n_rs_seq of at least the depth (this one has none, n_rs_seq=0)");
    }
    if (depth < 1 || depth > opts.capacity) {
        fail(ErrorKind::PARAMETER, "the oracle depth must be between 1 and the session's capacity " +
                                       std::to_string(opts.capacity) + ", got " + std::to_string(depth));
    }
    GenerationConfig c;
    c.max_tokens = max_tokens;
    c.drafters = oracle_drafters();
    c.options = options;
    begin(prompt, c, DraftParams{depth, 0.0f, 0});

    std::lock_guard<std::mutex> lk(run_mutex);
    ClockScope clock(opts.cpu_clock);
    Sequence & q = *reqs.front();
    out.depth = depth;
    out.topk = opts.topk;
    out.clear();
    for (Draft & d : oracle_drafts) {
        d.clear();
    }
    const int32_t ctx_size = n_ctx_seq();
    while (q.finish == FINISH_NONE) {
        if (cancel_requested.exchange(false) || interrupted()) {
            q.finish = FINISH_CANCELLED;
            return false;
        }
        const int32_t g = (int32_t) q.generated.size();
        const size_t r = out.add_row();
        const int32_t n_cap = std::max(0, std::min({depth, max_tokens - g - 1, ctx_size - q.n_past - 2}));
        out.pos[r] = q.n_past;
        out.cap[r] = n_cap;
        record_drafts(q, out, r, n_cap);
        probe_costs(q, out, r, probe);
        plain_step(q, out, r);
    }
    if (probe) {
        tail(q, out);
    }
    return true;
}

namespace {

// What the oracle asks the drafters for: a draft of up to n_cap tokens with p_min = 0 and n_min =
// 0 (every later cut of the MTP chain is a prefix of it).
StepState oracle_cap(int32_t n_cap, int32_t depth) {
    StepState s;
    s.p = DraftParams{depth, 0.0f, 0};
    s.n_cap = n_cap;
    s.cap_reason = STOP_N_MAX;
    return s;
}

}  // namespace

// The recording list: every drafter of the table this session can run (MTP layers, a draft model).
std::vector<std::string> Engine::oracle_drafters() const {
    std::vector<std::string> names;
    for (int32_t id = 0; id < N_DRAFTERS; ++id) {
        if (can_run((DrafterId) id)) {
            names.push_back(DRAFTER_TABLE[id].name);
        }
    }
    return names;
}

// the draft whose tokens the cost probes verify: the first drafter's with a draft, in chain (= table) order
// (the MTP chain where the model has the head)
const Draft * Engine::probe_draft(const Sequence & q) const {
    for (const auto & d : q.drafters) {
        if (!oracle_drafts[d->id].tokens.empty()) {
            return &oracle_drafts[d->id];
        }
    }
    return nullptr;
}

// the draft every drafter would propose here, in chain (= table) order: the MTP chain first (the
// MTP head keeps the last one when n_cap is 0: the probe tokens reuse it)
void Engine::record_drafts(Sequence & q, OracleRecord & out, size_t r, int32_t n_cap) {
    if (n_cap <= 0) {
        return;
    }
    q.s = oracle_cap(n_cap, out.depth);
    const DraftRequest req = draft_request(q, /*oracle*/ true);
    for (auto & d : q.drafters) {
        Draft & draft = oracle_drafts[d->id];
        draft.clear(req.cap_reason);
        const int64_t t = now_ns();
        const bool took_part = d->draft(req, draft);
        const int64_t t_ns = now_ns() - t;
        if (took_part) {
            record_draft(out, r, *d, draft, t_ns);
        }
    }
}

// one drafter's draft into its `sources` entry of row r: what the drafter filled in, the rest padded
void Engine::record_draft(OracleRecord & out, size_t r, const Drafter & d, const Draft & draft, int64_t t_ns) const {
    const int32_t S = N_DRAFTERS, N = out.depth, K = out.topk, s = d.id;
    const size_t rs = r * S + s;
    const int32_t L = std::min((int32_t) draft.tokens.size(), N);
    out.t_draft_ns[rs] = t_ns;
    out.draft_len[rs] = (int32_t) draft.tokens.size();
    out.draft_eos[rs] = draft.stop == STOP_EOS;
    for (int32_t j = 0; j < L; ++j) {
        const size_t rsj = rs * N + j;
        out.draft[rsj] = draft.tokens[j];
        if (j < (int32_t) draft.prob.size()) { out.draft_prob[rsj] = draft.prob[j]; }
        if (j < (int32_t) draft.margin.size()) { out.draft_margin[rsj] = draft.margin[j]; }
        if (j < (int32_t) draft.t_decode_ns.size()) { out.t_draft_cum_ns[rsj] = draft.t_decode_ns[j]; }
        for (int32_t k = 0; k < K && (size_t) (j + 1) * K <= draft.topk_ids.size(); ++k) {
            out.topk_ids[rsj * K + k] = draft.topk_ids[j * K + k];
            out.topk_probs[rsj * K + k] = draft.topk_probs[j * K + k];
        }
    }
}

// Cost probes. Even positions: a verify batch of k = 2 .. N + 1 tokens (round robin) decoded
// twice: first right after the MTP chain (llama.cpp builds the graph anew, caches hold the MTP
// head's data: "fresh, cold"), then again at once (graph reused, caches warm: "reused, hot"); its
// MTP catch-up, the argmax of its rows and the engine's rollback of k - 1 tokens are timed. Odd
// positions: the plain step's token decoded once after the chain ("reused, cold"; the plain verify
// that follows is "reused, hot", the one after an even probe "fresh, hot"). After each probe
// decode the target state is restored exactly.
void Engine::probe_costs(Sequence & q, OracleRecord & out, size_t r, bool probe) {
    const int32_t g = (int32_t) q.generated.size(), N = out.depth;
    const bool even = g % 2 == 0;
    const int32_t k = even ? 2 + (g / 2) % N : 1;
    int32_t verify_after = g == 0 ? -1 : 1;  // size of the target batch before the plain verify
    if (probe && q.n_past > 0 && q.n_past + k <= n_ctx_seq()) {
        probe_tokens.assign(1, q.id_last);
        const Draft * chain = probe_draft(q);
        for (int32_t j = 0; j + 1 < k; ++j) {
            const bool from_chain = chain != nullptr && j < (int32_t) chain->tokens.size();
            probe_tokens.push_back(from_chain ? chain->tokens[j] : q.id_last);
        }
        if (recurrent) {
            saved_state.resize(llama_state_seq_get_size_ext(ctx_tgt.get(), q.slot, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
            llama_state_seq_get_data_ext(ctx_tgt.get(), saved_state.data(), saved_state.size(), q.slot,
                                         LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        }
        for (int32_t rep = 0; rep < (even ? 2 : 1); ++rep) {
            probe_once(q, out, r, k, rep);
        }
        out.probe_k[r] = k;
        verify_after = k;
    }
    out.verify_after[r] = verify_after;
}

// One probe decode of probe_tokens[0 .. k) (rep 0: with its argmax, catch-up and rollback timed),
// then the target memory and recurrent state restored to before it.
void Engine::probe_once(Sequence & q, OracleRecord & out, size_t r, int32_t k, int32_t rep) {
    llama_memory_t mem = llama_get_memory(ctx_tgt.get());
    int64_t t = now_ns();
    check_decode(decode_tokens(q, probe_tokens.data(), k), "oracle probe decode");
    const TargetRows rows = extract_features(q.needs, probe_tokens.data(), k, q.n_past, 0, probe_features);
    (rep == 0 ? out.probe_verify_ns : out.probe_verify_reuse_ns)[r] = now_ns() - t;
    const bool timed = rep == 0 && k > 1;
    if (timed) {
        const int32_t n_vocab_ = llama_vocab_n_tokens(vocab);
        t = now_ns();
        llama_token sink = 0;
        for (int32_t i = 0; i < k; ++i) {
            sink ^= argmax(llama_get_logits_ith(ctx_tgt.get(), i), n_vocab_);
        }
        out.probe_argmax_ns[r] = now_ns() - t + (sink == -12345 ? 1 : 0);
        if (q.needs.any()) {  // the drafters that read the target's features follow the batch (the MTP catch-up)
            t = now_ns();
            for (auto & d : q.drafters) {
                check_decode(d->probe_follow(rows), "oracle probe catch-up");
            }
            out.probe_catchup_ns[r] = now_ns() - t;
        }
    }
    t = now_ns();
    const bool rolled = llama_memory_seq_rm(mem, q.slot, q.n_past + 1, -1);
    if (timed) {
        out.probe_rollback_ns[r] = now_ns() - t;
    }
    if (recurrent) {
        llama_state_seq_set_data_ext(ctx_tgt.get(), saved_state.data(), saved_state.size(), q.slot,
                                     LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    }
    if (!rolled || !llama_memory_seq_rm(mem, q.slot, q.n_past, -1)) {
        fail(ErrorKind::ROLLBACK, "oracle probe: the target memory could not be restored");
    }
}

// the plain step: the greedy truth, exactly as Engine::step with n_max = 0 (plus the catch-up)
void Engine::plain_step(Sequence & q, OracleRecord & out, size_t r) {
    int64_t t = now_ns();
    check_decode(decode_tokens(q, &q.id_last, 1), "target decode");
    const int64_t t_follow = follow_target(q, &q.id_last, 1, q.n_past, 0);
    out.t_verify_ns[r] = now_ns() - t - t_follow;
    out.t_follow_ns[r] = t_follow;
    if (q.needs.any()) {
        t = now_ns();
        catch_up_drafters(drafters_of(q), "catch-up");
        out.t_catchup_ns[r] = now_ns() - t;
    }
    const int32_t n_vocab_ = llama_vocab_n_tokens(vocab);
    t = now_ns();
    const float * logits = llama_get_logits_ith(ctx_tgt.get(), 0);
    const llama_token tok = argmax(logits, n_vocab_);
    out.t_argmax_ns[r] = now_ns() - t;
    for (auto & d : q.drafters) {
        d->keep(0, q.n_past + 1);
    }
    out.t_sample_ns[r] = now_ns() - t;
    float second = -INFINITY;
    for (int32_t v = 0; v < n_vocab_; ++v) {
        if (v != tok && logits[v] > second) {
            second = logits[v];
        }
    }
    out.token[r] = tok;
    out.target_margin[r] = logits[tok] - second;

    q.generated.push_back(tok);
    q.tokens_all.push_back(tok);
    q.n_past += 1;
    q.id_last = tok;
    ++q.n_step;
    check_finish(q, tok);
}

// A plain tail after the generation: target decodes one after another with nothing between them
// (no MTP head, no probe, no restore), as in plain decoding and the n-gram mode; the memory past
// the generation is not used afterwards (the next generation clears it).
void Engine::tail(Sequence & q, OracleRecord & out) {
    const int32_t n_vocab_ = llama_vocab_n_tokens(vocab);
    const int32_t n_tail = std::min(32, n_ctx_seq() - q.n_past - 1);
    for (int32_t i = 0; i < n_tail; ++i) {
        const int64_t t = now_ns();
        if (decode_tokens(q, &q.id_last, 1) != 0) {
            break;
        }
        extract_features(q.needs, &q.id_last, 1, q.n_past, 0, probe_features);
        out.tail_verify_ns.push_back(now_ns() - t);
        out.tail_pos.push_back(q.n_past);
        q.id_last = argmax(llama_get_logits_ith(ctx_tgt.get(), 0), n_vocab_);
        ++q.n_past;
    }
}
