#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

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

llama_token argmax(const float * logits, int32_t n_vocab) {
    return (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
}

}  // namespace

Engine::Engine(const EngineOptions & o) : opts(o) {
    const auto missing = api.load("");
    if (!missing.empty()) {
        std::string names;
        for (const auto & m : missing) {
            names += (names.empty() ? "" : ", ") + m;
        }
        throw std::runtime_error("libllama lacks the nextn API: " + names);
    }
    if (opts.n_threads <= 0) {
        opts.n_threads = (int32_t) std::max(1u, std::thread::hardware_concurrency());
    }

    llama_model_params mp = llama_model_default_params();
    mp.load_mtp = true;
    model = llama_model_load_from_file(opts.path.c_str(), mp);
    if (model == nullptr) {
        throw std::runtime_error("llama.cpp could not load the model");
    }
    vocab = llama_model_get_vocab(model);
    layer_nextn = api.model_n_layer_nextn(model);
    recurrent = llama_model_is_recurrent(model) || llama_model_is_hybrid(model);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) opts.n_ctx;
    cp.n_batch = (uint32_t) opts.n_ctx;
    cp.n_ubatch = (uint32_t) std::min(opts.n_ctx, 512);
    cp.n_seq_max = 1;
    cp.n_threads = opts.n_threads;
    cp.n_threads_batch = opts.n_threads;
    cp.n_rs_seq = recurrent ? (uint32_t) opts.n_rs_seq : 0;
    cp.cb_eval = HiddenProbe::callback;
    cp.cb_eval_user_data = &probe_tgt;
    ctx_tgt = llama_init_from_model(model, cp);
    if (ctx_tgt == nullptr) {
        close();
        throw std::runtime_error("llama.cpp could not create the target context");
    }
    if (recurrent && (int32_t) api.n_rs_seq(ctx_tgt) < opts.n_rs_seq) {
        close();
        throw std::runtime_error("this model's recurrent layers do not support partial rollback (n_rs_seq)");
    }
    probe_tgt.node_name = "l_out-" + std::to_string(llama_model_n_layer(model) - 1);
    batch_tgt = llama_batch_ext_init(ctx_tgt);

    if (layer_nextn > 0) {
        llama_context_params cm = cp;
        cm.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
        cm.n_rs_seq = 0;
        cm.cb_eval_user_data = &probe_mtp;
        ctx_mtp = llama_init_from_model(model, cm);
        if (ctx_mtp == nullptr) {
            close();
            throw std::runtime_error("llama.cpp could not create the MTP context");
        }
        probe_mtp.node_name = "mtp_post_ffn-" + std::to_string(llama_model_n_layer(model));
        drafter = std::make_unique<MtpDrafter>(api, ctx_tgt, ctx_mtp, probe_mtp);
    }
    ngram = std::make_unique<NgramDrafter>(vocab);
    tel.depth = opts.n_rs_seq;
    tel.topk = opts.topk;
}

Engine::~Engine() { close(); }

void Engine::close() {
    cancel_requested.store(true);
    std::lock_guard<std::mutex> lk(run_mutex);
    drafter.reset();
    ngram.reset();
    if (smpl) { llama_sampler_free(smpl); smpl = nullptr; }
    if (batch_tgt) { llama_batch_ext_free(batch_tgt); batch_tgt = nullptr; }
    if (ctx_mtp) { llama_free(ctx_mtp); ctx_mtp = nullptr; }
    if (ctx_tgt) { llama_free(ctx_tgt); ctx_tgt = nullptr; }
    if (model) { llama_model_free(model); model = nullptr; }
    cancel_requested.store(false);
}

void Engine::check_open() const {
    if (model == nullptr) {
        throw std::runtime_error("the session is closed");
    }
}

int32_t Engine::n_vocab() const { check_open(); return llama_vocab_n_tokens(vocab); }
int32_t Engine::n_embd() const { check_open(); return llama_model_n_embd(model); }
int32_t Engine::n_ctx() const { check_open(); return (int32_t) llama_n_ctx(ctx_tgt); }
int32_t Engine::rs_slots() const { check_open(); return (int32_t) api.n_rs_seq(ctx_tgt); }
bool Engine::is_eog(llama_token t) const { check_open(); return llama_vocab_is_eog(vocab, t); }
llama_token Engine::eos() const { check_open(); return llama_vocab_eos(vocab); }

