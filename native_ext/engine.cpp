// Engine set-up, model facts, tokenization, parameters and the start of a generation. Requests and
// slots are in requests.cpp, the phases of a step in step.cpp, the oracle in oracle.cpp.
#include "engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "eagle3_drafter.h"
#include "errors.h"
#include "timing.h"

// ---- configuration ------------------------------------------------------------------------------

bool DrafterChain::has(DrafterId id) const { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

DrafterChain parse_chain(const GenerationConfig & cfg) {
    if (cfg.drafters.empty()) {
        fail(ErrorKind::PARAMETER, "the drafter list is empty: name one or more of " + drafter_names_list());
    }
    DrafterChain chain;
    chain.ids.clear();
    for (const std::string & name : cfg.drafters) {
        const int i = drafter_index(name);
        if (i < 0) {
            fail(ErrorKind::PARAMETER, "unknown drafter \"" + name + "\": expected one of " + drafter_names_list());
        }
        if (chain.has((DrafterId) i)) {
            fail(ErrorKind::PARAMETER, "the drafter \"" + name + "\" is listed twice");
        }
        chain.ids.push_back((DrafterId) i);
    }
    const int policy = name_index(CHAIN_POLICY_NAMES, cfg.chain_policy);
    if (policy < 0) {
        fail(ErrorKind::PARAMETER, "unknown chain policy \"" + cfg.chain_policy + "\": expected one of " +
                                       names_list(CHAIN_POLICY_NAMES));
    }
    chain.policy = (ChainPolicy) policy;
    return chain;
}

// ---- set-up -------------------------------------------------------------------------------------

Engine::Engine(const EngineOptions & o) : opts(o) {
    const auto missing = api.load("");
    if (!missing.empty()) {
        std::string names;
        for (const auto & m : missing) {
            names += (names.empty() ? "" : ", ") + m;
        }
        fail(ErrorKind::LIBRARY, "libllama lacks the nextn API: " + names);
    }
    if (opts.n_parallel < 1) {
        fail(ErrorKind::PARAMETER, "n_parallel must be at least 1, got " + std::to_string(opts.n_parallel));
    }
    if (opts.n_threads <= 0) {
        opts.n_threads = (int32_t) std::max(1u, std::thread::hardware_concurrency());
    }
    opts.placement.validate();
    if (opts.n_rs_seq < 0 || opts.capacity < 0) {
        fail(ErrorKind::PARAMETER, "n_rs_seq and capacity must be at least 0");
    }
    if (opts.capacity == 0) {
        opts.capacity = opts.n_rs_seq;
    }
    if (opts.capacity < 1) {
        fail(ErrorKind::PARAMETER, "a session without snapshot slots (n_rs_seq=0) needs its capacity, the largest n_max");
    }
    load_model();
    if (recurrent && opts.n_rs_seq > 0 && opts.capacity > opts.n_rs_seq) {
        fail(ErrorKind::PARAMETER, "capacity " + std::to_string(opts.capacity) + " is over the " +
                                       std::to_string(opts.n_rs_seq) + " snapshot slots (n_rs_seq) a recurrent target "
                                       "rolls back through: raise n_rs_seq, or set it to 0 for checkpoints");
    }
    create_target_context();
    if (layer_nextn > 0) {
        create_mtp_context();
    }
    if (!opts.draft_path.empty()) {
        load_draft_model();
    }
    slots.assign((size_t) opts.n_parallel, nullptr);
    oracle_drafts.resize(N_DRAFTERS);
}

Engine::~Engine() { close(); }

void Engine::load_model() {
    llama_model_params mp = llama_model_default_params();
    mp.load_mtp = true;
    opts.placement.apply(mp);
    model.reset(llama_model_load_from_file(opts.path.c_str(), mp));
    if (model == nullptr) {
        fail(ErrorKind::LOAD, "llama.cpp could not load the model");
    }
    vocab = llama_model_get_vocab(model.get());
    lookup_vocab = LookupVocab::of(vocab);
    layer_nextn = api.model_n_layer_nextn(model.get());
    recurrent = llama_model_is_recurrent(model.get()) || llama_model_is_hybrid(model.get());
}

namespace {

// llama.cpp's output limit for a speculative set-up (common_speculative_get_output_limits, which llama-server and
// llama-speculative-simple set): n_parallel x rows_per_seq outputs a decode. It sizes the logits rows of the worst-case
// compute buffer reserved at creation (llama.cpp's default, n_batch outputs, reserves n_ubatch rows: 0.5 GB at a 248 k
// vocabulary); libllama asserts every decode's outputs within it (GGML_ASSERT in output_reserve: the process aborts).
uint32_t output_limit(const EngineOptions & opts, int64_t rows_per_seq) {
    return (uint32_t) std::min<int64_t>(opts.n_ctx, (int64_t) opts.n_parallel * rows_per_seq);
}

llama_context_params context_params(const EngineOptions & opts, bool recurrent, HiddenProbe * probe,
                                    uint32_t n_outputs_max = 0) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) opts.n_ctx;
    cp.n_batch = (uint32_t) opts.n_ctx;
    cp.n_outputs_max = n_outputs_max;  // 0: llama.cpp's default, n_batch
    cp.n_ubatch = (uint32_t) std::min(opts.n_ctx, 512);
    cp.n_seq_max = (uint32_t) opts.n_parallel;  // each sequence gets n_ctx / n_parallel (llama.cpp's non-unified KV)
    cp.n_threads = opts.n_threads;
    opts.placement.apply(cp, opts.n_threads);
    cp.n_rs_seq = recurrent ? (uint32_t) opts.n_rs_seq : 0;
    cp.cb_eval = HiddenProbe::callback;
    cp.cb_eval_user_data = probe;
    return cp;
}

}  // namespace

