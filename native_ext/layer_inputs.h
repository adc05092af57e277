// The inputs of the target's trunk layers (the residual stream entering each layer, HF's hidden_states[il]):
// what llama.cpp's draft-eagle3 and draft-dflash read from the target, through llama_set_embeddings_layer_inp /
// llama_get_embeddings_layer_inp (src/llama-ext.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// The architectures whose graph marks every trunk layer's input (llm_graph_result::t_layer_inp, set by the model
// classes of llama.cpp 0.3.36's src/models/*.cpp, named as src/llama-model.cpp maps them to general.architecture).
// Asking another architecture for layer inputs aborts the process in the next graph build ("layer input tensor is
// null"), so the engine refuses it first.
constexpr const char * LAYER_INPUT_ARCHS[] = {
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2", "minimax-01",
    "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next",
    "qwen4exp",
};

// Why a model of architecture `arch` with `n_layer` trunk layers cannot give the inputs of `layers` ("": it can):
// an architecture outside LAYER_INPUT_ARCHS, no layer, or a layer outside 0 .. n_layer - 1 (llama.cpp's id n_layer
// is the nextn path, post-norm on some architectures and unwritten on others: not a layer input).
std::string layer_input_refusal(const std::string & arch, int32_t n_layer, const std::vector<int32_t> & layers);
