// The speculative-decoding engine: one model, a target context and (if the model has MTP layers)
// an MTP draft context, a single sequence, an ordered chain of drafters per generation and
// per-step telemetry.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "draft.h"
#include "drafter.h"
#include "hidden_probe.h"
#include "llama-cpp.h"
#include "llama.h"
#include "mtp_drafter.h"
#include "nextn_api.h"
#include "oracle.h"
#include "placement.h"
#include "telemetry.h"

// The index of the largest of n_vocab logits (greedy sampling).
llama_token argmax(const float * logits, int32_t n_vocab);

struct EngineOptions {
    std::string path;
    std::string draft_path;     // a draft model for draft-simple (llama.cpp's -md); empty: none
    int32_t n_ctx = 4096;
    int32_t n_threads = 0;      // 0: hardware concurrency
    int32_t n_rs_seq = 8;       // recurrent snapshot slots = largest n_max the session accepts
    int32_t topk = 5;           // top-k alternatives recorded per draft depth
    bool telemetry = true;
    bool cpu_clock = false;     // time phases with the thread's CPU time instead of the wall clock
    Placement placement;        // devices, load mode, attention and KV cache: both contexts share them
};

struct GenerationConfig {
    int32_t max_tokens = 128;
    float temperature = 0.0f;
    uint32_t seed = 0;
    // names of DRAFTER_TABLE, in chain order: "mtp" = [mtp], "ngram" = [ngram], a chain = several
    std::vector<std::string> drafters{drafter_name(DRAFTER_MTP)};
    std::string chain_policy = CHAIN_POLICY_NAMES[(int) ChainPolicy::FIRST];
    DrafterOptions options;  // every drafter's options by keyword (each drafter reads its own keys)
};

// A GenerationConfig's drafter list and policy, parsed (parse_chain throws a parameter error on
// an unknown or repeated name, or an empty list).
struct DrafterChain {
    std::vector<DrafterId> ids{DRAFTER_MTP};
    ChainPolicy policy = ChainPolicy::FIRST;

    bool has(DrafterId id) const;
};
DrafterChain parse_chain(const GenerationConfig & cfg);

enum FinishReason : int8_t {
    FINISH_NONE = -1,       // still running
    FINISH_BUDGET = 0,
    FINISH_EOS = 1,
    FINISH_CONTEXT = 2,
    FINISH_CANCELLED = 3,
};
constexpr const char * FINISH_REASON_NAMES[] = {"budget", "eos", "context", "cancelled"};
static_assert(count_of(FINISH_REASON_NAMES) == FINISH_CANCELLED + 1, "one name per FinishReason");

// One step of Engine::step, handed from phase to phase.
struct StepState {
    // cap
    DraftParams p;
    int32_t n_cap = 0;                   // how far this step may draft
    StopReason cap_reason = STOP_N_MAX;
    bool drafting_mtp = false;           // the MTP head drafts (and catches up) this step
    // choose
    const Draft * chosen = nullptr;      // the draft verified (an empty one when none is usable)
    DrafterId source = DRAFTER_NONE;
    double expected = 0.0;               // the source's expected accepted length
    int32_t n_d = 0;                     // tokens verified
    // accept / rollback
    int32_t n_acc = 0;
    llama_token correction = -1;
    int32_t n_rollback = 0;
    llama_pos keep_until = 0;
    // timings
    int64_t t_draft0 = 0, t_catchup_ns = 0, t_draft_ns = 0, t_verify_ns = 0, t_sample_ns = 0;
};

struct Engine {
    explicit Engine(const EngineOptions & opts);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    void close();
    bool closed() const { return model == nullptr; }

    // model facts
    int32_t n_vocab() const;
    int32_t n_embd() const;
    int32_t n_layer_nextn() const { return layer_nextn; }
    bool has_mtp() const { return ctx_mtp != nullptr; }
    bool has_draft_model() const { return ctx_dft != nullptr; }
    // whether this session has what the drafter `id` needs
    bool can_run(DrafterId id) const;
    bool is_recurrent() const { return recurrent; }
    int32_t n_ctx() const;
    int32_t capacity() const { return opts.n_rs_seq; }
    int32_t rs_slots() const;  // snapshot slots the target context really has (0 if non-recurrent)
    bool is_eog(llama_token t) const;
    llama_token eos() const;

    std::vector<llama_token> tokenize(const std::string & text, bool add_special) const;
    std::string detokenize(const std::vector<llama_token> & tokens) const;
    std::string piece(llama_token t) const;

    // generation
    void begin(const std::vector<llama_token> & prompt, const GenerationConfig & cfg, const DraftParams & p);
    bool step();    // one draft + verify step; false once the generation has finished
    void run();     // steps until finished or cancelled

    // Oracle mode (greedy, outside the normal path): plain decoding one token per step; at every
    // position it also records the draft every drafter would propose there (up to `depth` tokens,
    // p_min = 0; drafters that need MTP layers only on a model with them), and measures this
    // machine's cost model (see oracle.h). Returns false if cancelled.
    bool record_oracle(const std::vector<llama_token> & prompt, int32_t max_tokens, int32_t depth,
                       const DrafterOptions & options, bool probe, OracleRecord & out);
    void set_params(const DraftParams & p);
    DraftParams params() const;
    void cancel() { cancel_requested.store(true); }
    void set_telemetry(bool on) { opts.telemetry = on; }
    bool telemetry() const { return opts.telemetry; }

