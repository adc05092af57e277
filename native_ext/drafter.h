// The drafter interface, after llama.cpp's common_speculative_impl (common/speculative.cpp): one
// struct per drafter with its own explicit state, the engine asks each one for a draft every
// step, verifies one of them (the chain policy picks it) and then tells every drafter the outcome.
// Statistics live in the base and are counted by the engine, as common_speculative_draft/_accept
// count them.
#pragma once

#include <algorithm>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "draft.h"
#include "llama.h"
#include "names.h"

struct Drafter;
struct DraftHead;
struct HiddenProbe;
struct LookupVocab;
struct NextnApi;

// Who drafts: a drafter's index in DRAFTER_TABLE (drafters.cpp). The per-step `drafter` column is a
// DrafterId (-1: no draft verified) and the per-source columns (`candidate_*`, the oracle's `draft*`)
// have one entry per DrafterId. The MTP drafter is the table's first entry (the engine follows the
// target with it); every other id is just its place in the table.
enum DrafterId : int8_t {
    DRAFTER_NONE = -1,
    DRAFTER_MTP = 0,    // the model's MTP head (MtpDrafter)
};

// The drafters' options, by their Python keyword (= llama.cpp's option name, e.g. "ngram_simple_size_n"): each
// drafter reads its own keys, a missing key meaning its default; unknown keys are ignored (Python
// checks them). A value is an integer, or a text (a file name: "lookup_cache_static").
using DrafterOptionValue = std::variant<int32_t, std::string>;
using DrafterOptions = std::map<std::string, DrafterOptionValue>;

// options[key], or `fallback` when the key is missing; a parameter error when it is a text
int32_t option_or(const DrafterOptions & options, const char * key, int32_t fallback);

// options[key] as a text, "" when the key is missing; a parameter error when it is an integer
std::string option_text(const DrafterOptions & options, const char * key);

// What a drafter needs besides the target model (a drafter whose need is missing is not made).
enum class DrafterNeeds : int8_t {
    NOTHING = 0,      // the look-ups: the token history only
    MTP = 1,          // the model's MTP (nextn) layers
    DRAFT_MODEL = 2,  // a separate draft model (Session.open(draft_model=...), llama.cpp's -md)
    EAGLE3_HEAD = 3,  // an EAGLE-3 head (an eagle3 GGUF given as the draft model) that reads the target's layers
    DFLASH_HEAD = 4,  // a DFlash block drafter (a dflash GGUF given as the draft model) that reads the target's layers
    DSPARK_HEAD = 5,  // a DSpark block drafter (a dflash GGUF with a Markov head, from llama.cpp's DSpark converter)
};
constexpr const char * DRAFTER_NEEDS_NAMES[] = {"nothing", "mtp", "draft_model", "eagle3_head", "dflash_head",
                                                "dspark_head"};
static_assert(count_of(DRAFTER_NEEDS_NAMES) == (size_t) DrafterNeeds::DSPARK_HEAD + 1, "one name per DrafterNeeds");

// A drafter whose model file is the session's draft model (a draft model, or a head of any kind: draft_head.h).
constexpr bool needs_draft_file(DrafterNeeds n) {
    return n == DrafterNeeds::DRAFT_MODEL || n == DrafterNeeds::EAGLE3_HEAD || n == DrafterNeeds::DFLASH_HEAD ||
           n == DrafterNeeds::DSPARK_HEAD;
}

// llama.cpp gives a recurrent target snapshot slots for a drafter of this need in the chain (common.h's
// need_n_rs_seq in 0.3.36: draft-mtp, draft-eagle3, draft-dflash, draft-dspark); the look-ups and draft-simple (whose
// transformer context drops the rejected rows itself) get none, and a session without slots runs only those.
constexpr bool gets_snapshot_slots(DrafterNeeds n) { return n != DrafterNeeds::NOTHING && n != DrafterNeeds::DRAFT_MODEL; }

