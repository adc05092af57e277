#include "logits_scan.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

constexpr int32_t CHUNK = 256;  // logits per chunk: the chunk's maximum is taken before any of them is looked at

// Four floats in one 128-bit vector register (SSE on x86-64), compared lane by lane.
typedef float f4 __attribute__((vector_size(16)));

// The largest logit of [t0, t1) (-inf if none is larger: NaN never wins).
float chunk_max(const float * logits, int32_t t0, int32_t t1) {
    const f4 lowest = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    f4 m[4] = {lowest, lowest, lowest, lowest};  // 16 running maxima, in four registers
    int32_t t = t0;
    for (; t + 16 <= t1; t += 16) {
        for (int32_t r = 0; r < 4; ++r) {
            f4 x;
            std::memcpy(&x, logits + t + 4 * r, sizeof(x));
            m[r] = x > m[r] ? x : m[r];
        }
    }
    float best = -INFINITY;
    for (int32_t r = 0; r < 4; ++r) {
        for (int32_t j = 0; j < 4; ++j) {
            best = m[r][j] > best ? m[r][j] : best;
        }
    }
    for (; t < t1; ++t) {
        best = logits[t] > best ? logits[t] : best;
    }
    return best;
}

}  // namespace

llama_token argmax(const float * logits, int32_t n_vocab) {
    llama_token best = 0;
    float best_val = -INFINITY;
    for (int32_t t0 = 0; t0 < n_vocab; t0 += CHUNK) {
        const int32_t t1 = std::min(t0 + CHUNK, n_vocab);
        const float m = chunk_max(logits, t0, t1);
        if (m > best_val) {  // the first logit equal to the chunk's maximum
            best_val = m;
            best = (llama_token) (std::find(logits + t0, logits + t1, m) - logits);
        }
    }
    return best;
}

void top_logits(const float * logits, int32_t n_vocab, int32_t k, int32_t * ids, float * vals) {
    int32_t n = 0;  // kept so far, sorted
    for (int32_t t0 = 0; t0 < n_vocab; t0 += CHUNK) {
        const int32_t t1 = std::min(t0 + CHUNK, n_vocab);
        if (n == k && !(chunk_max(logits, t0, t1) > vals[k - 1])) {
            continue;
        }
        for (int32_t t = t0; t < t1; ++t) {
            const float v = logits[t];
            if (n == k && !(v > vals[k - 1])) {
                continue;
            }
            int32_t i = n < k ? n++ : k - 1;  // the last kept leaves when all are kept
            for (; i > 0 && vals[i - 1] < v; --i) {
                vals[i] = vals[i - 1];
                ids[i] = ids[i - 1];
            }
            vals[i] = v;
            ids[i] = t;
        }
    }
}
