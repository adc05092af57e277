// Column schemas: the telemetry trace (telemetry.h) and the oracle record (oracle.h) each declare
// their columns once, as an X-macro of (name, element type, width kind, fill value). The structs'
// vectors, their padded add_row(), the bindings' columns() and the exported TRACE_COLUMNS /
// ORACLE_COLUMNS are all generated from those lists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "names.h"

// How many values a column holds per row.
enum class Width : int8_t {
    SCALAR = 0,      // one
    DEPTH = 1,       // D: one per draft depth
    DEPTH1 = 2,      // D + 1: one per verified row
    DEPTH_TOPK = 3,  // D x K: top-k per draft depth
    SOURCES = 4,     // S: one per drafter (DRAFTER_TABLE)
    TAIL = 5,        // a column of its own length, not one entry per row
    SOURCES_DEPTH = 6,       // S x D: per drafter, per draft depth
    SOURCES_DEPTH_TOPK = 7,  // S x D x K: per drafter, top-k per draft depth
};
constexpr const char * WIDTH_NAMES[] = {"", "depth", "depth+1", "depth*topk", "sources", "tail",
                                        "sources*depth", "sources*depth*topk"};
static_assert(count_of(WIDTH_NAMES) == (size_t) Width::SOURCES_DEPTH_TOPK + 1, "one name per Width");

// The sizes the width kinds refer to.
struct ColumnDims {
    size_t depth = 0, topk = 0, sources = 0;

    // the per-row shape of a column (TAIL: none)
    std::vector<size_t> inner(Width w) const {
        switch (w) {
            case Width::DEPTH: return {depth};
            case Width::DEPTH1: return {depth + 1};
            case Width::DEPTH_TOPK: return {depth, topk};
            case Width::SOURCES: return {sources};
            case Width::SOURCES_DEPTH: return {sources, depth};
            case Width::SOURCES_DEPTH_TOPK: return {sources, depth, topk};
            default: return {};
        }
    }

    // values per row
    size_t per_row(Width w) const {
        size_t n = 1;
        for (const size_t d : inner(w)) {
            n *= d;
        }
        return n;
    }
};

template <typename T> constexpr const char * dtype_name();
template <> constexpr const char * dtype_name<int8_t>() { return "int8"; }
template <> constexpr const char * dtype_name<int32_t>() { return "int32"; }
template <> constexpr const char * dtype_name<int64_t>() { return "int64"; }
template <> constexpr const char * dtype_name<float>() { return "float32"; }

// One schema entry, as exported to Python: (name, numpy dtype, width kind).
struct ColumnInfo {
    const char * name;
    const char * dtype;
    Width width;
};

constexpr float NAN_F = __builtin_nanf("");

// Inside a struct with `ColumnDims dims() const`: the column vectors, add_row() appending one
// padded row, for_each_column(f) calling f(name, vector, width) in schema order, and a
// static constexpr `schema` array of ColumnInfo.
#define MTP_COLUMN_MEMBER(name, type, width, fill) std::vector<type> name;
#define MTP_COLUMN_PAD(name, type, width, fill) \
    if (Width::width != Width::TAIL) name.insert(name.end(), d.per_row(Width::width), (type) (fill));
#define MTP_COLUMN_VISIT(name, type, width, fill) f(#name, name, Width::width);
#define MTP_COLUMN_INFO(name, type, width, fill) ColumnInfo{#name, dtype_name<type>(), Width::width},

#define MTP_COLUMN_TABLE(LIST)                                             \
    LIST(MTP_COLUMN_MEMBER)                                                \
    void add_padded_row() {                                                \
        const ColumnDims d = dims();                                       \
        LIST(MTP_COLUMN_PAD)                                               \
    }                                                                      \
    template <typename F> void for_each_column(F && f) const { LIST(MTP_COLUMN_VISIT) } \
    static constexpr ColumnInfo schema[] = {LIST(MTP_COLUMN_INFO)};
