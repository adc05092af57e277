// Engine::probe_layer_inputs and the capability check of layer inputs (layer_inputs.h).
#include "layer_inputs.h"

#include <algorithm>
#include <cstring>

#include "engine.h"
#include "errors.h"

std::string layer_input_refusal(const std::string & arch, int32_t n_layer, const std::vector<int32_t> & layers) {
    const auto * end = std::end(LAYER_INPUT_ARCHS);
    if (std::find_if(std::begin(LAYER_INPUT_ARCHS), end, [&](const char * a) { return arch == a; }) == end) {
        return "llama.cpp's " + arch + " graph does not give its layers' inputs (llama_get_embeddings_layer_inp): "
               "only the architectures that mark them do (" + std::to_string(std::size(LAYER_INPUT_ARCHS)) +
               " in llama.cpp 0.3.36, e.g. qwen35, qwen3, llama)";
    }
    if (layers.empty()) {
        return "no layer asked for";
    }
    for (int32_t il : layers) {
        if (il < 0 || il >= n_layer) {
            return "layer " + std::to_string(il) + " is not a trunk layer of this " + arch + " model (0 .. " +
                   std::to_string(n_layer - 1) + ")";
        }
    }
    return "";
}

std::string Engine::arch() const {
    char buf[128] = {0};
    if (llama_model_meta_val_str(model.get(), "general.architecture", buf, sizeof(buf)) < 0) {
        return "";
    }
    return buf;
}

void Engine::use_layer_inputs(const std::vector<int32_t> & layers) {
    if (!layers.empty()) {
        const std::string refusal = layer_input_refusal(arch(), llama_model_n_layer(model.get()), layers);
        if (!refusal.empty()) {
            fail(ErrorKind::PARAMETER, refusal);
        }
    }
    auto has = [](const std::vector<int32_t> & v, int32_t il) { return std::find(v.begin(), v.end(), il) != v.end(); };
    for (int32_t il : layer_inp_on) {
        if (!has(layers, il)) {
            api.set_embeddings_layer_inp(ctx_tgt.get(), (uint32_t) il, false);
        }
    }
    for (int32_t il : layers) {
        if (!has(layer_inp_on, il)) {
            api.set_embeddings_layer_inp(ctx_tgt.get(), (uint32_t) il, true);
        }
    }
    layer_inp_on = layers;
}

void Engine::probe_layer_inputs(const std::vector<llama_token> & tokens, const std::vector<int32_t> & layers,
                                std::vector<float> & out) {
    check_open();
    const int32_t P = (int32_t) tokens.size();
    if (P < 1 || P > n_ctx_seq()) {
        fail(ErrorKind::PARAMETER, "layer inputs need 1 .. n_ctx_seq=" + std::to_string(n_ctx_seq()) +
                                       " tokens, got " + std::to_string(P));
    }
    std::lock_guard<std::mutex> lk(run_mutex);
    use_layer_inputs(layers);
    end_generations();
    FeatureNeeds needs;
    needs.layer_inp = layers;
    const int32_t n_ubatch = (int32_t) llama_n_ubatch(ctx_tgt.get());
    const size_t row = (size_t) layers.size() * llama_model_n_embd(model.get());
    out.assign(row * P, 0.0f);
    std::vector<float> rows;
    clear_memories();
    for (int32_t i0 = 0; i0 < P; i0 += n_ubatch) {
        const int32_t n = std::min(n_ubatch, P - i0);
        if (interrupted()) {
            clear_memories();
            use_layer_inputs({});
            fail(ErrorKind::INTERRUPTED, "interrupted");
        }
        llama_batch_ext_clear(batch_tgt.get());
        add_target_rows(0, tokens.data() + i0, n, i0, /*logits*/ false);
        if (llama_process(ctx_tgt.get(), LLAMA_PROCESS_TYPE_DECODE, batch_tgt.get()) != 0) {
            clear_memories();
            use_layer_inputs({});
            fail(ErrorKind::DECODE, "decoding the prompt for its layer inputs failed at position " +
                                        std::to_string(i0));
        }
        const TargetRows got = extract_features(needs, tokens.data() + i0, n, i0, 0, rows);
        std::memcpy(out.data() + row * i0, got.layer_inp, row * n * sizeof(float));
    }
    clear_memories();
    use_layer_inputs({});  // a generation turns on what its drafters read (begin_requests)
}
