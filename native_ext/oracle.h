// What Engine::record_oracle records: a greedy generation decoded one token per step and, at
// every position g (the step that would start after g generated tokens), the draft every drafter
// of the recording list would propose there (through the Drafter interface, by DrafterId: the
// `sources` axis) and timings of every operation a speculative step is made of.
//
// Cost probes (oracle.cpp, Engine::record_oracle): at even positions a verify batch of k = 2 .. depth + 1
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
#include <utility>
#include <vector>

#include "columns.h"
#include "drafter.h"

// The record's schema, in the order Python sees it (_native.ORACLE_COLUMNS, record_oracle()'s
// dict): X(name, element type, width kind, fill). Per position [T] unless the width says
// otherwise; "sources" is S = N_DRAFTERS (a drafter left out of the recording, e.g. the MTP head
// of a model without one, keeps its entries padded), "depth" the oracle depth N, "topk" K;
// timings in ns. A drafter fills what it records (Draft): the n-gram look-up has no confidence,
// margin, top-k or per-decode times (NaN / -1).
#define MTP_ORACLE_COLUMNS(X)                                                                        \
    X(pos, int32_t, SCALAR, 0)                  /* n_past at the step start */                       \
    X(token, int32_t, SCALAR, -1)               /* the greedy token emitted there */                 \
    X(target_margin, float, SCALAR, NAN_F)      /* target top-1 minus top-2 logit of that token */   \
    X(cap, int32_t, SCALAR, 0)                  /* draft cap there: min(depth, budget, context) */   \
    X(draft, int32_t, SOURCES_DEPTH, -1)        /* each drafter's draft ids (at most cap) */         \
    X(draft_len, int32_t, SOURCES, 0)           /* its length (the MTP chain: < cap only at an end-of-generation token) */ \
    X(draft_eos, int8_t, SOURCES, 0)            /* the draft ends with an end-of-generation token */ \
    X(draft_prob, float, SOURCES_DEPTH, NAN_F)  /* draft confidence (MTP: the value compared with p_min) */ \
    X(draft_margin, float, SOURCES_DEPTH, NAN_F) /* draft top-1 minus top-2 logit */                 \
    X(topk_ids, int32_t, SOURCES_DEPTH_TOPK, -1)                                                     \
    X(topk_probs, float, SOURCES_DEPTH_TOPK, NAN_F)                                                  \
    X(t_verify_ns, int64_t, SCALAR, 0)          /* plain step: 1-row target decode (+ nextn row copy) */ \
    X(t_catchup_ns, int64_t, SCALAR, 0)         /* plain step: 1-row MTP catch-up */                 \
    X(t_follow_ns, int64_t, SCALAR, 0)          /* plain step: a draft model's decode of the row (0: none) */ \
    X(t_sample_ns, int64_t, SCALAR, 0)          /* plain step: argmax of 1 row, drafter bookkeeping */ \
    X(t_argmax_ns, int64_t, SCALAR, 0)          /* plain step: the argmax alone */                   \
    X(t_draft_ns, int64_t, SOURCES, 0)          /* the whole draft call of each drafter */           \
    X(t_draft_cum_ns, int64_t, SOURCES_DEPTH, -1) /* start of the draft call to the end of decode j (-1: not measured) */ \
    X(probe_k, int32_t, SCALAR, 0)              /* verify batch size probed there (0: none) */       \
    X(verify_after, int32_t, SCALAR, 0)         /* target batch decoded before the plain verify (-1: the prompt) */ \
    X(probe_verify_ns, int64_t, SCALAR, 0)      /* k-row target decode (+ nextn rows copy), graph built anew */ \
    X(probe_verify_reuse_ns, int64_t, SCALAR, 0) /* the same decode again right after (graph reused) */ \
    X(probe_catchup_ns, int64_t, SCALAR, 0)     /* k-row MTP catch-up decode */                      \
    X(probe_argmax_ns, int64_t, SCALAR, 0)      /* argmax over k rows */                             \
    X(probe_rollback_ns, int64_t, SCALAR, 0)    /* llama_memory_seq_rm of the target batch */        \
    X(tail_pos, int32_t, TAIL, 0)               /* after the generation: plain target decodes one */ \
    X(tail_verify_ns, int64_t, TAIL, 0)         /* after another (warm caches, reused graph) */

struct OracleRecord {
    int32_t depth = 0;  // N: draft length recorded per position
    int32_t topk = 0;   // K

    MTP_COLUMN_TABLE(MTP_ORACLE_COLUMNS)

    ColumnDims dims() const { return {(size_t) depth, (size_t) topk, (size_t) N_DRAFTERS}; }
    size_t rows() const { return pos.size(); }
    // Drops every row, keeping the widths.
    void clear() {
        OracleRecord fresh;
        fresh.depth = depth;
        fresh.topk = topk;
        *this = std::move(fresh);
    }

    // Appends a position with every column but the tail's padded; returns its index.
    size_t add_row() {
        add_padded_row();
        return rows() - 1;
    }
};
