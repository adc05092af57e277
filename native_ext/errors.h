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
};
constexpr const char * ERROR_KIND_NAMES[] = {"parameter", "context", "decode", "rollback", "load", "library", "closed"};
static_assert(count_of(ERROR_KIND_NAMES) == (size_t) ErrorKind::CLOSED + 1, "one name per ErrorKind");

struct EngineError : std::runtime_error {
    EngineError(ErrorKind kind, const std::string & message) : std::runtime_error(message), kind(kind) {}
    const char * kind_name() const { return ERROR_KIND_NAMES[(int) kind]; }
    ErrorKind kind;
};

// Thrown by a probe when the caller's interrupt check (Engine::set_interrupt_check) asked it to stop, after it has
// left the memories empty; bindings.cpp then raises the exception the Python signal handler raised.
struct Interrupted {};

[[noreturn]] inline void fail(ErrorKind kind, const std::string & message) { throw EngineError(kind, message); }

// Throws a DECODE error naming `what` when llama_process returned rc != 0.
inline void check_decode(int32_t rc, const char * what) {
    if (rc != 0) {
        fail(ErrorKind::DECODE, std::string(what) + " failed (llama_process returned " + std::to_string(rc) + ")");
    }
}