// What a drafter factory is given (the MTP members are null when the model has no MTP layers, ctx_dft
// when the session has no draft model). The target's context is not among them: a drafter reads the
// target through the features it declares (Drafter::features, handed over in observe_target).
struct DrafterSetup {
    DrafterId id = DRAFTER_NONE;             // the drafter's index in DRAFTER_TABLE
    const LookupVocab * lookup_vocab = nullptr;  // the target's vocabulary as the look-ups read it
    const DrafterOptions * options = nullptr;
    const NextnApi * api = nullptr;          // the MTP head: the nextn API, its context and probe
    llama_context * ctx_mtp = nullptr;
    HiddenProbe * probe_mtp = nullptr;
    llama_context * ctx_dft = nullptr;       // the draft model's context
    const DraftHead * head = nullptr;        // the draft model as a head (its kind, target layers, block)
};

struct DraftRequest;
struct DraftJob;

// One drafter the engine knows: its name (GenerationConfig.drafters, _native.DRAFTERS), what it needs
// (without it, it is left out of the oracle and refused with n_max > 0), its factory (throws a
// parameter error on a bad option) and, for a drafter with a model of its own shared by the sequences (the
// MTP head), how the drafters of several sequences decode together, as llama.cpp drafts for a server's slots.
struct DrafterEntry {
    const char * name;  // llama.cpp's --spec-type value: the trace's drafter axis, what errors name it by
    DrafterNeeds needs;
    bool has_confidence;  // its drafts carry a confidence: p_min applies to them
    std::unique_ptr<Drafter> (*make)(const DrafterSetup & setup);
    // Drafts every job in one batch per depth (rows_per_depth, when given, gets the rows of each decode);
    // nullptr: each drafter drafts alone (Drafter::draft). Throws on a decode failure.
    void (*draft_together)(const std::vector<DraftJob> & jobs, std::vector<int32_t> * rows_per_depth) = nullptr;
    // Decodes what the drafters queued while following the target (Drafter::has_queue) in one batch; returns
    // llama_process's code. nullptr: the drafter queues nothing.
    int32_t (*catch_up_together)(const std::vector<Drafter *> & drafters) = nullptr;
};

// The drafter table (drafters.cpp), in DrafterId order: adding a drafter is its class and one entry.
extern const DrafterEntry DRAFTER_TABLE[];
extern const int32_t N_DRAFTERS;

const char * drafter_name(int32_t id);          // DRAFTER_TABLE[id].name
int32_t drafter_index(const std::string & name);  // the DrafterId of `name`, or -1
std::string drafter_names_list();              // "draft-mtp", "ngram-simple", ... (for error messages)

// How the draft to verify is chosen when more than one drafter is asked.
enum class ChainPolicy : int8_t {
    FIRST = 0,  // llama.cpp's (common_speculative_draft): the drafters are asked in chain order until one
                // has a usable draft, which is verified; the later ones are not asked that step
    BEST = 1,   // every drafter drafts; the usable draft with the highest expected accepted length wins (earlier on a tie)
};
constexpr const char * CHAIN_POLICY_NAMES[] = {"first", "best"};
static_assert(count_of(CHAIN_POLICY_NAMES) == (size_t) ChainPolicy::BEST + 1, "one name per ChainPolicy");

// What a drafter is asked for at one step.
struct DraftRequest {
    llama_token id_last = -1;               // the last sampled token: the draft continues it
    llama_pos n_past = 0;                   // the position of id_last
    const llama_token * history = nullptr;  // the tokens before id_last (prompt, then generated)
    size_t n_history = 0;
    int32_t n_cap = 0;                      // the longest draft this step allows
    StopReason cap_reason = STOP_N_MAX;     // the stop reason of a draft that reaches n_cap
    DraftParams params;
    int32_t topk = 0;                       // alternatives recorded per depth
    bool telemetry = false;                 // record top-k, hidden rows and their norms
    bool oracle = false;                    // record top-k, margins and decode timings (record_oracle)
};

