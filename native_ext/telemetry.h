// Per-step telemetry in columnar buffers: one row per verify step, depth-indexed columns padded
// to the session's depth capacity (-1 for ids, NaN for floats).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

struct Telemetry {
    int32_t depth = 0;  // D: the session's n_max capacity
    int32_t topk = 0;   // K

    std::vector<int32_t> step, pos, n_drafted, n_accepted, correction, rollback, rs_slot;
    std::vector<int32_t> n_max, n_min;
    std::vector<float> p_min;
    std::vector<int8_t> stop_reason;
    std::vector<int32_t> drafted;          // [row][D]
    std::vector<float> draft_prob;         // [row][D]
    std::vector<int32_t> topk_ids;         // [row][D][K]
    std::vector<float> topk_probs;         // [row][D][K]
    std::vector<int32_t> target_tokens;    // [row][D + 1]
    std::vector<float> h_norm_target;      // [row][D + 1]
    std::vector<float> h_norm_draft;       // [row][D]
    std::vector<float> draft_target_cos;   // [row][D]
    std::vector<int64_t> t_catchup_ns, t_draft_ns, t_verify_ns, t_sample_ns;
    std::vector<int8_t> drafter;           // whose draft was verified: 0 mtp, 1 ngram, -1 none
    std::vector<float> expected_accepted;  // that drafter's expected accepted length for its draft
    std::vector<int32_t> candidate_len;    // [row][N_SOURCES]: each drafter's proposal length (-1: not asked)
    std::vector<float> candidate_expected; // [row][N_SOURCES]: its expected accepted length (NaN: not asked)

    static constexpr int32_t n_sources = 2;

    size_t rows() const { return step.size(); }

    void clear() { *this = Telemetry{depth, topk}; }

    // Appends a row with every depth-indexed column padded; returns its index.
    size_t add_row() {
        const size_t D = (size_t) depth, K = (size_t) topk;
        step.push_back(0); pos.push_back(0); n_drafted.push_back(0); n_accepted.push_back(0);
        correction.push_back(-1); rollback.push_back(0); rs_slot.push_back(-1);
        n_max.push_back(0); n_min.push_back(0); p_min.push_back(0.0f); stop_reason.push_back(0);
        drafted.insert(drafted.end(), D, -1);
        draft_prob.insert(draft_prob.end(), D, NAN);
        topk_ids.insert(topk_ids.end(), D * K, -1);
        topk_probs.insert(topk_probs.end(), D * K, NAN);
        target_tokens.insert(target_tokens.end(), D + 1, -1);
        h_norm_target.insert(h_norm_target.end(), D + 1, NAN);
        h_norm_draft.insert(h_norm_draft.end(), D, NAN);
        draft_target_cos.insert(draft_target_cos.end(), D, NAN);
        t_catchup_ns.push_back(0); t_draft_ns.push_back(0); t_verify_ns.push_back(0); t_sample_ns.push_back(0);
        drafter.push_back(-1); expected_accepted.push_back(NAN);
        candidate_len.insert(candidate_len.end(), n_sources, -1);
        candidate_expected.insert(candidate_expected.end(), n_sources, NAN);
        return rows() - 1;
    }
};
