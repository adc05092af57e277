#include "draft_length.h"

#include <algorithm>

#include "errors.h"

int32_t DraftLengthSchedule::length(int32_t n_max) const {
    if (n_max <= 0) {
        return 0;
    }
    switch (kind) {
        case ScheduleKind::FIXED:
            return n_max;
        case ScheduleKind::HEURISTIC:
            return current < 0 ? n_max : std::min(current, n_max);
        case ScheduleKind::WINDOW: {
            if (recent.empty()) {
                return n_max;
            }
            int32_t deepest = 0;
            for (const Outcome & o : recent) {
                deepest = std::max(deepest, o.drafted);
            }
            int32_t best = 0;  // the deepest depth whose acceptance, and every shallower one's, is at least one half
            for (int32_t d = 1; d <= deepest; ++d) {
                int32_t tried = 0, kept = 0;
                for (const Outcome & o : recent) {
                    tried += o.drafted >= d;
                    kept += o.accepted >= d;
                }
                if (2 * kept < tried) {
                    break;
                }
                best = d;
            }
            return std::min(n_max, std::max(1, best == deepest ? best + 1 : best));
        }
    }
    return n_max;
}

void DraftLengthSchedule::observe(int32_t drafted, int32_t accepted, int32_t n_max) {
    if (drafted <= 0) {
        return;  // a step that drafted nothing tells no rule anything
    }
    if (kind == ScheduleKind::HEURISTIC) {
        const int32_t now = length(n_max);
        current = accepted == drafted ? std::min(n_max, now + 2) : std::max(1, now - 1);
    } else if (kind == ScheduleKind::WINDOW) {
        recent.push_back({drafted, accepted});
        if ((int32_t) recent.size() > window) {
            recent.pop_front();
        }
    }
}

ScheduleKind parse_schedule(const std::string & name, int32_t window) {
    if (window < 1) {
        fail(ErrorKind::PARAMETER, "the schedule's window must be at least 1 step, got " + std::to_string(window));
    }
    for (size_t i = 0; i < count_of(SCHEDULE_NAMES); ++i) {
        if (name == SCHEDULE_NAMES[i]) {
            return (ScheduleKind) i;
        }
    }
    fail(ErrorKind::PARAMETER, "unknown schedule \"" + name + "\": expected fixed, heuristic or window");
}
