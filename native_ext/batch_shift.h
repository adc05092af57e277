// What Engine::probe_batch_shift measures: how far the target's logits move when the same positions
// are decoded in k-row batches (a verify batch of n_max + 1 rows) instead of one row at a time (plain
// decoding). llama.cpp's kernels depend on the batch shape: a GEMM instead of a GEMV, for Q4_K from
// 4 rows on a repacked q4_K_8x8 GEMM, a recurrent layer's chunked scan. So greedy speculative output
// may take the other token wherever the one-row top-2 margin is below this shift.
#pragma once

#include <cstdint>
#include <vector>

// The widest batch the probe decodes: one sequence's rows standing for several slots' verify rows together (the
// target context reserves as many outputs, at least: Engine::create_target_context).
constexpr int32_t BATCH_SHIFT_ROWS_MAX = 64;

// Every position from 0 is probed, in whole passes: the shift accumulates through the KV cache and the recurrent
// state as it does in a run, and its dependence on the KV length (e.g. llama.cpp's attention over more than 256
// cells) is seen where it starts.
struct BatchShiftRecord {
    std::vector<int32_t> ks;            // [K] the batch sizes probed
    std::vector<int32_t> position;      // [P] each probed position
    std::vector<int32_t> top1;          // [P] the one-row argmax at each position
    std::vector<float> margin;          // [P] its one-row top-1 minus top-2 logit
    std::vector<float> margin_shift;    // [K, P] |change of that top-1 minus top-2| in the k-row batch (NaN: the
                                        //        position fell in a shorter last batch)
    std::vector<float> logit_shift;     // [K, P] the largest |change| of any logit
    std::vector<uint8_t> flip;          // [K, P] the k-row argmax differs from the one-row argmax
};