// The target hidden states a drafter reads after each target decode (its features): llama.cpp's draft-mtp
// reads the rows the target hands its MTP head (llama_get_embeddings_nextn_ith); draft-eagle3 / draft-dflash read
// the inputs of given trunk layers (llama_set_embeddings_layer_inp / llama_get_embeddings_layer_inp), which only
// the architectures of layer_inputs.h can give. The engine extracts the features a sequence's drafters declare once
// per decode and hands the same rows to all of them (TargetRows).
struct FeatureNeeds {
    bool nextn = false;               // the MTP head's input rows (the context was made with llama_set_embeddings_nextn)
    std::vector<int32_t> layer_inp;   // trunk layers whose input rows are read, in the order they are concatenated

    bool any() const { return nextn || !layer_inp.empty(); }
    FeatureNeeds & operator|=(const FeatureNeeds & o) {
        nextn = nextn || o.nextn;
        for (int32_t il : o.layer_inp) {
            if (std::find(layer_inp.begin(), layer_inp.end(), il) == layer_inp.end()) {
                layer_inp.push_back(il);
            }
        }
        return *this;
    }
};

// One target decode as a sequence's drafters see it: toks[i] at pos0 + i, in row row0 + i of the target's
// batch (other sequences may share it), and the features extracted for them (valid until the sequence's
// next target decode).
struct TargetRows {
    const llama_token * toks = nullptr;
    int32_t n = 0;
    llama_pos pos0 = 0;
    int32_t row0 = 0;
    int32_t n_embd = 0;
    const float * nextn = nullptr;  // n rows of n_embd (FeatureNeeds::nextn), else nullptr
    int32_t n_embd_layer = 0;       // the trunk's hidden size (llama_model_n_embd)
    int32_t n_layer_inp = 0;        // FeatureNeeds::layer_inp.size()
    const float * layer_inp = nullptr;  // n rows of n_layer_inp * n_embd_layer: the layers' inputs side by side
    const int32_t * layer_ids = nullptr;  // the n_layer_inp layers, in that order (FeatureNeeds::layer_inp)

    const float * nextn_row(int32_t i) const { return nextn + (size_t) i * n_embd; }
    // where trunk layer `il`'s input sits among the layers of a layer_inp row (-1: not extracted)
    int32_t layer_slot(int32_t il) const {
        for (int32_t l = 0; l < n_layer_inp; ++l) {
            if (layer_ids[l] == il) {
                return l;
            }
        }
        return -1;
    }
    const float * layer_inp_row(int32_t i) const { return layer_inp + (size_t) i * n_layer_inp * n_embd_layer; }
};

// One sequence's part in a batched draft (DrafterEntry::draft_together): its drafter, what it is asked and
// where its draft goes.
struct DraftJob {
    Drafter * drafter = nullptr;
    const DraftRequest * req = nullptr;
    Draft * out = nullptr;
};

// What the verification decided, told to every drafter after each step.
struct DraftOutcome {
    const Draft * proposal = nullptr;       // this drafter's proposal (nullptr: it took no part)
    bool verified = false;                  // that proposal was the draft verified
    bool last = false;                      // its draft was the one verified last, at this step or before
                                            // (llama.cpp's impl_last, told accept(n_accepted, is_other = false))
    int32_t n_drafted = 0;                  // tokens verified (whoever drafted them)
    int32_t n_accepted = 0;                 // of those, accepted by the target
    const llama_token * emitted = nullptr;  // the tokens the step emitted: the accepted drafts, then the correction
    int32_t n_emitted = 0;
    llama_pos keep_until = 0;               // the target memory keeps the positions before this
    int32_t row0 = 0;                       // id_last's row among the rows the step's decode handed the drafters
                                            // (prompt rows decoded with a server slot's first step come first)
    bool replay = false;                    // a checkpoint replay: no drafter was asked, the last draft's accepted
                                            // tokens and correction were verified again, and n_accepted of them
                                            // agreed: the acceptance llama.cpp tells the drafter verified last then
                                            // (it tells none at the partial acceptance before, whose last is false)
};

