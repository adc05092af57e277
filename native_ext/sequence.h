// One request of the engine: what llama-server keeps per slot. Its settings, its drafters, where it is
// in its generation, its telemetry and the scratch of its current step. A request takes one of the
// engine's n_parallel sequences (its llama.cpp seq_id) from its admission until it finishes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "draft.h"
#include "draft_length.h"
#include "drafter.h"
#include "llama-cpp.h"
#include "llama.h"
#include "telemetry.h"

struct GenerationConfig {
    int32_t max_tokens = 128;
    float temperature = 0.0f;
    uint32_t seed = 0;
    // names of DRAFTER_TABLE (llama.cpp's --spec-type values), in chain order: one, or several for a chain
    std::vector<std::string> drafters{drafter_name(DRAFTER_MTP)};
    std::string chain_policy = CHAIN_POLICY_NAMES[(int) ChainPolicy::FIRST];
    DrafterOptions options;  // every drafter's options by keyword (each drafter reads its own keys)
    // the prompt as a llama-server slot processes it (Engine::server_prompt_chunks): in the server's prompt
    // batches, the last of them decoded with the first step, whose token is sampled before any draft
    bool server_slot = false;
    // each step's draft cap: "fixed" (n_max), "heuristic" or "window" over `window` drafting steps (draft_length.h)
    std::string schedule = SCHEDULE_NAMES[(int) ScheduleKind::FIXED];
    int32_t window = 8;
};

// A GenerationConfig's drafter list and policy, parsed (parse_chain throws a parameter error on
// an unknown or repeated name, or an empty list).
struct DrafterChain {
    std::vector<DrafterId> ids{DRAFTER_MTP};
    ChainPolicy policy = ChainPolicy::FIRST;

    bool has(DrafterId id) const;
};
DrafterChain parse_chain(const GenerationConfig & cfg);

// One request of a parallel generation (Engine::begin_requests).
struct Request {
    std::vector<llama_token> prompt;
    GenerationConfig config;
    DraftParams params;
    int32_t arrival = 0;  // the engine step at which it arrives (0: at the start)
};

enum FinishReason : int8_t {
    FINISH_NONE = -1,       // still running (or waiting for a slot)
    FINISH_BUDGET = 0,
    FINISH_EOS = 1,
    FINISH_CONTEXT = 2,
    FINISH_CANCELLED = 3,
};
constexpr const char * FINISH_REASON_NAMES[] = {"budget", "eos", "context", "cancelled"};
static_assert(count_of(FINISH_REASON_NAMES) == FINISH_CANCELLED + 1, "one name per FinishReason");

// One step of one sequence, handed from phase to phase.
struct StepState {
    // cap
    DraftParams p;
    int32_t length = 0;                  // the schedule's draft cap for this step (n_max under "fixed")
    int32_t n_cap = 0;                   // how far this step may draft (the length, cut by the budget and context)
    StopReason cap_reason = STOP_N_MAX;
    bool drafting = false;               // n_max > 0: its drafters draft (and catch up) this step
    bool settled = false;                // FIRST policy: a usable draft was found, later drafters are not asked
    // choose
    const Draft * chosen = nullptr;      // the draft verified (an empty one when none is usable)
    DrafterId source = DRAFTER_NONE;
    double expected = 0.0;               // the source's expected accepted length
    int32_t n_d = 0;                     // tokens verified
    int32_t row0 = 0;                    // its first row (id_last's) in the step's target batch
    int32_t n_prompt_rows = 0;           // rows decoded before it in the same batch (a server slot's first step's
                                         // prompt, or the last step's tokens verified again after a checkpoint)
    int32_t out_row0 = 0;                // its first row among the batch's output rows (the hidden-state probe's)
    // accept / rollback
    int32_t n_acc = 0;
    llama_token correction = -1;
    int32_t n_rollback = 0;
    llama_pos keep_until = 0;
    // the replay of the last step after its checkpoint was restored (Engine::checkpoints)
    int32_t n_replayed = 0;              // its accepted tokens and correction, verified again before id_last
    int32_t replay_agreed = -1;          // how many of them the target sampled again as they were
};

