// How a model is placed on devices and how its contexts compute, under llama.cpp's names and
// defaults (-ngl, -mg, -lm, -fa, -ctk/-ctv, -tb, -nr), with the name tables the Python side validates
// against (exported by bindings.cpp) and the conversions into llama.cpp's parameter structs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

// -fa values; index - 1 is the llama_flash_attn_type (auto = -1, off = 0, on = 1)
constexpr const char * FLASH_ATTN_NAMES[] = {"auto", "off", "on"};
// -ctk / -ctv values (common/arg.cpp's kv_cache_types), as ggml names them
constexpr const char * KV_CACHE_TYPE_NAMES[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"};
// -lm values; index - 1 is the llama_load_mode
constexpr const char * LOAD_MODE_NAMES[] = {"auto", "none", "mmap", "mlock", "mmap+mlock", "dio"};

struct Placement {
    int32_t n_gpu_layers = -1;       // -ngl: -1 auto (llama.cpp's default), -2 all, else this many layers
    int32_t main_gpu = 0;            // -mg
    std::string load_mode = "auto";  // -lm (llama-cpp-python's use_mmap=True/False is "mmap"/"none")
    std::string flash_attn = "auto"; // -fa
    std::string type_k = "f16";      // -ctk
    std::string type_v = "f16";      // -ctv
    int32_t n_threads_batch = 0;     // -tb: 0 = the generation threads (llama.cpp's default)
    bool repack = true;              // --repack / -nr --no-repack: extra buffer types (weights repacked for the CPU's GEMM)

    // Throws a parameter error naming the allowed values for a name outside its table, or a
    // main_gpu this build's devices do not have.
    void validate() const;
    void apply(llama_model_params & mp) const;
    void apply(llama_context_params & cp, int32_t n_threads) const;
};

// The backend devices this build of llama.cpp sees ("CPU", "CUDA0", ...), and how many are GPUs.
std::vector<std::string> backend_devices();
int32_t n_gpu_devices();
