// The speculative-decoding engine: one model, a target context and (if the model has MTP layers)
// an MTP draft context, n_parallel sequences (llama.cpp's -np: server slots), an ordered chain of
// drafters per request and per-step telemetry. Every step drafts for all active sequences (the MTP
// head's decodes batched depth by depth across them) and verifies all their drafts in one target
// batch. A single generation is one request on sequence 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "batch_shift.h"
#include "draft.h"
#include "draft_head.h"
#include "drafter.h"
#include "hidden_probe.h"
#include "logits_scan.h"
#include "lookup_vocab.h"
#include "llama-cpp.h"
#include "llama.h"

#include "nextn_api.h"
#include "oracle.h"
#include "placement.h"
#include "sequence.h"
#include "telemetry.h"

// How much a generation records: nothing per step (OFF: the request's totals only, llama.cpp's loop alone),
// a row per step (STEPS: counts, settings, stop reasons, batch shape, phase times), or every per-depth detail
// too (FULL: top-k alternatives, confidences beyond the draft's, target tokens past a rejection, hidden-state
// norms and the draft/target cosine).
enum class TelemetryLevel : int32_t { OFF = 0, STEPS = 1, FULL = 2 };
constexpr const char * TELEMETRY_LEVEL_NAMES[] = {"off", "steps", "full"};
constexpr int32_t SERVER_N_BATCH = 2048;  // llama-server's default -b, the most tokens of one of its prompt batches

// A head file that reads its target's memory through ctx_other (llama.cpp: gemma4-assistant).
bool is_shared_memory_head(const llama_model * m);
std::vector<int32_t> server_prompt_chunks(int32_t n, int32_t n_batch, int32_t n_ubatch, bool checkpoints);
static_assert(count_of(TELEMETRY_LEVEL_NAMES) == (size_t) TelemetryLevel::FULL + 1, "one name per level");

struct EngineOptions {
    std::string path;
    std::string draft_path;     // a draft model for draft-simple (llama.cpp's -md); empty: none
    int32_t n_ctx = 4096;
    int32_t n_threads = 0;      // 0: hardware concurrency
    int32_t n_rs_seq = 8;       // recurrent snapshot slots per sequence (0 on a recurrent target: checkpoints)
    int32_t capacity = 0;       // largest n_max the session accepts (0: n_rs_seq); at most n_rs_seq where slots roll back
    int32_t n_parallel = 1;     // sequences (llama.cpp's -np); n_ctx is shared among them as llama.cpp splits it
    int32_t topk = 5;           // top-k alternatives recorded per draft depth
    TelemetryLevel telemetry = TelemetryLevel::FULL;
    bool cpu_clock = false;     // time phases with the thread's CPU time instead of the wall clock
    Placement placement;        // devices, load mode, attention and KV cache: both contexts share them
};

struct Engine {
    explicit Engine(const EngineOptions & opts);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    void close();
    bool closed() const { return model == nullptr; }

    // the inputs of the target's trunk `layers` (layer_inputs.h) for every token of `tokens` decoded from an
    // empty memory, into out: one row per token of layers.size() * n_embd floats, the layers side by side.
    // Ends any generation in progress; refuses an architecture or layer that cannot give them (a PARAMETER
    // error, never llama.cpp's abort).
    void probe_layer_inputs(const std::vector<llama_token> & tokens, const std::vector<int32_t> & layers,
                            std::vector<float> & out);

