#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

namespace {

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

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
    tel.depth = opts.n_rs_seq;
    tel.topk = opts.topk;
}

Engine::~Engine() { close(); }

void Engine::close() {
    cancel_requested.store(true);
    std::lock_guard<std::mutex> lk(run_mutex);
    drafter.reset();
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
    if (p.n_max > 0 && drafter == nullptr) {
        throw std::invalid_argument("the model has no MTP layers: use n_max=0");
    }
}

void Engine::set_params(const DraftParams & p) {
    check_open();
    validate(p);
    std::lock_guard<std::mutex> lk(params_mutex);
    live = p;
}

DraftParams Engine::params() const {
    std::lock_guard<std::mutex> lk(params_mutex);
    return live;
}

void Engine::begin(const std::vector<llama_token> & prompt, const GenerationConfig & c, const DraftParams & p) {
    std::lock_guard<std::mutex> lk(run_mutex);
    check_open();
    validate(p);
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
        if (drafter) {
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

bool Engine::step() {
    std::lock_guard<std::mutex> lk(run_mutex);
    check_open();
    if (finish != FINISH_NONE) {
        return false;
    }
    if (cancel_requested.exchange(false)) {
        finish = FINISH_CANCELLED;
        return false;
    }
    const DraftParams p = params();
    const int32_t D = tel.depth, K = tel.topk;
    const bool tel_on = opts.telemetry;
    const int32_t ctx_size = n_ctx();

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

    // draft
    const bool drafting = drafter && p.n_max > 0;
    draft_buf.clear();
    draft_buf.stop = cap_reason;
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
    tel.t_draft_ns[r] = now_ns() - t;
    const int32_t n_d = draft_buf.dropped ? 0 : (int32_t) draft_buf.tokens.size();
    tel.stop_reason[r] = (int8_t) draft_buf.stop;

    // verify: [id_last, d0, ..., d_{n-1}] in one target batch
    t = now_ns();
    verify_tokens.assign(1, id_last);
    verify_tokens.insert(verify_tokens.end(), draft_buf.tokens.begin(), draft_buf.tokens.begin() + n_d);
    llama_batch_ext_clear(batch_tgt);
    for (int32_t i = 0; i <= n_d; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch_tgt, 0, verify_tokens[i]);
        const llama_pos pos = n_past + i;
        llama_batch_ext_set_pos(batch_tgt, idx, &pos);
        llama_batch_ext_set_output_logits(batch_tgt, idx, true);
    }
    if (tel_on) {
        probe_tgt.start();
    }
    const int32_t rc = llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_tgt);
    probe_tgt.stop();
    if (rc != 0) {
        throw std::runtime_error("target decode failed (llama_process returned " + std::to_string(rc) + ")");
    }
    if (drafter) {
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
    if (drafter) {
        drafter->accept(n_acc, keep_until);
    }
    tel.t_sample_ns[r] = now_ns() - t;

    generated.insert(generated.end(), verify_tokens.begin() + 1, verify_tokens.begin() + 1 + n_acc);
    generated.push_back(correction);

    tel.n_drafted[r] = n_d;
    tel.n_accepted[r] = n_acc;
    tel.correction[r] = correction;
    tel.rollback[r] = n_rollback;
    tel.rs_slot[r] = (recurrent && n_rollback > 0) ? n_rollback : -1;
    for (int32_t j = 0; j < n_d; ++j) {
        tel.drafted[r * D + j] = draft_buf.tokens[j];
        tel.draft_prob[r * D + j] = draft_buf.prob[j];
    }
    if (tel_on) {
        for (int32_t j = 0; j < n_d; ++j) {
            for (int32_t k = 0; k < K; ++k) {
                tel.topk_ids[(r * D + j) * K + k] = draft_buf.topk_ids[j * K + k];
                tel.topk_probs[(r * D + j) * K + k] = draft_buf.topk_probs[j * K + k];
            }
            tel.h_norm_draft[r * D + j] = draft_buf.h_norm[j];
            tel.draft_target_cos[r * D + j] =
                cosine(draft_buf.hidden.data() + (size_t) j * drafter->n_embd, drafter->verify_row(j), drafter->n_embd);
        }
        const size_t n_rows = std::min<size_t>(probe_tgt.row_norms.size(), (size_t) n_d + 1);
        for (size_t j = 0; j < n_rows; ++j) {
            tel.h_norm_target[r * (D + 1) + j] = probe_tgt.row_norms[j];
        }
    }

    n_past = keep_until;
    id_last = correction;
    ++n_step;

    if (llama_vocab_is_eog(vocab, correction)) {
        finish = FINISH_EOS;
    } else if ((int32_t) generated.size() >= cfg.max_tokens) {
        finish = FINISH_BUDGET;
    } else if (n_past > ctx_size - 1) {
        finish = FINISH_CONTEXT;
    }
    return finish == FINISH_NONE;
}

void Engine::run() {
    while (step()) {
    }
}
