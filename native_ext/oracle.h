// What Engine::record_oracle records: a greedy generation decoded one token per step and, at
// every position g (the step that would start after g generated tokens), the drafts the engine
// would propose there and timings of every operation a speculative step is made of.
//
// Cost probes (engine.cpp, record_oracle): at even positions a verify batch of k = 2 .. depth + 1
// tokens [id_last, chain...] (round robin) is decoded on the target twice: right after the MTP
// chain (llama.cpp builds the compute graph anew and the caches hold the MTP head's data) and again
// at once (graph reused, caches warm); then its MTP catch-up, the argmax of its rows and the
// engine's rollback of k - 1 tokens (within the n_rs_seq snapshot slots: depth <= capacity) are
// timed. At odd positions the plain token is decoded once after the chain. After every probe
// decode the whole batch must leave the target memory, which the snapshot slots cannot do
// (llama.cpp's gated delta-net keeps snapshots of the states *inside* a batch, not of the state
// before it), so the target's recurrent state is saved before and restored after
// (llama_state_seq_{get,set}_data_ext, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) and the batch's KV cells
// are removed: the recorded greedy sequence is exactly plain decoding (tested).
#pragma once

#include <cstdint>
#include <vector>

struct OracleRecord {
    int32_t depth = 0;  // N: chain length recorded per position
    int32_t topk = 0;   // K

    // per position [T]
    std::vector<int32_t> pos;              // n_past at the step start
    std::vector<int32_t> token;            // the greedy token emitted there
    std::vector<float> target_margin;      // target top-1 minus top-2 logit of that token
    std::vector<int32_t> cap;              // draft cap there: min(depth, budget, context)
    std::vector<int32_t> chain_len;        // MTP chain length (< cap only at an end-of-generation token)
    std::vector<int8_t> chain_eos;         // the chain ends with an end-of-generation token
    std::vector<int32_t> ngram_len;        // n-gram draft length (before truncation to cap)
    std::vector<int8_t> ngram_eos;         // the n-gram draft ends with an end-of-generation token
    // per position and depth [T][N]
    std::vector<int32_t> chain;            // MTP draft ids
    std::vector<float> chain_prob;         // draft confidence (the value compared with p_min)
    std::vector<float> chain_margin;       // draft top-1 minus top-2 logit
    std::vector<int32_t> ngram;            // n-gram draft ids (truncated to cap)
    std::vector<int32_t> topk_ids;         // [T][N][K]
    std::vector<float> topk_probs;         // [T][N][K]

    // timings per position, ns
    std::vector<int64_t> t_verify_ns;      // plain step: 1-row target decode (+ nextn row copy)
    std::vector<int64_t> t_catchup_ns;     // plain step: 1-row MTP catch-up
    std::vector<int64_t> t_sample_ns;      // plain step: argmax of 1 row, drafter bookkeeping
    std::vector<int64_t> t_argmax_ns;      // plain step: the argmax alone
    std::vector<int64_t> t_draft_ns;       // the whole MTP chain call
    std::vector<int64_t> t_draft_cum_ns;   // [T][N]: start of the chain call to the end of decode j
    std::vector<int64_t> t_ngram_ns;       // the n-gram look-up
    std::vector<int32_t> probe_k;          // verify batch size probed there (0: none)
    std::vector<int32_t> verify_after;     // size of the target batch decoded before the plain verify (-1: the prompt)
    std::vector<int64_t> probe_verify_ns;  // k-row target decode (+ nextn rows copy), graph built anew
    std::vector<int64_t> probe_verify_reuse_ns; // the same decode again right after (llama.cpp reuses the graph)
    std::vector<int64_t> probe_catchup_ns; // k-row MTP catch-up decode
    std::vector<int64_t> probe_argmax_ns;  // argmax over k rows
    std::vector<int64_t> probe_rollback_ns;// llama_memory_seq_rm of the target batch

    // after the generation: plain target decodes one after another (warm caches, reused graph)
    std::vector<int32_t> tail_pos;
    std::vector<int64_t> tail_verify_ns;

    size_t rows() const { return pos.size(); }

    void clear() { *this = OracleRecord{depth, topk}; }

    size_t add_row() {
        const size_t N = (size_t) depth, K = (size_t) topk;
        pos.push_back(0); token.push_back(-1); target_margin.push_back(NAN_F); cap.push_back(0);
        chain_len.push_back(0); chain_eos.push_back(0); ngram_len.push_back(0); ngram_eos.push_back(0);
        chain.insert(chain.end(), N, -1);
        chain_prob.insert(chain_prob.end(), N, NAN_F);
        chain_margin.insert(chain_margin.end(), N, NAN_F);
        ngram.insert(ngram.end(), N, -1);
        topk_ids.insert(topk_ids.end(), N * K, -1);
        topk_probs.insert(topk_probs.end(), N * K, NAN_F);
        t_verify_ns.push_back(0); t_catchup_ns.push_back(0); t_sample_ns.push_back(0); t_argmax_ns.push_back(0); t_draft_ns.push_back(0);
        t_draft_cum_ns.insert(t_draft_cum_ns.end(), N, -1);
        t_ngram_ns.push_back(0); probe_k.push_back(0); verify_after.push_back(0);
        probe_verify_ns.push_back(0); probe_verify_reuse_ns.push_back(0); probe_catchup_ns.push_back(0); probe_argmax_ns.push_back(0);
        probe_rollback_ns.push_back(0);
        return rows() - 1;
    }

    static constexpr float NAN_F = __builtin_nanf("");
};