    // model facts
    std::string arch() const;  // general.architecture
    int32_t n_vocab() const;
    std::vector<llama_token> eog_tokens() const;  // every end-of-generation token of the vocabulary, ascending
    int32_t n_embd() const;
    // the width of the target's extracted feature rows (its nextn rows: llama_model_n_embd_out)
    int32_t n_feature_embd() const { return llama_model_n_embd_out(model.get()); }
    int32_t n_layer_nextn() const { return layer_nextn; }
    bool has_mtp() const { return ctx_mtp != nullptr; }
    bool has_draft_model() const { return ctx_dft != nullptr; }
    // what the session's draft model serves: DRAFT_MODEL, EAGLE3_HEAD, DFLASH_HEAD (draft_head.h), or NOTHING
    DrafterNeeds draft_kind() const { return has_draft_model() ? head.kind : DrafterNeeds::NOTHING; }
    // a non-causal DFlash / DSpark head's most draft tokens (every slot of its block sees the others, so a draft
    // depends on the block's length); 0 for any other draft model or none
    int32_t draft_block_limit() const {
        return head.is_block() && has_draft_model() && !head.causal ? head.draft_limit() : 0;
    }
    // chained MTP heads' most draft tokens (llama.cpp caps n_max at the heads); 0 for a single head or none
    int32_t mtp_head_limit() const;
    // whether this session has what the drafter `id` needs
    bool can_run(DrafterId id) const;
    bool is_recurrent() const { return recurrent; }
    int32_t n_ctx() const;      // the whole context (all sequences)
    int32_t n_ctx_seq() const;  // one sequence's share of it
    int32_t n_parallel() const { return opts.n_parallel; }
    int32_t capacity() const { return opts.capacity; }
    // the outputs a target decode may have (its context's n_outputs_max): llama.cpp's verify rows, n_parallel x
    // (capacity + 1), and at least the batch-shape probe's widest batch
    uint32_t target_outputs() const;
    // a recurrent target without snapshot slots: a partial acceptance restores the checkpoint saved before its
    // verify and the accepted tokens and the correction are verified again next step (llama.cpp's use_ckpt_tgt)
    bool checkpoints() const { return recurrent && opts.n_rs_seq == 0; }
    int32_t rs_slots() const;  // snapshot slots the target context really has per sequence (0 if non-recurrent)
    bool is_eog(llama_token t) const;
    llama_token eos() const;

    std::vector<llama_token> tokenize(const std::string & text, bool add_special) const;
    std::string detokenize(const std::vector<llama_token> & tokens) const;
    std::string piece(llama_token t) const;

    // generation: one request (sequence 0), or several sharing the steps
    void begin(const std::vector<llama_token> & prompt, const GenerationConfig & cfg, const DraftParams & p);
    // Requests arriving at their `arrival` step take free sequences (waiting for one when all are busy)
    // and leave when they finish. Throws a parameter error, touching nothing, on a bad request.
    void begin_requests(const std::vector<Request> & requests);
    bool step();    // one draft + verify step of every active sequence; false once every request has finished
    void run();     // steps until finished or cancelled

    // Oracle mode (greedy, outside the normal path): plain decoding one token per step; at every
    // position it also records the draft every drafter would propose there (up to `depth` tokens,
    // p_min = 0; drafters that need MTP layers only on a model with them), and measures this
    // machine's cost model (see oracle.h). Returns false if cancelled.
    bool record_oracle(const std::vector<llama_token> & prompt, int32_t max_tokens, int32_t depth,
                       const DrafterOptions & options, bool probe, OracleRecord & out);
    // Decodes `tokens` on the target context one row per decode, then in batches of each of `ks` rows, and
    // records how far each position's logits moved (batch_shift.h). Ends any generation in progress (its
    // requests finish as cancelled) and leaves the memories empty.
    void probe_batch_shift(const std::vector<llama_token> & tokens, const std::vector<int32_t> & ks,
                           BatchShiftRecord & out);
    void set_params(const DraftParams & p);
    DraftParams params() const;
    void cancel() { cancel_requested.store(true); }
    // Asked between steps by run and record_oracle, and between decodes by the probes, while they hold run_mutex:
    // true stops them as cancel() does (a probe or a prompt's decode throws an INTERRUPTED EngineError). Empty: never asked.
    void set_interrupt_check(std::function<bool()> check) { interrupt_check = std::move(check); }
    void set_telemetry(TelemetryLevel level) { opts.telemetry = level; }
    TelemetryLevel telemetry() const { return opts.telemetry; }
    bool full_telemetry() const { return opts.telemetry == TelemetryLevel::FULL; }

    const EngineOptions & options() const { return opts; }

    // the requests of the current (or last) generation; request 0 is a single generation's
    const std::vector<std::unique_ptr<Sequence>> & requests() const { return reqs; }
    const Sequence & request(size_t i) const;
    // request 0's telemetry, tokens and finish (a single generation's)
    const Telemetry & tel() const { return request(0).tel; }
    const std::vector<llama_token> & generated() const { return request(0).generated; }
    FinishReason finish() const { return request(0).finish; }
    int64_t t_prefill_ns() const { return request(0).t_prefill_ns; }
    int32_t n_prompt() const { return (int32_t) request(0).request.prompt.size(); }
    mutable std::mutex run_mutex;  // held by begin, step, close and the telemetry readers

