// Name tables: each enum the Python side sees has one `constexpr const char * X_NAMES[]` next to
// it (StopReason, FinishReason, ChainPolicy, ErrorKind, column widths; the drafters' names are in
// their table, drafters.cpp); these helpers look names up in them.
#pragma once

#include <cstddef>
#include <string>

template <size_t N>
constexpr size_t count_of(const char * const (&)[N]) {
    return N;
}

// Index of `name` in `table`, or -1.
template <size_t N>
int name_index(const char * const (&table)[N], const std::string & name) {
    for (size_t i = 0; i < N; ++i) {
        if (name == table[i]) {
            return (int) i;
        }
    }
    return -1;
}

// "a", "b", "c" (for error messages)
template <size_t N>
std::string names_list(const char * const (&table)[N]) {
    std::string out;
    for (size_t i = 0; i < N; ++i) {
        out += (i ? ", \"" : "\"") + std::string(table[i]) + "\"";
    }
    return out;
}
