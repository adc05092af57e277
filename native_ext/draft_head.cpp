#include "draft_head.h"

#include <algorithm>
#include <cstdlib>

#include "errors.h"
#include "gguf.h"
#include "layer_inputs.h"

std::string meta_text(const llama_model * model, const char * key) {
    char buf[256] = {0};
    return llama_model_meta_val_str(model, key, buf, sizeof(buf)) < 0 ? std::string() : std::string(buf);
}

FeatureNeeds DraftHead::features() const {
    FeatureNeeds needs;
    for (int32_t il : target_layers) {
        if (il == n_layer_tgt && !is_block()) {
            needs.nextn = true;
        } else if (std::find(needs.layer_inp.begin(), needs.layer_inp.end(), il) == needs.layer_inp.end()) {
            needs.layer_inp.push_back(il);
        }
    }
    return needs;
}

namespace {

// what an EAGLE-3 head asks that a target may not give ("": it can)
std::string eagle3_refusal(const DraftHead & h, int32_t n_embd, int32_t target_hidden, bool target_has_nextn) {
    if (h.target_layers.size() != 3) {
        return "it names " + std::to_string(h.target_layers.size()) + " target layers, llama.cpp's draft-eagle3 reads 3";
    }
    if (target_hidden != n_embd) {
        return "it was trained on a target of hidden size " + std::to_string(target_hidden) +
               " (eagle3.target_hidden_size), this target's is " + std::to_string(n_embd);
    }
    for (int32_t il : h.target_layers) {
        if (il == h.n_layer_tgt && !target_has_nextn) {
            return "it reads layer " + std::to_string(il) + " = the target's n_layer, which llama.cpp serves from the "
                   "target's nextn rows, and this target has no MTP head to give them";
        }
    }
    return "";
}

// what a DFlash head asks that a target may not give, or that the engine does not run yet ("": none)
std::string dflash_refusal(const DraftHead & h, int32_t n_embd, int32_t head_embd) {
    if (h.target_layers.empty()) {
        return "it names no target layers (dflash.target_layers)";
    }
    if (head_embd != n_embd) {
        return "its hidden size is " + std::to_string(head_embd) + ", this target's " + std::to_string(n_embd) +
               " (llama.cpp's DFlash reads the target's layers at its own width)";
    }
    if (h.block_size < 2) {
        return "its block size is " + std::to_string(h.block_size) + " (dflash.block_size): it drafts nothing";
    }
    if (h.mask_token < 0) {
        return "it has no mask token (tokenizer.ggml.mask_token_id)";
    }
    return "";
}

}  // namespace

std::string DraftHead::refusal(const std::string & arch, int32_t n_embd, int32_t head_embd, int32_t target_hidden,
                               bool target_has_nextn) const {
    std::string why = kind == DrafterNeeds::EAGLE3_HEAD ? eagle3_refusal(*this, n_embd, target_hidden, target_has_nextn)
                                                         : dflash_refusal(*this, n_embd, head_embd);
    if (!why.empty()) {
        return why;
    }
    std::vector<int32_t> layers;
    for (int32_t il : target_layers) {
        if (il > n_layer_tgt || il < 0 || (il == n_layer_tgt && is_block())) {
            return "it reads layer " + std::to_string(il) + ", beyond this target's " + std::to_string(n_layer_tgt) +
                   " layers (llama.cpp aborts there)";
        }
        if (il < n_layer_tgt) {
            layers.push_back(il);
        }
    }
    return layers.empty() ? "" : layer_input_refusal(arch, n_layer_tgt, layers);
}

namespace {

// the GGUF file at `path` holds a tensor of that name (read from its header alone)
bool has_tensor(const std::string & path, const char * name) {
    gguf_init_params params{/*no_alloc*/ true, /*ctx*/ nullptr};
    gguf_context * ctx = gguf_init_from_file(path.c_str(), params);
    if (ctx == nullptr) {
        return false;
    }
    const bool found = gguf_find_tensor(ctx, name) >= 0;
    gguf_free(ctx);
    return found;
}

}  // namespace

DraftHead DraftHead::of(const NextnApi & api, const llama_model * model, const std::string & path, int32_t n_layer_tgt) {
    DraftHead h;
    const std::string arch = meta_text(model, "general.architecture");
    h.kind = arch == "eagle3" ? DrafterNeeds::EAGLE3_HEAD : arch == "dflash" ? DrafterNeeds::DFLASH_HEAD
                                                                             : DrafterNeeds::DRAFT_MODEL;
    if (h.kind == DrafterNeeds::DRAFT_MODEL) {
        return h;
    }
    const int32_t * ids = api.model_target_layer_ids(model);
    if (ids != nullptr) {
        h.target_layers.assign(ids, ids + api.model_target_layer_ids_n(model));
    }
    h.n_layer_tgt = n_layer_tgt;
    if (h.kind == DrafterNeeds::DFLASH_HEAD) {
        const std::string block = meta_text(model, "dflash.block_size");
        h.block_size = block.empty() ? 16 : std::atoi(block.c_str());  // llama.cpp's default when the key is absent
        h.mask_token = llama_vocab_mask(llama_model_get_vocab(model));
        h.causal = meta_text(model, "dflash.attention.causal") == "true";
        // a DSpark head has a Markov head (llama.cpp's common_speculative_types_from_gguf); llama.cpp's defaults
        // (common_speculative_impl_draft_dflash): anchor-first and a confidence head unless the keys say otherwise
        if (has_tensor(path, "markov_w1.weight")) {
            h.kind = DrafterNeeds::DSPARK_HEAD;
            h.has_confidence = meta_text(model, "dflash.has_confidence_head") != "false";
            h.anchor = meta_text(model, "dflash.sample_from_anchor") != "false";
        }
    }
    return h;
}

HeadDrafter::HeadDrafter(DrafterId id, const NextnApi & api, llama_context * ctx_dft, DraftHead head_,
                         const char * spec_type)
    : Drafter(id), api(api), ctx_dft(ctx_dft), head(std::move(head_)) {
    if (ctx_dft == nullptr) {
        fail(ErrorKind::PARAMETER, std::string(spec_type) + " needs its head as the draft model: Session.open(path, "
                                   "draft_model=head.gguf)");
    }
    vocab = llama_model_get_vocab(llama_get_model(ctx_dft));
    batch.reset(llama_batch_ext_init(ctx_dft));
}
