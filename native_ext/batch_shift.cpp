// Engine::probe_batch_shift: the same tokens decoded on the target context once one row per decode, then for
// every k in k-row batches, each pass from an empty memory, so that what k-row batches write into the KV cache
// and the recurrent state accumulates as in a speculative run; each position's k-row logits compared with its
// one-row logits. The memories are cleared before and after: the probe leaves no trace in the next generation.
#include <algorithm>
#include <cmath>

#include "engine.h"
#include "errors.h"

namespace {

struct TopTwo {
    int32_t first = 0, second = 0;
};

TopTwo top_two(const float * logits, int32_t n_vocab) {
    TopTwo t{0, n_vocab > 1 ? 1 : 0};
    if (n_vocab > 1 && logits[1] > logits[0]) {
        std::swap(t.first, t.second);
    }
    for (int32_t i = 2; i < n_vocab; ++i) {
        if (logits[i] > logits[t.first]) {
            t.second = t.first;
            t.first = i;
        } else if (logits[i] > logits[t.second]) {
            t.second = i;
        }
    }
    return t;
}

}  // namespace

void Engine::decode_probe_rows(const std::vector<llama_token> & tokens, int32_t i0, int32_t n) {
    llama_batch_ext_clear(batch_tgt.get());
    add_target_rows(0, tokens.data() + i0, n, i0, /*logits*/ true);
    // llama_process directly: the batch-shape probe measures the kernels, not the hidden-state telemetry
    if (llama_process(ctx_tgt.get(), LLAMA_PROCESS_TYPE_DECODE, batch_tgt.get()) != 0) {
        clear_memories();
        fail(ErrorKind::DECODE, "the batch-shape probe's decode of " + std::to_string(n) + " rows at position " +
                                    std::to_string(i0) + " failed");
    }
}

void Engine::probe_batch_shift(const std::vector<llama_token> & tokens, const std::vector<int32_t> & ks,
                               BatchShiftRecord & out) {
    check_open();
    const int32_t P = (int32_t) tokens.size();
    // a batch within n_ubatch, and within the outputs the target context reserved (libllama aborts past them)
    const int32_t rows_max = (int32_t) std::min(llama_n_ubatch(ctx_tgt.get()), target_outputs());
    if (P < 2 || P > n_ctx_seq()) {
        fail(ErrorKind::PARAMETER, "the batch-shape probe needs 2 .. n_ctx_seq=" + std::to_string(n_ctx_seq()) +
                                       " tokens, got " + std::to_string(P));
    }
    for (int32_t k : ks) {
        if (k < 2 || k > std::min(P, rows_max)) {
            fail(ErrorKind::PARAMETER, "batch sizes must be between 2 and min(tokens, n_ubatch, the target's " +
                                           std::to_string(target_outputs()) + " outputs) = " +
                                           std::to_string(std::min(P, rows_max)) + ", got " + std::to_string(k));
        }
    }
    std::lock_guard<std::mutex> lk(run_mutex);
    end_generations();
    const int32_t V = llama_vocab_n_tokens(vocab), K = (int32_t) ks.size();
    out = BatchShiftRecord{};
    out.ks = ks;
    out.position.resize(P);
    out.top1.resize(P);
    out.margin.resize(P);
    out.margin_shift.assign((size_t) K * P, NAN);
    out.logit_shift.assign((size_t) K * P, NAN);
    out.flip.assign((size_t) K * P, 0);
    std::vector<int32_t> second(P);
    std::vector<float> one_row((size_t) P * V);

    clear_memories();
    for (int32_t i = 0; i < P; ++i) {
        if (interrupted()) {
            clear_memories();
            fail(ErrorKind::INTERRUPTED, "interrupted");
        }
        decode_probe_rows(tokens, i, 1);
        const float * l = llama_get_logits_ith(ctx_tgt.get(), 0);
        std::copy(l, l + V, one_row.begin() + (size_t) i * V);
        const TopTwo t = top_two(l, V);
        out.position[i] = i;
        out.top1[i] = t.first;
        second[i] = t.second;
        out.margin[i] = l[t.first] - l[t.second];
    }
    for (int32_t ki = 0; ki < K; ++ki) {
        const int32_t k = ks[ki];
        clear_memories();
        for (int32_t i0 = 0; i0 < P; i0 += k) {
            const int32_t n = std::min(k, P - i0);
            if (interrupted()) {
                clear_memories();
                fail(ErrorKind::INTERRUPTED, "interrupted");
            }
            decode_probe_rows(tokens, i0, n);
            if (n < k) {
                continue;  // a shorter last batch: another shape
            }
            for (int32_t j = 0; j < n; ++j) {
                const int32_t i = i0 + j;
                const float * l = llama_get_logits_ith(ctx_tgt.get(), j);
                const float * ref = one_row.data() + (size_t) i * V;
                float largest = 0.0f;
                for (int32_t v = 0; v < V; ++v) {
                    largest = std::max(largest, std::fabs(l[v] - ref[v]));
                }
                const size_t at = (size_t) ki * P + i;
                out.logit_shift[at] = largest;
                out.margin_shift[at] = std::fabs((l[out.top1[i]] - l[second[i]]) - out.margin[i]);
                out.flip[at] = argmax(l, V) != out.top1[i];
            }
        }
    }
    clear_memories();
}