uint32_t Engine::target_outputs() const {
    return std::max(output_limit(opts, (int64_t) opts.capacity + 1),
                    (uint32_t) std::min<int64_t>(opts.n_ctx, BATCH_SHIFT_ROWS_MAX));
}

void Engine::create_target_context() {
    ctx_tgt.reset(llama_init_from_model(model.get(), context_params(opts, recurrent, &probe_tgt, target_outputs())));
    if (ctx_tgt == nullptr) {
        fail(ErrorKind::LOAD, "llama.cpp could not create the target context");
    }
    if (recurrent && (int32_t) api.n_rs_seq(ctx_tgt.get()) < opts.n_rs_seq) {
        fail(ErrorKind::LOAD, "this model's recurrent layers do not support partial rollback (n_rs_seq)");
    }
    probe_tgt.node_name = "l_out-" + std::to_string(llama_model_n_layer(model.get()) - 1);
    batch_tgt.reset(llama_batch_ext_init(ctx_tgt.get()));
}

void Engine::create_mtp_context() {
    llama_context_params cm = context_params(opts, recurrent, &probe_mtp, output_limit(opts, 1));  // a row a sequence
    cm.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cm.n_rs_seq = 0;
    ctx_mtp.reset(llama_init_from_model(model.get(), cm));
    if (ctx_mtp == nullptr) {
        fail(ErrorKind::LOAD, "llama.cpp could not create the MTP context");
    }
    probe_mtp.node_name = "mtp_post_ffn-" + std::to_string(llama_model_n_layer(model.get()));
    // the MTP head takes every row's h_nextn of the target as inputs (the target's: use_nextn_rows)
    api.set_embeddings_nextn(ctx_mtp.get(), true, /*masked*/ true);
}

namespace {

// Why the draft vocabulary cannot stand for the target's, or "" when it can: llama.cpp's checks
// (common_speculative_are_compatible): the same vocabulary type, the same BOS/EOS use and ids, sizes
// within 128 of each other and the same text for every token id from 5 on.
std::string vocab_mismatch(const llama_vocab * tgt, const llama_vocab * dft) {
    if (llama_vocab_type(tgt) != llama_vocab_type(dft)) {
        return "its vocabulary type differs from the target's";
    }
    if (llama_vocab_get_add_bos(tgt) != llama_vocab_get_add_bos(dft) ||
        (llama_vocab_get_add_bos(tgt) && llama_vocab_bos(tgt) != llama_vocab_bos(dft))) {
        return "its BOS token differs from the target's";
    }
    if (llama_vocab_get_add_eos(tgt) != llama_vocab_get_add_eos(dft) ||
        (llama_vocab_get_add_eos(tgt) && llama_vocab_eos(tgt) != llama_vocab_eos(dft))) {
        return "its EOS token differs from the target's";
    }
    const int32_t n_tgt = llama_vocab_n_tokens(tgt), n_dft = llama_vocab_n_tokens(dft);
    if (std::abs(n_tgt - n_dft) > 128) {
        return "it has " + std::to_string(n_dft) + " tokens, the target " + std::to_string(n_tgt) +
               " (llama.cpp allows a difference of 128)";
    }
    for (int32_t i = 5; i < std::min(n_tgt, n_dft); ++i) {
        if (std::strcmp(llama_vocab_get_text(tgt, i), llama_vocab_get_text(dft, i)) != 0) {
            return "token " + std::to_string(i) + " is \"" + llama_vocab_get_text(dft, i) + "\", the target's \"" +
                   llama_vocab_get_text(tgt, i) + "\"";
        }
    }
    return "";
}

}  // namespace

