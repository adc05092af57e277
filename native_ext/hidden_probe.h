// Observes one named node of a context's compute graph and keeps the L2 norm of each row.
// Used to read the pre-norm residual stream (the tensor entering the final RMS norm), whose
// norm varies, unlike the post-norm h_nextn rows that llama.cpp hands to the MTP head.
#pragma once

#include <string>
#include <vector>

struct ggml_tensor;

struct HiddenProbe {
    std::string node_name;          // e.g. "l_out-3" (target) or "mtp_post_ffn-4" (MTP head)
    bool active = false;            // observe only while true: no graph split otherwise
    std::vector<float> row_norms;   // one entry per row of every observed ubatch, in order
    std::vector<float> scratch;

    void start() { row_norms.clear(); active = true; }
    void stop() { active = false; }

    // ggml_backend_sched_eval_callback
    static bool callback(ggml_tensor * t, bool ask, void * user_data);
};