  private:
    // set-up (engine.cpp)
    void load_model();
    void create_target_context();
    void create_mtp_context();
    void create_shared_mtp_context();  // a head file that reads the target's memory (llama.cpp's is_mem_shared)
    void load_draft_model();    // the draft model and its context (opts.draft_path), checked against the target
    // a draft head (draft_head.h): checked against the target (a PARAMETER error where llama.cpp would abort or read
    // garbage), its context made to borrow the target's embeddings and output
    void load_draft_head(llama_context_params & cp);
    void check_open() const;
    void validate(const DraftParams & p) const;
    void validate_chain(const DrafterChain & c, const DraftParams & p) const;
    void validate_request(const Request & r, size_t i, size_t n) const;
    // the chain's drafters, made by their factories (throws on a bad option; the engine is untouched)
    std::vector<std::unique_ptr<Drafter>> build_drafters(const DrafterChain & c, const DrafterOptions & options);

    // requests and slots (requests.cpp)
    void clear_memories();
    void end_generations();                // every running request cancelled, every sequence released
    // the target context outputs the inputs of exactly `layers` (checked first: layer_input_refusal), the ones it
    // output before turned off
    void use_layer_inputs(const std::vector<int32_t> & layers);
    // the target context hands its MTP head every row's h_nextn only where `on` (a generation with a drafter that
    // reads them), as llama.cpp's target gets them only with draft-mtp in the chain
    void use_nextn_rows(bool on);
    void admit(int32_t step);              // waiting requests that have arrived take free sequences
    void prefill(Sequence & q);            // its prompt but what its first step decodes, every drafter begun
    void release(Sequence & q);            // a finished request leaves its sequence
    int32_t next_arrival() const;

    // the phases of step() (step.cpp)
    void cap(Sequence & q) const;
    DraftRequest draft_request(const Sequence & q, bool oracle) const;
    void propose(std::vector<Sequence *> & batch, BatchStep & b);
    void ask_drafter(Sequence & q, Drafter & d, const DraftRequest & req);
    // the drafters of one kind that draft together (DrafterEntry::draft_together), from every sequence of the
    // batch still asking, in one batched draft; each drafter's time is the batch's
    void draft_together(DrafterId id, const std::vector<Sequence *> & batch, const std::vector<DraftRequest> & reqs,
                        BatchStep & b);
    void choose(Sequence & q);
    void choose_first(Sequence & q) const;
    void choose_best(Sequence & q) const;
    void verify(std::vector<Sequence *> & batch, BatchStep & b);
    // The drafters of the sequences drafting this step decode what they queued while following the target,
    // each kind together (queued_only: only those with rows queued). Returns whether any did.
    bool catch_up(const std::vector<Sequence *> & batch, bool queued_only);
    // The same for a list of drafters of any kinds, grouped by kind; throws on a decode failure.
    void catch_up_drafters(const std::vector<Drafter *> & drafters, const char * what);
    // q's drafters, as a list (in seq_drafters)
    const std::vector<Drafter *> & drafters_of(Sequence & q);
    void accept_or_rollback(Sequence & q);
    void sample_verified(Sequence & q);
    void sample_replayed(Sequence & q);
    void save_checkpoint(Sequence & q);
    void restore_checkpoint(Sequence & q);
    void tell_drafters(Sequence & q);
    void record(Sequence & q, const BatchStep & b);
    void record_draft(Sequence & q, size_t r);
    void check_finish(Sequence & q, llama_token last);
    llama_token sample(Sequence & q, int32_t row);
    // Decodes the target batch (batch_tgt, filled by the caller) with, while telemetry is on, the hidden
    // probe observing; returns llama_process's code.
    int32_t decode_target();
    // decode_target of q's tokens[0 .. n) at its n_past .. alone, each with logits
    int32_t decode_tokens(Sequence & q, const llama_token * tokens, int32_t n);
    // Adds tokens[0 .. n) of sequence seq at positions pos0 .. to batch_tgt (each with logits if asked).
    void add_target_rows(llama_seq_id seq, const llama_token * tokens, int32_t n, llama_pos pos0, bool logits);
    // Every drafter of q observes the target's decode of its tokens[0 .. n) at pos0 .., in rows row0 .., with
    // the features they read extracted once (into q.features); returns the time a draft model took to decode
    // them (catch-up time; the MTP head only keeps its rows).
    int64_t follow_target(Sequence & q, const llama_token * tokens, int32_t n, llama_pos pos0, int32_t row0);
    // The rows of the target's last decode that `needs` asks for (a sequence's drafters': q.needs), copied into
    // `into`: the one extraction of the target's hidden states.
    TargetRows extract_features(const FeatureNeeds & needs, const llama_token * tokens, int32_t n, llama_pos pos0,
                                int32_t row0, std::vector<float> & into) const;

