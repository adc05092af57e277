// The MTP speculative-decoding engine: one model, a target context and an MTP draft context,
// a single sequence, and per-step telemetry.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hidden_probe.h"
#include "llama.h"
#include "mtp_drafter.h"
#include "nextn_api.h"
#include "ngram_drafter.h"
#include "oracle.h"
#include "telemetry.h"

struct EngineOptions {
    std::string path;
    int32_t n_ctx = 4096;
    int32_t n_threads = 0;      // 0: hardware concurrency
    int32_t n_rs_seq = 8;       // recurrent snapshot slots = largest n_max the session accepts
    int32_t topk = 5;           // top-k alternatives recorded per draft depth
    bool telemetry = true;
    bool cpu_clock = false;     // time phases with the thread's CPU time instead of the wall clock
};

// Live-tunable drafting parameters: set_params() takes effect at the next step.
struct DraftParams {
    int32_t n_max = 3;
    float p_min = 0.0f;
    int32_t n_min = 0;
};

// Which drafter proposes: the MTP head, the n-gram prompt look-up, or both asked every step and
// the draft with the highest expected accepted length verified (chain).
enum DrafterMode : int8_t {
    MODE_MTP = 0,
    MODE_NGRAM = 1,
    MODE_CHAIN = 2,
};

// The per-step `drafter` column: whose draft was verified (-1: none).
enum DraftSource : int8_t {
    SOURCE_NONE = -1,
    SOURCE_MTP = 0,
    SOURCE_NGRAM = 1,
    N_SOURCES = 2,
};

struct GenerationConfig {
    int32_t max_tokens = 128;
    float temperature = 0.0f;
    uint32_t seed = 0;
    DrafterMode mode = MODE_MTP;
    NgramConfig ngram;
};

enum FinishReason : int8_t {
    FINISH_NONE = -1,       // still running
    FINISH_BUDGET = 0,
    FINISH_EOS = 1,
    FINISH_CONTEXT = 2,
    FINISH_CANCELLED = 3,
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
    // position it also records the MTP draft chain of length `depth` (p_min = 0) and the n-gram
    // draft the engine would propose there, and measures this machine's cost model (see oracle.h).
    // Returns false if cancelled.
    bool record_oracle(const std::vector<llama_token> & prompt, int32_t max_tokens, int32_t depth,
                       const NgramConfig & ngram, bool probe, OracleRecord & out);
    void set_params(const DraftParams & p);
    DraftParams params() const;
    void cancel() { cancel_requested.store(true); }
    void set_telemetry(bool on) { opts.telemetry = on; }
    bool telemetry() const { return opts.telemetry; }

    const EngineOptions & options() const { return opts; }

    Telemetry tel;
    std::vector<llama_token> generated;
    FinishReason finish = FINISH_NONE;
    int64_t t_prefill_ns = 0;
    int32_t n_prompt = 0;
    mutable std::mutex run_mutex;  // held by begin, step, close and the telemetry readers

  private:
    void check_open() const;
    void validate(const DraftParams & p) const;
    llama_token sample(int32_t row);
    // Decodes tokens[0 .. n) on the target at positions pos0 .., with logits for every row and, while
    // telemetry is on, the hidden probe observing; returns llama_process's code.
    int32_t decode_target(const llama_token * tokens, int32_t n, llama_pos pos0);
    void finish_with(FinishReason r) { finish = r; }
    void validate_mode(DrafterMode mode, const DraftParams & p) const;
    void check_finish(llama_token last);

    EngineOptions opts;
    NextnApi api;
    llama_model * model = nullptr;
    llama_context * ctx_tgt = nullptr;
    llama_context * ctx_mtp = nullptr;
    const llama_vocab * vocab = nullptr;
    llama_batch_ext * batch_tgt = nullptr;
    llama_sampler * smpl = nullptr;   // temperature > 0 only
    std::unique_ptr<MtpDrafter> drafter;
    std::unique_ptr<NgramDrafter> ngram;
    HiddenProbe probe_tgt, probe_mtp;
    int32_t layer_nextn = 0;
    bool recurrent = false;

    mutable std::mutex params_mutex;
    DraftParams live;
    std::atomic<bool> cancel_requested{false};

    GenerationConfig cfg;
    llama_token id_last = -1;
    llama_pos n_past = 0;
    int32_t n_step = 0;
    Draft draft_buf, ngram_buf;
    std::vector<llama_token> verify_tokens;
    std::vector<llama_token> tokens_all;   // prompt + generated: the history the n-gram drafter searches
    std::vector<float> probe_rows;         // oracle: scratch for the probe's nextn rows
};
