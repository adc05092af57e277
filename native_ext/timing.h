// Clocks in nanoseconds, shared by the engine, the drafters and the oracle.
//
// now_ns() reads the monotonic wall clock, or, inside a ClockScope asking for it, the calling
// thread's CPU time (CLOCK_THREAD_CPUTIME_ID): with one compute thread, llama.cpp computes on the
// calling thread, so CPU time measures the work without the time the thread spent descheduled on
// a busy machine (Session.open(clock="cpu")).
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

inline thread_local bool tl_cpu_clock = false;

inline int64_t now_ns() {
    if (tl_cpu_clock) {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The monotonic wall clock whatever clock now_ns() reads (a vDSO call, not a system call): llama.cpp's own
// statistics clock (ggml_time_us), for the drafters' t_*_ns counters.
inline int64_t wall_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Selects the clock of now_ns() on this thread for its lifetime.
struct ClockScope {
    explicit ClockScope(bool cpu) : saved(tl_cpu_clock) { tl_cpu_clock = cpu; }
    ~ClockScope() { tl_cpu_clock = saved; }
    ClockScope(const ClockScope &) = delete;
    ClockScope & operator=(const ClockScope &) = delete;
    bool saved;
};
