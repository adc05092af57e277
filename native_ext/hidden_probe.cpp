#include "hidden_probe.h"

#include <cmath>
#include <cstring>

#include "ggml-backend.h"
#include "ggml.h"

bool HiddenProbe::callback(ggml_tensor * t, bool ask, void * user_data) {
    auto * self = static_cast<HiddenProbe *>(user_data);
    const bool match = self->active && std::strcmp(ggml_get_name(t), self->node_name.c_str()) == 0;
    if (ask) {
        return match;
    }
    if (!match || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        return true;
    }
    const int64_t n_embd = t->ne[0];
    const int64_t n_rows = ggml_nrows(t);
    const float * data = nullptr;
    if (t->buffer && ggml_backend_buffer_is_host(t->buffer)) {
        data = static_cast<const float *>(t->data);
    } else {
        self->scratch.resize((size_t) n_embd * n_rows);
        ggml_backend_tensor_get(t, self->scratch.data(), 0, ggml_nbytes(t));
        data = self->scratch.data();
    }
    for (int64_t r = 0; r < n_rows; ++r) {
        double acc = 0.0;
        const float * row = data + r * n_embd;
        for (int64_t i = 0; i < n_embd; ++i) {
            acc += (double) row[i] * row[i];
        }
        self->row_norms.push_back((float) std::sqrt(acc));
    }
    return true;
}
