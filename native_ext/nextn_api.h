// The staging nextn API of llama.cpp (src/llama-ext.h), resolved at run time so that a libllama
// without it gives a clear Python error instead of an import failure.
#pragma once

#include <string>
#include <vector>

#include "llama.h"

struct NextnApi {
    void (*set_embeddings_nextn)(llama_context *, bool, bool) = nullptr;
    float * (*get_embeddings_nextn_ith)(llama_context *, int32_t) = nullptr;
    int32_t (*model_n_layer_nextn)(const llama_model *) = nullptr;
    uint32_t (*n_rs_seq)(const llama_context *) = nullptr;
    void (*set_embeddings_layer_inp)(llama_context *, uint32_t, bool) = nullptr;
    float * (*get_embeddings_layer_inp)(llama_context *, uint32_t) = nullptr;
    float * (*get_embeddings_nextn)(llama_context *) = nullptr;                // every output row (an EAGLE-3 encoder)
    const int32_t * (*model_target_layer_ids)(const llama_model *) = nullptr;  // a draft head's target layers
    uint32_t (*model_target_layer_ids_n)(const llama_model *) = nullptr;
    void (*set_nextn_layer_offset)(llama_context *, int32_t) = nullptr;      // which of chained MTP heads decodes
    llama_context * (*get_ctx_other)(llama_context *) = nullptr;             // the context a head shares memory with

    // Resolves the symbols in the library at lib_path (empty: the libllama this module links).
    // Returns the names that are missing.
    std::vector<std::string> load(const std::string & lib_path);
};

// Path of the libllama this module is linked against.
std::string linked_libllama_path();