std::vector<llama_token> Engine::tokenize(const std::string & text, bool add_special) const {
    check_open();
    std::vector<llama_token> out(text.size() + 8);
    int32_t n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(),
                               add_special, /*parse_special*/ false);
    if (n < 0) {
        out.resize(-n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(),
                           add_special, false);
    }
    out.resize(std::max(n, 0));
    return out;
}

std::string Engine::piece(llama_token t) const {
    check_open();
    char buf[256];
    const int32_t n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, /*special*/ false);
    return n > 0 ? std::string(buf, n) : std::string();
}

std::string Engine::detokenize(const std::vector<llama_token> & tokens) const {
    check_open();
    std::string out(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab, tokens.data(), (int32_t) tokens.size(), out.data(), (int32_t) out.size(),
                                 false, false);
    if (n < 0) {
        out.resize(-n);
        n = llama_detokenize(vocab, tokens.data(), (int32_t) tokens.size(), out.data(), (int32_t) out.size(),
                             false, false);
    }
    out.resize(std::max(n, 0));
    return out;
}

void Engine::validate(const DraftParams & p) const {
    if (p.n_max < 0 || p.n_max > opts.n_rs_seq) {
        throw std::invalid_argument("n_max must be between 0 and the session's capacity n_rs_seq=" +
                                    std::to_string(opts.n_rs_seq) + ", got " + std::to_string(p.n_max));
    }
    if (!(p.p_min >= 0.0f && p.p_min <= 1.0f)) {
        throw std::invalid_argument("p_min must be in [0, 1]");
    }
    if (p.n_min < 0 || p.n_min > p.n_max) {
        throw std::invalid_argument("n_min must be between 0 and n_max");
    }
}

void Engine::validate_mode(DrafterMode mode, const DraftParams & p) const {
    if (p.n_max > 0 && drafter == nullptr && mode != MODE_NGRAM) {
        throw std::invalid_argument("the model has no MTP layers: use n_max=0 (or the n-gram drafter)");
    }
}

void Engine::set_params(const DraftParams & p) {
    check_open();
    validate(p);
    validate_mode(cfg.mode, p);
    std::lock_guard<std::mutex> lk(params_mutex);
    live = p;
}

DraftParams Engine::params() const {
    std::lock_guard<std::mutex> lk(params_mutex);
    return live;
}

void Engine::begin(const std::vector<llama_token> & prompt, const GenerationConfig & c, const DraftParams & p) {
    std::lock_guard<std::mutex> lk(run_mutex);
    ClockScope clock(opts.cpu_clock);
    check_open();
    validate(p);
    validate_mode(c.mode, p);
    if (c.ngram.size_n < 1 || c.ngram.size_m < 1) {
        throw std::invalid_argument("the n-gram sizes must be at least 1");
    }
    const int32_t N = (int32_t) prompt.size();
    if (N == 0) {
        throw std::invalid_argument("the prompt is empty");
    }
    if (N > n_ctx()) {
        throw std::length_error("the prompt has " + std::to_string(N) + " tokens but the context holds " +
                                std::to_string(n_ctx()));
    }
    if (c.max_tokens < 1) {
        throw std::invalid_argument("max_tokens must be at least 1");
    }
    cfg = c;
    set_params(p);
    cancel_requested.store(false);
    tel.clear();
    generated.clear();
    finish = FINISH_NONE;
    n_step = 0;
    n_prompt = N;
    tokens_all = prompt;
    ngram->config = c.ngram;
    ngram->reset();
    draft_buf.want_topk = draft_buf.want_oracle = false;
    const bool use_mtp = drafter && c.mode != MODE_NGRAM;

    if (smpl) { llama_sampler_free(smpl); smpl = nullptr; }
    if (cfg.temperature > 0.0f) {
        smpl = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(smpl, llama_sampler_init_temp(cfg.temperature));
        llama_sampler_chain_add(smpl, llama_sampler_init_dist(cfg.seed));
    }

    const int64_t t0 = now_ns();
    llama_memory_clear(llama_get_memory(ctx_tgt), true);
    if (drafter) {
        drafter->reset();
    }
    if (N > 1) {
        llama_batch_ext_clear(batch_tgt);
        for (int32_t i = 0; i < N - 1; ++i) {
            const int32_t idx = llama_batch_ext_add_token(batch_tgt, 0, prompt[i]);
            const llama_pos pos = i;
            llama_batch_ext_set_pos(batch_tgt, idx, &pos);
        }
        const int32_t rc = llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_tgt);
        if (rc != 0) {
            throw std::runtime_error("prompt decode failed (llama_process returned " + std::to_string(rc) + ")");
        }
        if (use_mtp) {
            drafter->observe_target(prompt.data(), N - 1, 0);
            if (p.n_max > 0) {
                const int32_t rc_mtp = drafter->catch_up();
                if (rc_mtp != 0) {
                    throw std::runtime_error("MTP prompt catch-up failed (llama_process returned " +
                                             std::to_string(rc_mtp) + ")");
                }
            }
            drafter->accept(N - 2, N - 1);
        }
    }
    id_last = prompt[N - 1];
    n_past = N - 1;
    t_prefill_ns = now_ns() - t0;
}

