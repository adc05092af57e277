#include "placement.h"

#include "errors.h"
#include "ggml-backend.h"

namespace {

const ggml_type KV_CACHE_TYPES[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16,   GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
                                    GGML_TYPE_Q4_1, GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1};
static_assert(count_of(KV_CACHE_TYPE_NAMES) == sizeof(KV_CACHE_TYPES) / sizeof(KV_CACHE_TYPES[0]),
              "one name per KV cache type");

template <size_t N>
int checked_index(const char * const (&table)[N], const char * option, const std::string & value) {
    const int i = name_index(table, value);
    if (i < 0) {
        fail(ErrorKind::PARAMETER,
             std::string(option) + " must be one of " + names_list(table) + ", got \"" + value + "\"");
    }
    return i;
}

}  // namespace

void Placement::validate() const {
    checked_index(FLASH_ATTN_NAMES, "flash_attn", flash_attn);
    checked_index(KV_CACHE_TYPE_NAMES, "type_k", type_k);
    checked_index(KV_CACHE_TYPE_NAMES, "type_v", type_v);
    checked_index(LOAD_MODE_NAMES, "load_mode", load_mode);
    if (n_gpu_layers < -2) {
        fail(ErrorKind::PARAMETER, "n_gpu_layers must be -1 (auto), -2 (all) or a number of layers >= 0, got " +
                                       std::to_string(n_gpu_layers));
    }
    const int32_t n_gpu = n_gpu_devices();
    if (main_gpu < 0 || (main_gpu > 0 && main_gpu >= n_gpu)) {
        fail(ErrorKind::PARAMETER, "main_gpu=" + std::to_string(main_gpu) + " but this build of llama.cpp sees " +
                                       std::to_string(n_gpu) + " GPU(s)");
    }
    if (n_threads_batch < 0) {
        fail(ErrorKind::PARAMETER, "n_threads_batch must be >= 0 (0: the generation threads)");
    }
}

void Placement::apply(llama_model_params & mp) const {
    mp.n_gpu_layers = n_gpu_layers;  // llama.cpp: a negative value means all layers (auto without --fit)
    mp.main_gpu = main_gpu;
    mp.load_mode = (llama_load_mode) (checked_index(LOAD_MODE_NAMES, "load_mode", load_mode) - 1);
    mp.use_extra_bufts = repack;
}

void Placement::apply(llama_context_params & cp, int32_t n_threads) const {
    cp.n_threads_batch = n_threads_batch > 0 ? n_threads_batch : n_threads;
    cp.flash_attn_type = (llama_flash_attn_type) (checked_index(FLASH_ATTN_NAMES, "flash_attn", flash_attn) - 1);
    cp.type_k = KV_CACHE_TYPES[checked_index(KV_CACHE_TYPE_NAMES, "type_k", type_k)];
    cp.type_v = KV_CACHE_TYPES[checked_index(KV_CACHE_TYPE_NAMES, "type_v", type_v)];
}

std::vector<std::string> backend_devices() {
    std::vector<std::string> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        out.emplace_back(ggml_backend_dev_name(ggml_backend_dev_get(i)));
    }
    return out;
}

int32_t n_gpu_devices() {
    int32_t n = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        const auto type = ggml_backend_dev_type(ggml_backend_dev_get(i));
        n += type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU;
    }
    return n;
}
