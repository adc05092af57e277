// Draft-length schedules: each step's draft cap chosen from how the steps before it went, instead of one fixed n_max.
// They are the explorer's own (llama.cpp 0.3.36 drafts with a fixed --spec-draft-n-max); the what-if replays the same
// rules on an oracle (mtp_explorer/analysis/schedules.py), and a greedy run equals its replay.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "names.h"

enum class ScheduleKind : int8_t {
    FIXED = 0,      // n_max at every step
    HEURISTIC = 1,  // from n_max: +2 after a step whose drafts were all accepted, -1 after a rejection, within [1, n_max]
    WINDOW = 2,     // the deepest depth the last `window` drafting steps accepted at least half the time
};
constexpr const char * SCHEDULE_NAMES[] = {"fixed", "heuristic", "window"};
static_assert(count_of(SCHEDULE_NAMES) == (size_t) ScheduleKind::WINDOW + 1, "one name per ScheduleKind");

// One generation's schedule (a sequence's): length() before a step, observe() after it.
class DraftLengthSchedule {
public:
    DraftLengthSchedule() = default;
    DraftLengthSchedule(ScheduleKind kind, int32_t window) : kind(kind), window(window) {}

    // the next step's draft cap at the live n_max (0 when n_max is 0: not drafting)
    int32_t length(int32_t n_max) const;
    // a step that drafted `drafted` tokens (after the n_min drop) of which `accepted` were accepted
    void observe(int32_t drafted, int32_t accepted, int32_t n_max);

private:
    struct Outcome {
        int32_t drafted, accepted;
    };
    ScheduleKind kind = ScheduleKind::FIXED;
    int32_t window = 8;
    int32_t current = -1;        // the heuristic's length (-1: n_max, before any drafting step)
    std::deque<Outcome> recent;  // the window's drafting steps
};

// A schedule's kind from its name (a parameter error naming the known ones otherwise), and its window checked.
ScheduleKind parse_schedule(const std::string & name, int32_t window);