llama_token Engine::sample(int32_t row) {
    if (smpl) {
        return llama_sampler_sample(smpl, ctx_tgt, row);
    }
    return argmax(llama_get_logits_ith(ctx_tgt, row), llama_vocab_n_tokens(vocab));
}

namespace {

// Expected accepted length of an MTP draft: sum over k of the product of the first k confidences.
double expected_mtp(const Draft & d) {
    double expected = 0.0, p_reach = 1.0;
    for (const float p : d.prob) {
        p_reach *= (double) p;
        expected += p_reach;
    }
    return expected;
}

}  // namespace

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
    const DraftParams p = params();
    const int32_t D = tel.depth, K = tel.topk, S = Telemetry::n_sources;
    const bool tel_on = opts.telemetry;
    const int32_t ctx_size = n_ctx();
    const DrafterMode mode = cfg.mode;
    const bool use_mtp = drafter && mode != MODE_NGRAM;  // the MTP head follows the generation
    const bool use_ngram = mode != MODE_MTP;

    // how far this step may draft
    int32_t n_cap = p.n_max;
    StopReason cap_reason = STOP_N_MAX;
    const int32_t cap_budget = cfg.max_tokens - (int32_t) generated.size() - 1;
    const int32_t cap_ctx = ctx_size - n_past - 2;
    if (cap_budget < n_cap) { n_cap = cap_budget; cap_reason = STOP_BUDGET; }
    if (cap_ctx < n_cap) { n_cap = cap_ctx; cap_reason = STOP_CONTEXT; }
    n_cap = std::max(n_cap, 0);

    const size_t r = tel.add_row();
    tel.step[r] = n_step;
    tel.pos[r] = n_past;
    tel.n_max[r] = p.n_max;
    tel.p_min[r] = p.p_min;
    tel.n_min[r] = p.n_min;

    // draft: every enabled drafter proposes
    const bool drafting = use_mtp && p.n_max > 0;
    const bool drafting_ngram = use_ngram && p.n_max > 0 && n_cap > 0;
    draft_buf.clear();
    draft_buf.stop = cap_reason;
    ngram_buf.clear();
    ngram_buf.stop = cap_reason;
    int64_t t = now_ns();
    if (drafting && drafter->has_queue()) {
        const int32_t rc = drafter->catch_up();  // after steps with drafting off
        if (rc != 0) {
            throw std::runtime_error("MTP catch-up failed (llama_process returned " + std::to_string(rc) + ")");
        }
        tel.t_catchup_ns[r] += now_ns() - t;
        t = now_ns();
    }
    if (drafting && n_cap > 0) {
        drafter->draft(id_last, n_past, n_cap, cap_reason, p.p_min, p.n_min, K, tel_on, draft_buf);
    }
    if (drafting_ngram) {
        ngram->draft(tokens_all.data(), (size_t) n_past, id_last, n_cap, cap_reason, p.n_min, ngram_buf);
    }

    // choose the draft to verify (chain: the highest expected accepted length, MTP on a tie)
    const double e_mtp = drafting ? expected_mtp(draft_buf) : NAN;
    const double e_ngram = drafting_ngram ? ngram->expected_accepted((int32_t) ngram_buf.tokens.size()) : NAN;
    const bool ok_mtp = drafting && !draft_buf.dropped && !draft_buf.tokens.empty();
    const bool ok_ngram = drafting_ngram && !ngram_buf.dropped && !ngram_buf.tokens.empty();
    const Draft * chosen = &draft_buf;
    int8_t source = ok_mtp ? SOURCE_MTP : SOURCE_NONE;
    if (mode == MODE_NGRAM || (mode == MODE_CHAIN && ok_ngram && (!ok_mtp || e_ngram > e_mtp))) {
        chosen = &ngram_buf;
        source = ok_ngram ? SOURCE_NGRAM : SOURCE_NONE;
    }
    tel.t_draft_ns[r] = now_ns() - t;
    const int32_t n_d = chosen->dropped ? 0 : (int32_t) chosen->tokens.size();
    tel.stop_reason[r] = (int8_t) chosen->stop;
    tel.drafter[r] = source;
    tel.expected_accepted[r] = source == SOURCE_MTP ? (float) e_mtp : source == SOURCE_NGRAM ? (float) e_ngram : NAN;
    if (drafting) {
        tel.candidate_len[r * S + SOURCE_MTP] = (int32_t) draft_buf.tokens.size();
        tel.candidate_expected[r * S + SOURCE_MTP] = (float) e_mtp;
    }
    if (drafting_ngram) {
        tel.candidate_len[r * S + SOURCE_NGRAM] = (int32_t) ngram_buf.tokens.size();
        tel.candidate_expected[r * S + SOURCE_NGRAM] = (float) e_ngram;
    }

    // verify: [id_last, d0, ..., d_{n-1}] in one target batch
    t = now_ns();
    verify_tokens.assign(1, id_last);
    verify_tokens.insert(verify_tokens.end(), chosen->tokens.begin(), chosen->tokens.begin() + n_d);
    const int32_t rc = decode_target(verify_tokens.data(), n_d + 1, n_past);
    if (rc != 0) {
        throw std::runtime_error("target decode failed (llama_process returned " + std::to_string(rc) + ")");
    }
    if (use_mtp) {
        drafter->observe_target(verify_tokens.data(), n_d + 1, n_past);
    }
    tel.t_verify_ns[r] = now_ns() - t;

    // catch-up: the MTP head sees the verified rows with the target's hidden states
    if (drafting) {
        t = now_ns();
        const int32_t rc_mtp = drafter->catch_up();
        if (rc_mtp != 0) {
            throw std::runtime_error("MTP catch-up failed (llama_process returned " + std::to_string(rc_mtp) + ")");
        }
        tel.t_catchup_ns[r] += now_ns() - t;
    }

    // sample: accept the longest prefix the target agrees with
    t = now_ns();
    int32_t n_acc = 0;
    llama_token correction = -1;
    int32_t i = 0;
    for (; i <= n_d; ++i) {
        const llama_token tok = sample(i);
        tel.target_tokens[r * (D + 1) + i] = tok;
        if (i < n_d && tok == verify_tokens[i + 1] && !llama_vocab_is_eog(vocab, tok)) {
            ++n_acc;
            continue;
        }
        correction = tok;
        break;
    }
    if (tel_on) {
        for (int32_t j = i + 1; j <= n_d; ++j) {  // beyond the first rejection: the target's argmax
            tel.target_tokens[r * (D + 1) + j] = argmax(llama_get_logits_ith(ctx_tgt, j), llama_vocab_n_tokens(vocab));
        }
    }

    // rollback of the rejected drafts
    const int32_t n_rollback = n_d - n_acc;
    const llama_pos keep_until = n_past + 1 + n_acc;
    if (n_rollback > 0 && !llama_memory_seq_rm(llama_get_memory(ctx_tgt), 0, keep_until, -1)) {
        throw std::runtime_error("rollback of " + std::to_string(n_rollback) + " tokens failed (n_rs_seq=" +
                                 std::to_string(rs_slots()) + ")");
    }
    if (use_mtp) {
        drafter->accept(n_acc, keep_until);
    }
    tel.t_sample_ns[r] = now_ns() - t;

    generated.insert(generated.end(), verify_tokens.begin() + 1, verify_tokens.begin() + 1 + n_acc);
    generated.push_back(correction);
    tokens_all.insert(tokens_all.end(), generated.end() - (n_acc + 1), generated.end());
    if (drafting_ngram) {
        ngram->observe(ngram_buf.tokens, generated.data() + generated.size() - (n_acc + 1), n_acc + 1);
    }

    tel.n_drafted[r] = n_d;
    tel.n_accepted[r] = n_acc;
    tel.correction[r] = correction;
    tel.rollback[r] = n_rollback;
    tel.rs_slot[r] = (recurrent && n_rollback > 0) ? n_rollback : -1;
    const bool from_mtp = chosen == &draft_buf;
    for (int32_t j = 0; j < n_d; ++j) {
        tel.drafted[r * D + j] = chosen->tokens[j];
        tel.draft_prob[r * D + j] = from_mtp ? chosen->prob[j] : NAN;
    }
    if (tel_on && from_mtp) {
        for (int32_t j = 0; j < n_d; ++j) {
            for (int32_t k = 0; k < K; ++k) {
                tel.topk_ids[(r * D + j) * K + k] = draft_buf.topk_ids[j * K + k];
                tel.topk_probs[(r * D + j) * K + k] = draft_buf.topk_probs[j * K + k];
            }
            tel.h_norm_draft[r * D + j] = draft_buf.h_norm[j];
            tel.draft_target_cos[r * D + j] =
                cosine(draft_buf.hidden.data() + (size_t) j * drafter->n_embd, drafter->verify_row(j), drafter->n_embd);
        }
    }
    if (tel_on) {
        const size_t n_rows = std::min<size_t>(probe_tgt.row_norms.size(), (size_t) n_d + 1);
        for (size_t j = 0; j < n_rows; ++j) {
            tel.h_norm_target[r * (D + 1) + j] = probe_tgt.row_norms[j];
        }
    }

    n_past = keep_until;
    id_last = correction;
    ++n_step;
    check_finish(correction);
    return finish == FINISH_NONE;
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