// Per-drafter counters for one generation, counted as llama.cpp's common_speculative_draft/_accept count
// them (common_speculative_print_stats prints them): a drafter's draft counts when it is verified; every
// step's outcome is told to the drafter whose draft was verified last (llama.cpp's impl_last), also at
// steps without a draft (n_accepted 0), which is what n_call_accept counts.
struct DrafterStats {
    int64_t n_call_begin = 0;       // generations begun
    int64_t n_call_draft = 0;       // steps it was asked to draft
    int64_t n_call_accept = 0;      // step outcomes told to it as the drafter verified last
    int64_t n_proposals = 0;        // usable (non-empty, not dropped) drafts proposed
    int64_t n_gen_drafts = 0;       // its drafts verified
    int64_t n_gen_tokens = 0;       // tokens in those drafts
    int64_t n_acc_drafts = 0;       // step outcomes with at least one token accepted
    int64_t n_acc_tokens = 0;       // tokens accepted
    std::vector<int64_t> acc_by_pos;  // [j]: step outcomes whose token j was accepted
    int64_t n_resets = 0;           // times it forgot what it learned (ngram-mod: its table, on low acceptance)
    int64_t t_begin_ns = 0;         // wall time in begin() (llama.cpp's t_begin_us)
    int64_t t_draft_ns = 0;         // time in draft() (t_draft_us)
    int64_t t_accept_ns = 0;        // time in accept() and observe_target() (t_accept_us; a draft model's decode
                                    // of the verify batch is here, as llama.cpp's process() is outside its stats)

    void on_draft(const Draft & d) {
        ++n_call_draft;
        n_proposals += d.usable() ? 1 : 0;
    }

    void on_verified(int32_t n_drafted) {
        ++n_gen_drafts;
        n_gen_tokens += n_drafted;
    }

    void on_accept(int32_t n_accepted) {
        ++n_call_accept;
        n_acc_drafts += n_accepted > 0 ? 1 : 0;
        n_acc_tokens += n_accepted;
        if ((int32_t) acc_by_pos.size() < n_accepted) {
            acc_by_pos.resize(n_accepted, 0);
        }
        for (int32_t j = 0; j < n_accepted; ++j) {
            ++acc_by_pos[j];
        }
    }
};

struct Drafter {
    explicit Drafter(DrafterId id) : id(id) {}
    virtual ~Drafter() = default;
    Drafter(const Drafter &) = delete;
    Drafter & operator=(const Drafter &) = delete;

    const char * name() const { return drafter_name(id); }

    // A new generation over `prompt`: forget the previous one.
    virtual void begin(const std::vector<llama_token> & prompt) = 0;

    // Drafts after req.id_last into `out` (cleared by the caller, its stop set to req.cap_reason).
    // Returns false when the drafter takes no part in this step (no candidate, no outcome).
    virtual bool draft(const DraftRequest & req, Draft & out) = 0;

    // The expected accepted length of `d`, one of this drafter's drafts (the BEST policy compares them).
    virtual double expected_accepted(const Draft & d) const = 0;

    // After the verification, told to every drafter in the chain.
    virtual void accept(const DraftOutcome & outcome) = 0;

    // The target hidden states it reads after each target decode (none: the look-ups, a draft model).
    virtual FeatureNeeds features() const { return {}; }

    // After every target decode (the prompt, each verify batch, the oracle's plain steps): this sequence's rows,
    // with the features it declared. A drafter with a model of its own follows the target here; the look-ups
    // need not.
    virtual void observe_target(const TargetRows & /*rows*/) {}

    // After a decode outside a verify step (the prompt, an oracle's plain step): rows 0 .. n_rows of it stand
    // and the target memory keeps the positions before keep_until (accept() says so after a verify step).
    virtual void keep(int32_t /*n_rows*/, llama_pos /*keep_until*/) {}

    // Rows observed but not yet decoded by its own model (DrafterEntry::catch_up_together decodes them).
    virtual bool has_queue() const { return false; }

    // The oracle's cost probe: decode what following `rows` would (its catch-up), then undo it, leaving the
    // drafter as it was. Returns llama_process's code.
    virtual int32_t probe_follow(const TargetRows & /*rows*/) { return 0; }

    const DrafterId id;
    llama_seq_id seq_id = 0;  // the llama.cpp sequence (server slot) it drafts for: set when its request takes a slot
    DrafterStats stats;
};