void Engine::load_draft_model() {
    llama_model_params mp = llama_model_default_params();
    opts.placement.apply(mp);
    model_dft.reset(llama_model_load_from_file(opts.draft_path.c_str(), mp));
    if (model_dft == nullptr) {
        fail(ErrorKind::LOAD, "llama.cpp could not load the draft model " + opts.draft_path);
    }
    const std::string mismatch = vocab_mismatch(vocab, llama_model_get_vocab(model_dft.get()));
    if (!mismatch.empty()) {
        fail(ErrorKind::PARAMETER, "the draft model " + opts.draft_path + " cannot draft for this model: " + mismatch);
    }
    if (is_shared_memory_head(model_dft.get())) {
        create_shared_mtp_context();
        return;
    }
    llama_context_params cp = context_params(opts, /*recurrent*/ false, nullptr);
    cp.cb_eval = nullptr;
    head = DraftHead::of(api, model_dft.get(), opts.draft_path, llama_model_n_layer(model.get()));
    if (head.kind != DrafterNeeds::DRAFT_MODEL) {
        load_draft_head(cp);
    } else if (llama_model_is_recurrent(model_dft.get()) || llama_model_is_hybrid(model_dft.get())) {
        fail(ErrorKind::PARAMETER, "the draft model " + opts.draft_path + " is recurrent: draft-simple here needs a "
                                   "draft model whose memory can drop positions (a transformer)");
    }
    // llama.cpp's reserve for a draft context (common_base_params_to_speculative): a row a sequence, a DFlash / DSpark
    // block's n_max + 1 (libllama keeps n_batch for the architectures it runs as encoders: EAGLE-3, DFlash)
    cp.n_outputs_max = output_limit(opts, head.is_block() ? (int64_t) opts.capacity + 1 : 1);
    ctx_dft.reset(llama_init_from_model(model_dft.get(), cp));
    if (ctx_dft == nullptr) {
        head = DraftHead{};
        fail(ErrorKind::LOAD, "llama.cpp could not create the draft model's context");
    }
    if (head.kind != DrafterNeeds::DRAFT_MODEL) {  // llama.cpp's set-up of the head's context (common/speculative.cpp)
        api.set_embeddings_nextn(ctx_dft.get(), true, /*masked*/ true);
    }
    if (head.is_block()) {
        llama_set_causal_attn(ctx_dft.get(), head.causal);
    }
}

bool is_shared_memory_head(const llama_model * m) {
    char arch[64] = {0};
    llama_model_meta_val_str(m, "general.architecture", arch, sizeof(arch));
    return std::strcmp(arch, "gemma4-assistant") == 0;  // llama.cpp's one such architecture (llama-context.cpp)
}

// A head file that reads the target's memory (Gemma-4's assistant) is the MTP head of draft-mtp: its MTP context is
// created over the target's (ctx_other), as llama.cpp's common_speculative_init does for -md with draft-mtp.
void Engine::create_shared_mtp_context() {
    const std::string where = "the MTP head " + opts.draft_path + " cannot draft for this model: ";
    if (ctx_mtp) {
        fail(ErrorKind::PARAMETER, where + "the model has MTP layers of its own");
    }
    if (llama_model_n_embd_out(model_dft.get()) != llama_model_n_embd_out(model.get())) {
        fail(ErrorKind::PARAMETER, where + "it exchanges hidden states of width " +
                                       std::to_string(llama_model_n_embd_out(model_dft.get())) + ", the model's are " +
                                       std::to_string(llama_model_n_embd_out(model.get())) + " wide");
    }
    llama_context_params cm = context_params(opts, /*recurrent*/ false, nullptr, output_limit(opts, 1));
    cm.cb_eval = nullptr;
    cm.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cm.n_rs_seq = 0;
    cm.ctx_other = ctx_tgt.get();
    ctx_mtp.reset(llama_init_from_model(model_dft.get(), cm));
    if (ctx_mtp == nullptr) {
        fail(ErrorKind::LOAD, "llama.cpp could not create the MTP head's context over the model's (" +
                                  opts.draft_path + ")");
    }
    api.set_embeddings_nextn(ctx_mtp.get(), true, /*masked*/ true);  // the target's: use_nextn_rows
}