    // the phases of record_oracle() (oracle.cpp), on request 0
    std::vector<std::string> oracle_drafters() const;
    const Draft * probe_draft(const Sequence & q) const;
    void record_drafts(Sequence & q, OracleRecord & out, size_t r, int32_t n_cap);
    void record_draft(OracleRecord & out, size_t r, const Drafter & d, const Draft & draft, int64_t t_ns) const;
    void probe_costs(Sequence & q, OracleRecord & out, size_t r, bool probe);
    void probe_once(Sequence & q, OracleRecord & out, size_t r, int32_t k, int32_t rep);
    void plain_step(Sequence & q, OracleRecord & out, size_t r);
    void tail(Sequence & q, OracleRecord & out);
    // probe_batch_shift's decode of tokens[i0 .. i0 + n) at positions i0 .. on sequence 0, every row with logits
    void decode_probe_rows(const std::vector<llama_token> & tokens, int32_t i0, int32_t n);

    EngineOptions opts;
    NextnApi api;
    HiddenProbe probe_tgt, probe_mtp;   // observed by the contexts: declared (so destroyed) around them
    // owned llama.cpp objects, released in reverse order: requests (their drafters and samplers), batch,
    // contexts, models
    llama_model_ptr model;
    llama_model_ptr model_dft;          // the draft model (null: none)
    llama_context_ptr ctx_tgt;
    llama_context_ptr ctx_mtp;          // null if the model has no MTP layers
    llama_context_ptr ctx_dft;          // the draft model's context (null: none)
    DraftHead head;                     // the draft model as a head (kind DRAFT_MODEL: a draft model, not a head)
    llama_batch_ext_ptr batch_tgt;
    std::vector<std::unique_ptr<Sequence>> reqs;  // this generation's requests, in order
    std::vector<Sequence *> slots;      // n_parallel entries: the request holding each sequence, or null
    const llama_vocab * vocab = nullptr;
    LookupVocab lookup_vocab;           // the vocabulary as the look-up drafters read it
    int32_t layer_nextn = 0;
    bool recurrent = false;

    mutable std::mutex params_mutex;
    std::atomic<bool> cancel_requested{false};
    std::function<bool()> interrupt_check;
    bool interrupted() const { return interrupt_check && interrupt_check(); }
    // llama.cpp's abort callback while a prompt decodes: the interrupt check between its graph nodes (CPU backends)
    static bool prompt_aborted(void * engine) { return static_cast<const Engine *>(engine)->interrupted(); }
    int32_t batch_index = 0;            // the next engine step

    // step scratch, kept between steps so that a step allocates nothing
    std::vector<Sequence *> active;     // the sequences in this step, in slot order
    BatchStep batch_scratch;
    std::vector<DraftRequest> step_requests;
    std::vector<DraftJob> group_jobs;      // draft_together's jobs and their sequences
    std::vector<Sequence *> group_who;
    std::vector<Drafter *> group_drafters; // catch-up's drafters of one kind
    std::vector<Drafter *> seq_drafters;   // drafters to catch up (catch_up_drafters' input)

    // oracle scratch
    std::vector<Draft> oracle_drafts;      // each drafter's last oracle draft, by DrafterId (the probe uses the first)
    std::vector<uint8_t> saved_state;      // the target's recurrent state, restored after each probe
    std::vector<llama_token> probe_tokens;
    std::vector<float> probe_features;     // the probe's extracted features
    std::vector<int32_t> layer_inp_on;     // the trunk layers whose inputs the target context outputs now
    bool nextn_on = false;                 // the target context outputs every row's h_nextn now (use_nextn_rows)
};