// The phase times and batch shape of one engine step, shared by the sequences in it.
struct BatchStep {
    int32_t index = 0;                   // the engine step (batch_step column)
    int32_t n_active = 0;
    int32_t verify_rows = 0;
    std::vector<int32_t> draft_rows;     // rows of each MTP draft decode
    int64_t t_draft0 = 0, t_catchup_ns = 0, t_draft_ns = 0, t_verify_ns = 0, t_sample_ns = 0;

    // A new step: every count and time zero (draft_rows keeps its capacity).
    void reset(int32_t step) {
        index = step;
        n_active = verify_rows = 0;
        draft_rows.clear();
        t_draft0 = t_catchup_ns = t_draft_ns = t_verify_ns = t_sample_ns = 0;
    }
};

// A request's totals over its steps, kept at every telemetry level (the only record at TelemetryLevel::OFF).
struct RequestTotals {
    int64_t n_steps = 0, n_drafted = 0, n_accepted = 0;
    int64_t t_catchup_ns = 0, t_draft_ns = 0, t_verify_ns = 0, t_sample_ns = 0;

    void add(const StepState & s, const BatchStep & b) {
        ++n_steps;
        n_drafted += s.n_d;
        n_accepted += s.n_acc;
        t_catchup_ns += b.t_catchup_ns;
        t_draft_ns += b.t_draft_ns;
        t_verify_ns += b.t_verify_ns;
        t_sample_ns += b.t_sample_ns;
    }
};

struct Sequence {
    Sequence(int32_t index, const Request & request, const DrafterChain & chain, int32_t depth, int32_t topk);

    bool waiting() const { return slot < 0 && finish == FINISH_NONE; }

    const int32_t index;                 // its place in the request list
    llama_seq_id slot = -1;              // the sequence (server slot) it took (-1: not yet; kept after it finishes)
    Request request;
    DrafterChain chain;
    DraftParams params;                  // its live parameters (Engine::set_params changes every request's)
    DraftLengthSchedule schedule;        // its draft-length schedule (request.config.schedule)
    std::vector<std::unique_ptr<Drafter>> drafters;  // its chain, in order
    FeatureNeeds needs;                  // the target features its drafters read (Drafter::features)
    std::vector<float> features;         // their rows from its last target decode (Engine::extract_features)
    llama_sampler_ptr smpl;              // temperature > 0 only

    // where its generation is
    llama_token id_last = -1;
    llama_pos n_past = 0;
    int32_t n_prompt_pending = 0;        // rows from n_past on that its next step decodes before id_last: a server
                                         // slot's last prompt rows, or a replay (below)
    bool replay = false;                 // those rows are the last step's, verified again: logits on, sampled again
    std::vector<uint8_t> checkpoint;     // the target's state of its sequence before this step's verify (checkpoints)
    llama_sampler_ptr smpl_saved;        // its sampler then (temperature > 0)
    int32_t n_step = 0;
    DrafterId last_verified = DRAFTER_NONE;  // whose draft was verified last (llama.cpp's impl_last): told each outcome
    std::vector<llama_token> tokens_all;     // prompt + generated: the history the look-ups search
    std::vector<llama_token> generated;
    FinishReason finish = FINISH_NONE;
    int64_t t_prefill_ns = 0;
    int32_t admitted_step = -1;          // the engine step it took its slot at
    int32_t finished_step = -1;          // the engine step it finished at
    Telemetry tel;
    RequestTotals totals;

    // this step's scratch, N_DRAFTERS entries each
    StepState s;
    std::vector<Draft> candidates;       // each drafter's proposal this step, by DrafterId
    std::vector<uint8_t> asked;          // it took part
    std::vector<double> expected;        // its expected accepted length
    std::vector<llama_token> verify_tokens;
    std::vector<llama_token> target_row; // the target's token at each verified row
};
