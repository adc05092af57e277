// Per-step telemetry in columnar buffers: one row per verify step of one sequence, depth-indexed
// columns padded to the session's depth capacity (-1 for ids, NaN for floats). With several
// sequences in a step (n_parallel > 1) each has its row; the phase times and the batch columns
// (batch_step, n_active, verify_rows, draft_rows) are the step's, the same in each.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "columns.h"
#include "drafter.h"

// The trace schema, in the order Python sees it (_native.TRACE_COLUMNS, Engine.columns()):
// X(name, element type, width kind, fill value of a padded entry).
#define MTP_TRACE_COLUMNS(X)                                                                         \
    X(step, int32_t, SCALAR, 0)                   /* step index */                                   \
    X(pos, int32_t, SCALAR, 0)                    /* n_past at the step start */                     \
    X(n_max, int32_t, SCALAR, 0)                  /* the live parameters of the step */              \
    X(p_min, float, SCALAR, 0.0f)                                                                    \
    X(n_min, int32_t, SCALAR, 0)                                                                     \
    X(drafted, int32_t, DEPTH, -1)                /* the verified draft */                           \
    X(n_drafted, int32_t, SCALAR, 0)                                                                 \
    X(n_accepted, int32_t, SCALAR, 0)                                                                \
    X(draft_prob, float, DEPTH, NAN_F)            /* MTP confidence of each drafted token */         \
    X(topk_ids, int32_t, DEPTH_TOPK, -1)          /* MTP top-k per depth (telemetry on) */           \
    X(topk_probs, float, DEPTH_TOPK, NAN_F)                                                          \
    X(target_tokens, int32_t, DEPTH1, -1)         /* the target's token at each verified row */      \
    X(stop_reason, int8_t, SCALAR, 0)             /* STOP_REASON_NAMES */                            \
    X(correction, int32_t, SCALAR, -1)            /* the token the target emitted after the drafts */\
    X(rollback, int32_t, SCALAR, 0)               /* rejected drafts removed from the memory */      \
    X(rs_slot, int32_t, SCALAR, -1)               /* recurrent snapshot used (-1: none) */           \
    X(replayed, int32_t, SCALAR, 0)               /* last step's tokens verified again (checkpoints) */ \
    X(replay_agreed, int32_t, SCALAR, -1)         /* of them, sampled again as they were (-1: none) */ \
    X(h_norm_target, float, DEPTH1, NAN_F)        /* pre-norm residual norm of each target row */    \
    X(h_norm_draft, float, DEPTH, NAN_F)          /* the same for each MTP draft row */              \
    X(draft_target_cos, float, DEPTH, NAN_F)      /* cosine of draft and target h_nextn rows */      \
    X(t_catchup_ns, int64_t, SCALAR, 0)                                                              \
    X(t_draft_ns, int64_t, SCALAR, 0)                                                                \
    X(t_verify_ns, int64_t, SCALAR, 0)                                                               \
    X(t_sample_ns, int64_t, SCALAR, 0)                                                               \
    X(drafter, int8_t, SCALAR, -1)                /* whose draft was verified: a DrafterId, -1 none */   \
    X(expected_accepted, float, SCALAR, NAN_F)    /* its expected accepted length */                 \
    X(candidate_len, int32_t, SOURCES, -1)        /* each drafter's proposal length (-1: not asked) */ \
    X(candidate_expected, float, SOURCES, NAN_F)  /* its expected accepted length (NaN: not asked) */ \
    X(batch_step, int32_t, SCALAR, 0)             /* the engine's step, shared by the sequences in it */ \
    X(n_active, int32_t, SCALAR, 0)               /* sequences in that step */                       \
    X(verify_rows, int32_t, SCALAR, 0)            /* rows of its target batch (every sequence's) */  \
    X(draft_rows, int32_t, DEPTH, -1)             /* rows of each MTP draft decode (every sequence's) */

struct Telemetry {
    int32_t depth = 0;  // D: the session's n_max capacity
    int32_t topk = 0;   // K

    MTP_COLUMN_TABLE(MTP_TRACE_COLUMNS)

    ColumnDims dims() const { return {(size_t) depth, (size_t) topk, (size_t) N_DRAFTERS}; }
    size_t rows() const { return step.size(); }
    // Drops every row, keeping the widths.
    void clear() {
        Telemetry fresh;
        fresh.depth = depth;
        fresh.topk = topk;
        *this = std::move(fresh);
    }

    // Appends a row with every column padded; returns its index.
    size_t add_row() {
        add_padded_row();
        return rows() - 1;
    }
};