void Engine::load_draft_head(llama_context_params & cp) {
    const std::string hidden = meta_text(model_dft.get(), "eagle3.target_hidden_size");
    const std::string refusal = head.refusal(arch(), llama_model_n_embd(model.get()), llama_model_n_embd(model_dft.get()),
                                             hidden.empty() ? -1 : std::atoi(hidden.c_str()), has_mtp());
    if (!refusal.empty()) {
        const char * what = head.kind == DrafterNeeds::EAGLE3_HEAD ? "EAGLE-3 head " : "DFlash / DSpark head ";
        head = DraftHead{};
        fail(ErrorKind::PARAMETER, std::string("the ") + what + opts.draft_path + " cannot draft for this model: " + refusal);
    }
    cp.ctx_other = ctx_tgt.get();  // a head without token_embd / output borrows the target's (as llama.cpp's set-up)
}

int32_t Engine::mtp_head_limit() const {
    const int32_t n_heads = ctx_mtp ? api.model_n_layer_nextn(model.get()) : 0;
    return n_heads > 1 ? n_heads : 0;
}

bool Engine::can_run(DrafterId id) const {
    switch (DRAFTER_TABLE[id].needs) {
        case DrafterNeeds::MTP:
            return has_mtp();
        case DrafterNeeds::DRAFT_MODEL:
        case DrafterNeeds::EAGLE3_HEAD:
        case DrafterNeeds::DFLASH_HEAD:
        case DrafterNeeds::DSPARK_HEAD:
            return draft_kind() == DRAFTER_TABLE[id].needs;
        case DrafterNeeds::NOTHING:
            break;
    }
    return true;
}

void Engine::close() {
    cancel_requested.store(true);
    std::lock_guard<std::mutex> lk(run_mutex);
    active.clear();
    std::fill(slots.begin(), slots.end(), nullptr);
    reqs.clear();
    batch_tgt.reset();
    ctx_dft.reset();
    ctx_mtp.reset();
    ctx_tgt.reset();
    model_dft.reset();
    head = DraftHead{};
    model.reset();
    cancel_requested.store(false);
}

void Engine::check_open() const {
    if (model == nullptr) {
        fail(ErrorKind::CLOSED, "the session is closed");
    }
}

// ---- model facts and tokens ---------------------------------------------------------------------

int32_t Engine::n_vocab() const { check_open(); return llama_vocab_n_tokens(vocab); }
std::vector<llama_token> Engine::eog_tokens() const { check_open(); return lookup_vocab.eog; }
int32_t Engine::n_embd() const { check_open(); return llama_model_n_embd(model.get()); }
int32_t Engine::n_ctx() const { check_open(); return (int32_t) llama_n_ctx(ctx_tgt.get()); }
int32_t Engine::n_ctx_seq() const { check_open(); return (int32_t) llama_n_ctx_seq(ctx_tgt.get()); }
int32_t Engine::rs_slots() const { check_open(); return (int32_t) api.n_rs_seq(ctx_tgt.get()); }
bool Engine::is_eog(llama_token t) const { check_open(); return llama_vocab_is_eog(vocab, t); }
llama_token Engine::eos() const { check_open(); return llama_vocab_eos(vocab); }

namespace {

// Calls `call(out)` (a llama.cpp function that writes into `out` and returns the count, or minus the
// size it needs) once more with `out` grown if it was too small, and trims `out` to the count.
template <typename Buffer, typename Call>
void fill_growing(Buffer & out, Call && call) {
    int32_t n = call(out);
    if (n < 0) {
        out.resize(-n);
        n = call(out);
    }
    out.resize(std::max(n, 0));
}

}  // namespace

