// Every error the engine raises, typed in one place. bindings.cpp's exception translator raises the
// package's exception for the kind's name below (mtp_explorer.core.errors.ENGINE_ERROR_KINDS).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "names.h"

enum class ErrorKind : int8_t {
    PARAMETER = 0,  // a bad argument
    CONTEXT = 1,    // the prompt is longer than the context window
    DECODE = 2,     // a llama_process call failed (prefill, verify, catch-up, draft, probe)
    ROLLBACK = 3,   // the target memory could not be rolled back or restored
    LOAD = 4,       // the model or a context could not be created
    LIBRARY = 5,    // libllama lacks the nextn API
    CLOSED = 6,     // the session is closed
    // the caller's interrupt check (Engine::set_interrupt_check) stopped a probe or a prompt's decode; bindings.cpp
    // raises the exception the Python signal handler raised in its place
    INTERRUPTED = 7,
};
constexpr const char * ERROR_KIND_NAMES[] = {"parameter", "context", "decode", "rollback", "load", "library", "closed",
                                             "interrupted"};
static_assert(count_of(ERROR_KIND_NAMES) == (size_t) ErrorKind::INTERRUPTED + 1, "one name per ErrorKind");

struct EngineError : std::runtime_error {
    EngineError(ErrorKind kind, const std::string & message) : std::runtime_error(message), kind(kind) {}
    const char * kind_name() const { return ERROR_KIND_NAMES[(int) kind]; }
    ErrorKind kind;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string & message) { throw EngineError(kind, message); }

// Throws a DECODE error naming `what` when llama_process returned rc != 0.
inline void check_decode(int32_t rc, const char * what) {
    if (rc != 0) {
        fail(ErrorKind::DECODE, std::string(what) + " failed (llama_process returned " + std::to_string(rc) + ")");
    }
}