    const EngineOptions & options() const { return opts; }
    // the drafters of the current (or last) generation, in chain order
    const std::vector<std::unique_ptr<Drafter>> & chain_drafters() const { return drafters; }

    Telemetry tel;
    std::vector<llama_token> generated;
    FinishReason finish = FINISH_NONE;
    int64_t t_prefill_ns = 0;
    int32_t n_prompt = 0;
    mutable std::mutex run_mutex;  // held by begin, step, close and the telemetry readers

  private:
    // set-up (engine.cpp)
    void load_model();
    void create_target_context();
    void create_mtp_context();
    void load_draft_model();    // the draft model and its context (opts.draft_path), checked against the target
    void check_open() const;
    void validate(const DraftParams & p) const;
    void validate_chain(const DrafterChain & c, const DraftParams & p) const;
    void validate_generation(const std::vector<llama_token> & prompt, const GenerationConfig & c) const;
    // the chain's drafters, made by their factories (throws on a bad option; the engine is untouched)
    std::vector<std::unique_ptr<Drafter>> build_drafters(const DrafterChain & c, const DrafterOptions & options);
    void install_drafters(std::vector<std::unique_ptr<Drafter>> built);
    void build_sampler();
    void prefill(const std::vector<llama_token> & prompt, const DraftParams & p);

    // the phases of step() (step.cpp)
    StepState cap() const;
    DraftRequest request(const StepState & s, bool oracle) const;
    void propose(StepState & s);
    void choose(StepState & s);
    void choose_first(StepState & s) const;
    void choose_best(StepState & s) const;
    void verify(StepState & s);
    void accept_or_rollback(StepState & s);
    void sample_verified(StepState & s);
    void tell_drafters(const StepState & s);
    void record(const StepState & s);
    void record_draft(const StepState & s, size_t r);
    void check_finish(llama_token last);
    llama_token sample(int32_t row);
    // Decodes tokens[0 .. n) on the target at positions pos0 .., with logits for every row and, while
    // telemetry is on, the hidden probe observing; returns llama_process's code.
    int32_t decode_target(const llama_token * tokens, int32_t n, llama_pos pos0);
    // Every drafter of the chain observes the target's decode of tokens[0 .. n) at pos0 ..; returns the
    // time a draft model took to decode the batch (catch-up time; the MTP head only keeps its rows here).
    int64_t follow_target(const llama_token * tokens, int32_t n, llama_pos pos0);

    // the phases of record_oracle() (oracle.cpp)
    std::vector<std::string> oracle_drafters() const;
    void record_drafts(OracleRecord & out, size_t r, int32_t n_cap);
    void record_draft(OracleRecord & out, size_t r, const Drafter & d, const Draft & draft, int64_t t_ns) const;
    void probe_costs(OracleRecord & out, size_t r, bool probe);
    void probe_once(OracleRecord & out, size_t r, int32_t k, int32_t rep);
    void plain_step(OracleRecord & out, size_t r);
    void tail(OracleRecord & out);

    EngineOptions opts;
    NextnApi api;
    HiddenProbe probe_tgt, probe_mtp;   // observed by the contexts: declared (so destroyed) around them
    // owned llama.cpp objects, released in reverse order: drafters, sampler, batch, contexts, models
    llama_model_ptr model;
    llama_model_ptr model_dft;          // the draft model (null: none)
    llama_context_ptr ctx_tgt;
    llama_context_ptr ctx_mtp;          // null if the model has no MTP layers
    llama_context_ptr ctx_dft;          // the draft model's context (null: none)
    llama_batch_ext_ptr batch_tgt;
    llama_sampler_ptr smpl;             // temperature > 0 only
    std::vector<std::unique_ptr<Drafter>> drafters;  // this generation's chain, in order
    MtpDrafter * mtp = nullptr;         // the chain's MTP drafter, if any: it follows the target
    const llama_vocab * vocab = nullptr;
    int32_t layer_nextn = 0;
    bool recurrent = false;

    mutable std::mutex params_mutex;
    DraftParams live;
    std::atomic<bool> cancel_requested{false};

    GenerationConfig cfg;
    DrafterChain chain;
    llama_token id_last = -1;
    llama_pos n_past = 0;
    int32_t n_step = 0;
    DrafterId last_verified = DRAFTER_NONE;  // whose draft was verified last (llama.cpp's impl_last): told each outcome
    std::vector<llama_token> tokens_all;   // prompt + generated: the history the n-gram drafter searches

    // step scratch, N_DRAFTERS entries each
    std::vector<Draft> candidates;         // each drafter's proposal this step, by DrafterId
    std::vector<uint8_t> asked;            // it took part
    std::vector<double> expected;          // its expected accepted length
    std::vector<llama_token> verify_tokens;
    std::vector<llama_token> target_row;   // the target's token at each verified row

    // oracle scratch
    std::vector<Draft> oracle_drafts;      // each drafter's last oracle draft, by DrafterId (the probe uses the MTP chain)
    std::vector<uint8_t> saved_state;      // the target's recurrent state, restored after each probe
    std::vector<llama_token> probe_tokens;
    std::vector<float> probe_rows;         // the probe's nextn rows
};