std::vector<llama_token> Engine::tokenize(const std::string & text, bool add_special) const {
    check_open();
    std::vector<llama_token> out(text.size() + 8);
    fill_growing(out, [&](std::vector<llama_token> & buf) {
        return llama_tokenize(vocab, text.data(), (int32_t) text.size(), buf.data(), (int32_t) buf.size(),
                              add_special, /*parse_special*/ false);
    });
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
    fill_growing(out, [&](std::string & buf) {
        return llama_detokenize(vocab, tokens.data(), (int32_t) tokens.size(), buf.data(), (int32_t) buf.size(),
                                /*remove_special*/ false, /*unparse_special*/ false);
    });
    return out;
}

// ---- parameters ---------------------------------------------------------------------------------

void Engine::validate(const DraftParams & p) const {
    if (p.n_max < 0 || p.n_max > opts.capacity) {
        fail(ErrorKind::PARAMETER, "n_max must be between 0 and the session's capacity " +
                                       std::to_string(opts.capacity) + ", got " + std::to_string(p.n_max));
    }
    if (!(p.p_min >= 0.0f && p.p_min <= 1.0f)) {
        fail(ErrorKind::PARAMETER, "p_min must be in [0, 1]");
    }
    if (p.n_min < 0 || p.n_min > p.n_max) {
        fail(ErrorKind::PARAMETER, "n_min must be between 0 and n_max");
    }
}

void Engine::validate_chain(const DrafterChain & c, const DraftParams & p) const {
    for (const DrafterId id : c.ids) {
        if (checkpoints() && gets_snapshot_slots(DRAFTER_TABLE[id].needs)) {
            fail(ErrorKind::PARAMETER, std::string("\"") + drafter_name(id) + "\" needs the target's snapshot slots "
                                       "(llama.cpp gives them for draft-mtp, draft-eagle3, draft-dflash and "
                                       "draft-dspark): this session has none (n_rs_seq=0), so it runs the look-ups "
                                       "and draft-simple only");
        }
        if (DRAFTER_TABLE[id].needs == DrafterNeeds::DSPARK_HEAD && p.p_min > 0.0f && can_run(id) && !head.has_confidence) {
            fail(ErrorKind::PARAMETER, "this DSpark head has no confidence head, which p_min is compared with: set "
                                       "p_min to 0 (llama.cpp refuses it too)");
        }
        if (p.n_max <= 0 || can_run(id)) {
            continue;
        }
        if (DRAFTER_TABLE[id].needs == DrafterNeeds::MTP) {
            fail(ErrorKind::PARAMETER, "the model has no MTP layers: use n_max=0 (or the n-gram drafter)");
        }
        // "needs a draft_model / an eagle3_head / a dflash_head, and this session's draft model is a dflash_head"
        const std::string need = DRAFTER_NEEDS_NAMES[(int) DRAFTER_TABLE[id].needs];
        fail(ErrorKind::PARAMETER, std::string("the drafter \"") + DRAFTER_TABLE[id].name + "\" needs a draft model of kind " +
                                       need + (has_draft_model() ? std::string(", and this session's is a ") +
                                                                       DRAFTER_NEEDS_NAMES[(int) draft_kind()]
                                                                 : std::string(": Session.open(path, draft_model=...)")));
    }
}

void Engine::set_params(const DraftParams & p) {
    check_open();
    validate(p);
    std::lock_guard<std::mutex> lk(params_mutex);
    for (const auto & q : reqs) {
        validate_chain(q->chain, p);
    }
    for (auto & q : reqs) {
        q->params = p;
    }
}

DraftParams Engine::params() const {
    std::lock_guard<std::mutex> lk(params_mutex);
    return reqs.empty() ? DraftParams{} : reqs.front()->params;
}

const Sequence & Engine::request(size_t i) const {
    if (i >= reqs.size()) {
        fail(ErrorKind::PARAMETER, "no request " + std::to_string(i) + ": the generation has " +
                                       std::to_string(reqs.size()));
    }
    return *reqs[i];
}

// ---- the start of a generation ------------------------------------------------------------------

namespace {

// how an error message names request i of n: "the " alone, "request 2: the " among several
std::string request_label(size_t i, size_t n) {
    return n == 1 ? "the " : "request " + std::to_string(i) + ": the ";
}

}  // namespace

