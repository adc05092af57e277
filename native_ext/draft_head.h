// A draft head: a model file given as the draft model (llama.cpp's -md) that drafts from the target's hidden states
// rather than alone. llama.cpp 0.3.36 has three kinds: an EAGLE-3 head (general.architecture `eagle3`, draft-eagle3),
// a DFlash block drafter (`dflash`, draft-dflash) and a DSpark block drafter (`dflash` with a Markov head,
// markov_w1.weight, as llama.cpp tells them apart: draft-dspark). All name the
// target layers they read (llama_model_target_layer_ids) and borrow the target's embeddings and output through
// ctx_other when they have none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "draft_ranking.h"
#include "drafter.h"
#include "llama-cpp.h"
#include "llama.h"
#include "nextn_api.h"

struct DraftHead {
    DrafterNeeds kind = DrafterNeeds::DRAFT_MODEL;  // EAGLE3_HEAD, DFLASH_HEAD or DSPARK_HEAD (DRAFT_MODEL: not a head)
    std::vector<int32_t> target_layers;  // the head's target_layers, in the order its fc concatenates them
    int32_t n_layer_tgt = 0;             // the target's trunk layers (EAGLE-3: an id equal to it is the nextn row)
    int32_t block_size = 0;              // DFlash: the trained block (dflash.block_size, llama.cpp's default 16)
    llama_token mask_token = -1;         // DFlash: the noise token of the block (tokenizer.ggml.mask_token_id)
    bool causal = false;                 // DFlash: attention inside the block is causal (dflash.attention.causal)
    bool anchor = false;                 // DSpark: the block's first slot (id_last's) drafts too (sample_from_anchor)
    bool has_confidence = false;         // DSpark: a confidence head, which p_min is compared with

    // The features it needs: the layer inputs below n_layer_tgt, the nextn rows for an id equal to it.
    FeatureNeeds features() const;

    bool is_block() const { return kind == DrafterNeeds::DFLASH_HEAD || kind == DrafterNeeds::DSPARK_HEAD; }

    // The most tokens one draft holds (llama.cpp's clamp of n_max: block_size - 1, or block_size for an anchor-first
    // DSpark block; EAGLE-3: no bound).
    int32_t draft_limit() const { return !is_block() ? INT32_MAX : anchor ? block_size : block_size - 1; }

    // Why it cannot draft for a target of architecture `arch` with hidden size n_embd (an MTP head giving nextn rows
    // or not), the head having hidden size head_embd and naming target_hidden ("": it can).
    std::string refusal(const std::string & arch, int32_t n_embd, int32_t head_embd, int32_t target_hidden,
                        bool target_has_nextn) const;

    // The head in `model`, loaded from the GGUF at `path` (kind DRAFT_MODEL when its architecture is not a head's), for
    // a target of n_layer_tgt layers.
    static DraftHead of(const NextnApi & api, const llama_model * model, const std::string & path, int32_t n_layer_tgt);
};

// What the drafters of a head share (Eagle3Drafter, DFlashDrafter): the head and its context (made by the engine with
// ctx_other = the target's context and nextn output on), a batch, the top-10 ranking of its logits, the features it
// declares, the expected accepted length from its confidences, and accept() as keep() of the rows accepted.
struct HeadDrafter : Drafter {
    // Throws a parameter error naming `spec_type` when the session has no draft model.
    HeadDrafter(DrafterId id, const NextnApi & api, llama_context * ctx_dft, DraftHead head, const char * spec_type);

    double expected_accepted(const Draft & d) const override { return expected_from_confidences(d); }
    void accept(const DraftOutcome & outcome) override {
        keep(outcome.row0 + outcome.n_accepted, outcome.keep_until);
    }
    FeatureNeeds features() const override { return head.features(); }

  protected:
    const NextnApi & api;
    llama_context * ctx_dft;
    const llama_vocab * vocab;
    DraftHead head;
    llama_batch_ext_ptr batch;
    CandidateRanking ranking;
};

// a model's metadata value as text ("" where it has no such key)
std::string meta_text(const llama_model * model, const char * key);