void Engine::run() {
    while (step()) {
    }
}

int32_t Engine::decode_target(const llama_token * tokens, int32_t n, llama_pos pos0) {
    llama_batch_ext_clear(batch_tgt);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch_tgt, 0, tokens[i]);
        const llama_pos pos = pos0 + i;
        llama_batch_ext_set_pos(batch_tgt, idx, &pos);
        llama_batch_ext_set_output_logits(batch_tgt, idx, true);
    }
    if (opts.telemetry) {
        probe_tgt.start();
    }
    const int32_t rc = llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_tgt);
    probe_tgt.stop();
    return rc;
}

bool Engine::record_oracle(const std::vector<llama_token> & prompt, int32_t max_tokens, int32_t depth,
                           const NgramConfig & ngram_cfg, bool probe, OracleRecord & out) {
    check_open();
    if (depth < 1 || depth > opts.n_rs_seq) {
        throw std::invalid_argument("the oracle depth must be between 1 and the session's capacity n_rs_seq=" +
                                    std::to_string(opts.n_rs_seq) + ", got " + std::to_string(depth));
    }
    GenerationConfig c;
    c.max_tokens = max_tokens;
    c.mode = drafter ? MODE_CHAIN : MODE_NGRAM;  // the MTP head (if any) follows the generation
    c.ngram = ngram_cfg;
    begin(prompt, c, DraftParams{depth, 0.0f, 0});

    std::lock_guard<std::mutex> lk(run_mutex);
    ClockScope clock(opts.cpu_clock);
    out.depth = depth;
    out.topk = opts.topk;
    out.clear();
    const int32_t N = depth, K = opts.topk;
    const int32_t n_vocab_ = llama_vocab_n_tokens(vocab);
    const int32_t ctx_size = n_ctx();
    const bool tel_on = opts.telemetry;
    const bool use_mtp = drafter != nullptr;
    llama_memory_t mem = llama_get_memory(ctx_tgt);
    std::vector<uint8_t> saved;           // the target's recurrent state, restored after each probe
    std::vector<llama_token> probe_tokens;
    draft_buf.want_topk = draft_buf.want_oracle = true;

    while (finish == FINISH_NONE) {
        if (cancel_requested.exchange(false)) {
            finish = FINISH_CANCELLED;
            break;
        }
        const int32_t g = (int32_t) generated.size();
        const size_t r = out.add_row();
        const int32_t n_cap = std::max(0, std::min({N, max_tokens - g - 1, ctx_size - n_past - 2}));
        out.pos[r] = n_past;
        out.cap[r] = n_cap;

        // the MTP chain the engine would draft here (p_min = 0: every later cut is a prefix of it)
        if (use_mtp && n_cap > 0) {
            const int64_t t = now_ns();
            drafter->draft(id_last, n_past, n_cap, STOP_N_MAX, 0.0f, 0, K, tel_on, draft_buf);
            out.t_draft_ns[r] = now_ns() - t;
            const int32_t L = (int32_t) draft_buf.tokens.size();
            out.chain_len[r] = L;
            out.chain_eos[r] = draft_buf.stop == STOP_EOS;
            for (int32_t j = 0; j < L; ++j) {
                out.chain[r * N + j] = draft_buf.tokens[j];
                out.chain_prob[r * N + j] = draft_buf.prob[j];
                out.chain_margin[r * N + j] = draft_buf.margin[j];
                out.t_draft_cum_ns[r * N + j] = draft_buf.t_decode_ns[j];
                for (int32_t k = 0; k < K; ++k) {
                    out.topk_ids[(r * N + j) * K + k] = draft_buf.topk_ids[j * K + k];
                    out.topk_probs[(r * N + j) * K + k] = draft_buf.topk_probs[j * K + k];
                }
            }
        }
        // the n-gram draft
        if (n_cap > 0) {
            const int64_t t = now_ns();
            ngram->draft(tokens_all.data(), (size_t) n_past, id_last, n_cap, STOP_N_MAX, 0, ngram_buf);
            out.t_ngram_ns[r] = now_ns() - t;
            out.ngram_len[r] = (int32_t) ngram_buf.tokens.size();
            out.ngram_eos[r] = ngram_buf.stop == STOP_EOS;
            for (size_t j = 0; j < ngram_buf.tokens.size(); ++j) {
                out.ngram[r * N + j] = ngram_buf.tokens[j];
            }
        }

        // cost probes. Even positions: a verify batch of k = 2 .. N + 1 tokens (round robin)
        // decoded twice: first right after the MTP chain (llama.cpp builds the graph anew, caches
        // hold the MTP head's data: "fresh, cold"), then again at once (graph reused, caches warm:
        // "reused, hot"); its MTP catch-up, the argmax of its rows and the engine's rollback of
        // k - 1 tokens are timed. Odd positions: the plain step's token decoded once after the chain
        // ("reused, cold"; the plain verify that follows is "reused, hot", the one after an even
        // probe "fresh, hot"). After each probe decode the target state is restored exactly.
        const bool even = g % 2 == 0;
        const int32_t k = even ? 2 + (g / 2) % N : 1;
        int32_t verify_after = g == 0 ? -1 : 1;  // size of the target batch before the plain verify
        if (probe && n_past > 0 && n_past + k <= ctx_size) {
            probe_tokens.assign(1, id_last);
            for (int32_t j = 0; j + 1 < k; ++j) {
                probe_tokens.push_back(use_mtp && j < (int32_t) draft_buf.tokens.size() ? draft_buf.tokens[j] : id_last);
            }
            if (recurrent) {
                saved.resize(llama_state_seq_get_size_ext(ctx_tgt, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
                llama_state_seq_get_data_ext(ctx_tgt, saved.data(), saved.size(), 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            }
            for (int32_t rep = 0; rep < (even ? 2 : 1); ++rep) {
                int64_t t = now_ns();
                const int32_t rc = decode_target(probe_tokens.data(), k, n_past);
                if (rc != 0) {
                    throw std::runtime_error("oracle probe decode failed (llama_process returned " +
                                             std::to_string(rc) + ")");
                }
                if (use_mtp) {
                    drafter->copy_target_rows(k, probe_rows);
                }
                (rep == 0 ? out.probe_verify_ns : out.probe_verify_reuse_ns)[r] = now_ns() - t;
                if (rep == 0 && k > 1) {
                    t = now_ns();
                    llama_token sink = 0;
                    for (int32_t i = 0; i < k; ++i) {
                        sink ^= argmax(llama_get_logits_ith(ctx_tgt, i), n_vocab_);
                    }
                    out.probe_argmax_ns[r] = now_ns() - t + (sink == -12345 ? 1 : 0);
                    if (use_mtp) {
                        t = now_ns();
                        const int32_t rc_mtp = drafter->probe_catch_up(probe_tokens.data(), k, n_past, probe_rows);
                        out.probe_catchup_ns[r] = now_ns() - t;
                        if (rc_mtp != 0) {
                            throw std::runtime_error("oracle probe catch-up failed (llama_process returned " +
                                                     std::to_string(rc_mtp) + ")");
                        }
                    }
                }
                t = now_ns();
                const bool rolled = llama_memory_seq_rm(mem, 0, n_past + 1, -1);
                if (rep == 0 && k > 1) {
                    out.probe_rollback_ns[r] = now_ns() - t;
                }
                if (recurrent) {
                    llama_state_seq_set_data_ext(ctx_tgt, saved.data(), saved.size(), 0,
                                                 LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
                }
                if (!rolled || !llama_memory_seq_rm(mem, 0, n_past, -1)) {
                    throw std::runtime_error("oracle probe: the target memory could not be restored");
                }
            }
            out.probe_k[r] = k;
            verify_after = k;
        }
        out.verify_after[r] = verify_after;

        // the plain step: the greedy truth, exactly as Engine::step with n_max = 0 (plus the catch-up)
        int64_t t = now_ns();
        const int32_t rc = decode_target(&id_last, 1, n_past);
        if (rc != 0) {
            throw std::runtime_error("target decode failed (llama_process returned " + std::to_string(rc) + ")");
        }
        if (use_mtp) {
            drafter->observe_target(&id_last, 1, n_past);
        }
        out.t_verify_ns[r] = now_ns() - t;
        if (use_mtp) {
            t = now_ns();
            const int32_t rc_mtp = drafter->catch_up();
            out.t_catchup_ns[r] = now_ns() - t;
            if (rc_mtp != 0) {
                throw std::runtime_error("MTP catch-up failed (llama_process returned " + std::to_string(rc_mtp) + ")");
            }
        }
        t = now_ns();
        const float * logits = llama_get_logits_ith(ctx_tgt, 0);
        const llama_token tok = argmax(logits, n_vocab_);
        out.t_argmax_ns[r] = now_ns() - t;
        if (use_mtp) {
            drafter->accept(0, n_past + 1);
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

        generated.push_back(tok);
        tokens_all.push_back(tok);
        n_past += 1;
        id_last = tok;
        ++n_step;
        check_finish(tok);
    }
    draft_buf.want_topk = draft_buf.want_oracle = false;
    if (finish == FINISH_CANCELLED) {
        return false;
    }

    // a plain tail after the generation: target decodes one after another with nothing between
    // them (no MTP head, no probe, no restore), as in plain decoding and the n-gram mode; the
    // memory past the generation is not used afterwards (the next generation clears it)
    const int32_t n_tail = probe ? std::min(32, ctx_size - n_past - 1) : 0;
    for (int32_t i = 0; i < n_tail; ++i) {
        const int64_t t = now_ns();
        const int32_t rc = decode_target(&id_last, 1, n_past);
        if (rc != 0) {
            break;
        }
        if (use_mtp) {
            drafter->copy_target_rows(1, probe_rows);
        }
        out.tail_verify_ns.push_back(now_ns() - t);
        out.tail_pos.push_back(n_past);
        id_last = argmax(llama_get_logits_ith(ctx_tgt, 0), n_vocab_);
        ++n_past;
    }
    return true;
}