void Engine::validate_request(const Request & r, size_t i, size_t n) const {
    const std::string which = request_label(i, n);
    const int32_t N = (int32_t) r.prompt.size();
    if (N == 0) {
        fail(ErrorKind::PARAMETER, which + "prompt is empty");
    }
    if (N > n_ctx_seq()) {
        fail(ErrorKind::CONTEXT, which + "prompt has " + std::to_string(N) + " tokens but a sequence's context holds " +
                                     std::to_string(n_ctx_seq()) + " (n_ctx " + std::to_string(n_ctx()) + " / n_parallel " +
                                     std::to_string(opts.n_parallel) + ")");
    }
    if (r.config.max_tokens < 1) {
        fail(ErrorKind::PARAMETER, which + "max_tokens must be at least 1");
    }
    parse_schedule(r.config.schedule, r.config.window);
    if (N + r.config.max_tokens > n_ctx_seq() && opts.n_parallel > 1) {
        fail(ErrorKind::CONTEXT, which + "prompt (" + std::to_string(N) + " tokens) and max_tokens (" +
                                     std::to_string(r.config.max_tokens) + ") exceed a sequence's context of " +
                                     std::to_string(n_ctx_seq()) + " (n_ctx " + std::to_string(n_ctx()) + " / n_parallel " +
                                     std::to_string(opts.n_parallel) + ")");
    }
    if (r.arrival < 0) {
        fail(ErrorKind::PARAMETER, which + "arrival step must be at least 0, got " + std::to_string(r.arrival));
    }
}

// llama.cpp's target context outputs h_nextn unmasked (every row of a batch: the MTP catch-up takes them all) and keeps
// n_batch of them in its output buffer, which it reallocates and clears whenever a decode has more outputs than any
// before (2 MB on the bundled model): without an MTP head in the chain neither is needed, as in llama.cpp
void Engine::use_nextn_rows(bool on) {
    if (!has_mtp() || on == nextn_on) {
        return;
    }
    api.set_embeddings_nextn(ctx_tgt.get(), on, /*masked*/ false);
    nextn_on = on;
}

void Engine::begin(const std::vector<llama_token> & prompt, const GenerationConfig & c, const DraftParams & p) {
    begin_requests({Request{prompt, c, p, 0}});
}

void Engine::begin_requests(const std::vector<Request> & requests) {
    std::lock_guard<std::mutex> lk(run_mutex);
    ClockScope clock(opts.cpu_clock);
    check_open();
    if (requests.empty()) {
        fail(ErrorKind::PARAMETER, "no requests");
    }
    std::vector<std::unique_ptr<Sequence>> made;
    for (size_t i = 0; i < requests.size(); ++i) {
        const Request & r = requests[i];
        const DrafterChain parsed = parse_chain(r.config);
        validate(r.params);
        validate_chain(parsed, r.params);
        validate_request(r, i, requests.size());
        made.push_back(std::make_unique<Sequence>((int32_t) i, r, parsed, opts.capacity, opts.topk));
        Sequence & q = *made.back();
        q.drafters = build_drafters(parsed, q.request.config.options);
        for (auto & d : q.drafters) {
            q.needs |= d->features();
        }
    }
    FeatureNeeds all;
    for (const auto & q : made) {
        all |= q->needs;
    }
    use_layer_inputs(all.layer_inp);  // refused here, before anything changes, where the model cannot give them
    use_nextn_rows(all.nextn);
    {
        std::lock_guard<std::mutex> plk(params_mutex);
        std::fill(slots.begin(), slots.end(), nullptr);
        reqs = std::move(made);
    }
    cancel_requested.store(false);
    batch_index = 0;
    clear_memories();
    admit(0);
}

std::vector<std::unique_ptr<Drafter>> Engine::build_drafters(const DrafterChain & c, const DrafterOptions & options) {
    DrafterSetup setup;
    setup.lookup_vocab = &lookup_vocab;
    setup.options = &options;
    setup.api = &api;
    setup.ctx_mtp = ctx_mtp.get();
    setup.probe_mtp = &probe_mtp;
    setup.ctx_dft = ctx_dft.get();
    setup.head = &head;
    std::vector<std::unique_ptr<Drafter>> built;
    for (const DrafterId id : c.ids) {
        const DrafterEntry & entry = DRAFTER_TABLE[id];
        if (!can_run(id)) {
            continue;  // n_max is 0 (validate_chain): nothing to draft, nothing to follow
        }
        setup.id = id;
        built.push_back(entry.make(setup));
        if (built.back() == nullptr || built.back()->id != id) {
            fail(ErrorKind::PARAMETER, std::string("the drafter \"") + entry.name + "\" could not be made");
        }
    }
    return built;
}
