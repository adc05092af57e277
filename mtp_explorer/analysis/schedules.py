"""Draft-length schedules: the draft cap of each step chosen from what the steps before it drafted and accepted, instead
of one fixed ``n_max``. They are the explorer's own: llama.cpp 0.3.36 drafts with a fixed ``n_max`` (its
``--spec-draft-n-max``), and llama-server cannot run them. The engine runs the named ones (``generate(...,
schedule="heuristic")``, ``native_ext/draft_length.cpp``), and a greedy run drafts and accepts what their replay here
says.

- ``"fixed"``: ``n_max`` at every step (llama.cpp's behaviour, the default).
- ``"heuristic"``: the rule Hugging Face's assisted generation and Gemma's documentation describe: start at ``n_max``;
  after a step whose drafts were all accepted, two more (at most ``n_max``), after one with a rejection, one fewer (at
  least 1); a step that drafted nothing leaves the length as it was.
- ``"window"``: over the last ``window`` steps that drafted, the acceptance at each depth ``d`` (the share of the steps
  that drafted ``d`` tokens or more whose first ``d`` were all accepted); the next length is the deepest ``d`` whose
  acceptance is at least one half (at least 1), or one deeper than any step of the window drafted when every depth it
  drafted passed (so that the length can grow again); ``n_max`` until a step has drafted.
- a callable ``rule(history, n_max) -> length``: the user's own, given the :class:`StepOutcome` of every step so far.

Every rule's length is within ``[1, n_max]`` (a callable's within ``[0, n_max]``); the draft is further cut by the
budget and the context, as a fixed ``n_max`` is.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence

from ..core import native
from ..core.errors import ParameterError
from ..core.settings import DEFAULT_WINDOW, SCHEDULES, check_schedule

__all__ = [
    "SCHEDULES",
    "DEFAULT_WINDOW",
    "StepOutcome",
    "Schedule",
    "Fixed",
    "Heuristic",
    "Window",
    "Custom",
    "EngineRule",
    "schedule",
]


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """One step as a schedule sees it: the length it asked for, the tokens drafted (after the budget, the context and
    the drafter's own stops) and the tokens accepted."""

    length: int
    drafted: int
    accepted: int


class Schedule(abc.ABC):
    """A draft-length schedule over one generation: :meth:`length` is the next step's draft cap, :meth:`observe` tells
    it how a step went. A new one per generation (:func:`schedule`)."""

    name: str

    def __init__(self, n_max: int) -> None:
        self.n_max = n_max

    @abc.abstractmethod
    def length(self) -> int:
        """The next step's draft cap."""

    def observe(self, step: StepOutcome) -> None:  # noqa: B027 (a no-op for schedules that do not learn)
        """A step ended."""


class EngineRule(Schedule):
    """A named rule as the engine runs it: the what-if drives the engine's own ``DraftLengthSchedule``
    (``native_ext/draft_length.cpp``), so a replay and a real run follow one implementation."""

    def __init__(self, n_max: int, window: int = DEFAULT_WINDOW) -> None:
        super().__init__(n_max)
        self._rule = native.DraftLengthSchedule(self.name, window)

    def length(self) -> int:
        return int(self._rule.length(self.n_max))

    def observe(self, step: StepOutcome) -> None:
        self._rule.observe(step.drafted, step.accepted, self.n_max)


class Fixed(EngineRule):
    name = "fixed"


class Heuristic(EngineRule):
    name = "heuristic"


class Window(EngineRule):
    name = "window"


class Custom(Schedule):
    """The user's rule, given every step so far: ``rule(history, n_max) -> length`` within ``[0, n_max]``."""

    name = "custom"

    def __init__(self, n_max: int, rule: Callable[[Sequence[StepOutcome], int], int]) -> None:
        super().__init__(n_max)
        self.rule = rule
        self.history: list[StepOutcome] = []

    def length(self) -> int:
        length = self.rule(tuple(self.history), self.n_max)
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.n_max:
            raise ParameterError(f"a schedule's length must be an int within [0, n_max={self.n_max}], got {length!r}")
        return length

    def observe(self, step: StepOutcome) -> None:
        self.history.append(step)


ScheduleSpec = str | Callable[[Sequence[StepOutcome], int], int]


def schedule(spec: ScheduleSpec, n_max: int, window: int = DEFAULT_WINDOW) -> Schedule:
    """A new :class:`Schedule` for one generation at ``n_max``: ``spec`` one of :data:`SCHEDULES` or a callable."""
    name = check_schedule(spec, window, custom=True)
    if name == "custom":
        return Custom(n_max, spec)  # type: ignore[arg-type]
    if name == "window":
        return Window(n_max, window)
    return Heuristic(n_max) if name == "heuristic" else Fixed(n_max)
