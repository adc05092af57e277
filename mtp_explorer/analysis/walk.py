"""The policy walk: the steps a drafting policy takes along an oracle trace, rule for rule as ``Engine::step`` takes
them (each position's draft cap from the budget and the context, each drafter's proposal as its replay in
:mod:`~mtp_explorer.analysis.replay` gives it, the ``n_min`` drop, the longest accepted prefix, the chain policy's
choice), and every drafter's proposal at them. :func:`~mtp_explorer.analysis.simulate.simulate` prices the steps,
:mod:`~mtp_explorer.analysis.grid` walks many settings at once, :mod:`~mtp_explorer.analysis.compare` walks a real
trace's steps.

Which drafters a ``drafter=`` mode runs and how a chain picks its draft come from the registry
(:func:`mtp_explorer.core.drafters.mode`); the chain policies are replayed by :data:`CHAIN_POLICY_REPLAYS`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..core import drafters
from ..core.drafters import DrafterMode
from ..core.errors import ParameterError
from ..core.settings import DraftSettings
from .oracle import OracleTrace
from .replay import STOP, Candidate, DrafterReplay, DrafterState, ReplayApproximate
from .schedules import Schedule, StepOutcome


# -- policies -----------------------------------------------------------------------------------------
def check_policy(
    oracle: OracleTrace, n_max: int | DraftSettings, p_min, n_min, drafter: str | DrafterMode, max_tokens
) -> DraftSettings:
    """The settings to replay (``n_max`` a :class:`DraftSettings`: those, the loose arguments at their defaults),
    checked against the oracle, or a :class:`ParameterError` naming what is wrong with them."""
    if not isinstance(oracle, OracleTrace):
        raise ParameterError(f"expected an OracleTrace (Session.record_oracle), got {type(oracle).__name__}")
    if isinstance(n_max, DraftSettings):
        if (p_min, n_min, drafter, max_tokens) != (0.0, 0, drafters.DEFAULT_MODE, None):
            raise ParameterError("give DraftSettings or n_max, p_min, n_min, drafter and max_tokens, not both")
        settings = n_max
    else:
        settings = DraftSettings(
            n_max=n_max,
            p_min=p_min,
            n_min=n_min,
            drafter=drafter,  # type: ignore[arg-type]
            max_tokens=oracle.max_tokens if max_tokens is None else max_tokens,
        )
    settings = settings.check(oracle.limits)
    _warn_approximate(oracle, settings)
    return settings


def _warn_approximate(oracle: OracleTrace, settings: DraftSettings) -> None:
    """:class:`ReplayApproximate` where a drafter's replay says it cannot be exact for these settings
    (:meth:`DrafterReplay.approximation`)."""
    mode = settings.mode
    if settings.n_max <= 0:
        return
    for spec in mode.drafters:
        why = oracle.replay(spec).approximation(mode, settings.n_max)
        if why:
            warnings.warn(f"the replay of drafter={mode.name!r} is approximate: {why}", ReplayApproximate, stacklevel=4)


def _best(usable: Sequence[list[bool]], expected: Sequence[list[float]]) -> Callable[[int], int]:
    """``best``: the usable draft with the highest expected accepted length, the earlier drafter on a tie (the
    first drafter's, unusable, if none is). Expected lengths are >= 0."""
    order = range(len(usable))

    def pick(g: int) -> int:
        chosen, best = 0, -1.0
        for i in order:
            if usable[i][g]:
                e = expected[i][g]
                if e > best:
                    chosen, best = i, e
        return chosen

    return pick


def _first(usable: Sequence[list[bool]], expected: Sequence[list[float]]) -> Callable[[int], int]:
    """``first`` (llama.cpp's): the first usable draft in the mode's order (the first drafter's, unusable, if none
    is); the drafters after it are not asked (:data:`CHAIN_POLICY_ASKS_ALL`)."""
    order = range(len(usable))

    def pick(g: int) -> int:
        for i in order:
            if usable[i][g]:
                return i
        return 0

    return pick


#: How each chain policy (:data:`~mtp_explorer.core.schema.CHAIN_POLICIES`) picks the draft to verify. Given
#: every drafter's usable flags and expected accepted lengths per position (lists, indexed by drafter of the
#: mode then position; the walk fills in the expectations of drafters that learn as it reaches a position), it
#: returns the choice at a position: the index of the chosen drafter in the mode.
CHAIN_POLICY_REPLAYS: Mapping[str, Callable[[Sequence[list[bool]], Sequence[list[float]]], Callable[[int], int]]] = {
    "first": _first,
    "best": _best,
}
#: Whether a chain policy asks every drafter at every step (``best``), or stops at the chosen usable draft
#: (``first``: the drafters after it neither draft, nor cost a draft call, nor learn from the step).
CHAIN_POLICY_ASKS_ALL: Mapping[str, bool] = {"first": False, "best": True}


def _choose(mode: DrafterMode) -> Callable:
    try:
        return CHAIN_POLICY_REPLAYS[mode.policy]
    except KeyError:
        raise ParameterError(
            f"the simulator cannot replay the chain policy {mode.policy!r} (it knows {sorted(CHAIN_POLICY_REPLAYS)})"
        ) from None


def replays_of(oracle: OracleTrace, mode: DrafterMode) -> tuple[DrafterReplay, ...]:
    return tuple(oracle.replay(spec) for spec in mode.drafters)


# -- per-position caps --------------------------------------------------------------------------------
def draft_caps(oracle: OracleTrace, n_max, max_tokens: int, server_slot: bool = False):
    """Draft cap and its reason at every position (broadcast over leading setting axes); a server slot drafts
    nothing before its first token is sampled (cap 0 at position 0)."""
    c = oracle.columns
    g = np.arange(oracle.n_positions)
    budget = max_tokens - g - 1
    ctx = int(oracle.settings["n_ctx"]) - c["pos"].astype(np.int64) - 2
    n_max = np.asarray(n_max)[..., None]
    cap = np.broadcast_to(n_max, np.broadcast(n_max, g).shape).astype(np.int64)
    reason = np.full(cap.shape, STOP["n_max"], dtype=np.int8)
    reason = np.where(budget < cap, STOP["budget"], reason)
    cap = np.minimum(cap, budget)
    reason = np.where(ctx < cap, STOP["context"], reason)
    cap = np.minimum(cap, ctx)
    if server_slot:
        cap = np.where(g == 0, 0, cap)
    return np.maximum(cap, 0), reason


# -- the steps of one policy ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Steps:
    """The steps a policy takes (one entry each) and every drafter's proposal at them."""

    g: np.ndarray  #: tokens generated before the step (its oracle position)
    chosen: np.ndarray  #: whose draft was verified (or, none usable, offered): index in the mode
    n_drafted: np.ndarray
    n_accepted: np.ndarray
    stop_reason: np.ndarray
    drafter: np.ndarray  #: the engine's drafter index of a verified draft, -1 none
    expected_accepted: np.ndarray
    cap: np.ndarray
    head: np.ndarray  #: a drafter's model followed the target (catch-up, cold caches)
    proposals: tuple[Candidate, ...]  #: each drafter of the mode, at the steps
    expected: np.ndarray  #: [drafters of the mode, steps]: each one's expected accepted length
    replayed: np.ndarray  #: tokens of the step before verified again from its checkpoint (0: none)

    @property
    def verify_rows(self) -> np.ndarray:
        """Target rows each step verifies: a checkpoint replay's, then id_last and the drafts."""
        return self.replayed + self.n_drafted + 1

    @property
    def n_decodes(self) -> np.ndarray:
        """Model decodes of the steps' draft calls."""
        return sum(p.decodes for p in self.proposals)  # type: ignore[return-value]


def run_policy(
    oracle: OracleTrace,
    policy: DraftSettings,
    start_steps: Sequence[int] | None = None,
    server_slot: bool = False,
    checkpoints: bool = False,
) -> Steps:
    """The per-step outcome of a policy: steps start at the positions it visits, or (``start_steps``
    given) at those positions (aligned prediction for :func:`compare`); ``checkpoints``: each partial acceptance is
    followed by a replay step that drafts nothing (:func:`simulate`)."""
    replays = replays_of(oracle, policy.mode)
    cap, reason = draft_caps(oracle, policy.n_max, policy.max_tokens, server_slot)
    active = policy.n_max > 0
    cands = [r.candidate(cap, reason, policy.p_min, policy.n_min, active) for r in replays]
    matches = [r.match_len for r in replays]
    running = [active and r.available for r in replays]
    T_end = min(oracle.n_positions, policy.max_tokens)
    stateful = [r.state if r.stateful else None for r in replays]  # type: ignore[attr-defined]
    if len(replays) == 1 and start_steps is None and stateful[0] is None:
        # the choice does not depend on the history: vectorised, then follow the path
        path, replayed = _follow(cands[0], matches[0], T_end, checkpoints)
        chosen = np.zeros(len(path), dtype=np.int64)
        acc = np.minimum(cands[0].n_drafted[path], matches[0][path])
        expected = (
            replays[0].expectation().along(path, cands[0].n_raw, matches[0], acc)
            if running[0]
            else np.full(len(path), np.nan)
        )[None, :]
    else:
        # sequential: the policy's choice may read the drafters' running statistics
        walker = _Walk(
            cands,
            matches,
            [r.expectation() if on else None for r, on in zip(replays, running)],
            _choose(policy.mode),
            CHAIN_POLICY_ASKS_ALL[policy.mode.policy],
            stateful,
        )
        path, chosen, expected, replayed = walker.run(T_end, start_steps, checkpoints)
        # a stateful drafter's proposals are those its state made along the walk
        cands = [c if st is None else st.candidate() for c, st in zip(cands, stateful)]
    return _gather(policy.mode, replays, cands, matches, cap, path, chosen, expected, replayed)


def length_candidates(oracle: OracleTrace, policy: DraftSettings, server_slot: bool = False):
    """For a mode of one drafter whose proposals do not depend on its history: its replay, its proposal at every
    position under every draft cap ``0 .. n_max`` (a :class:`Candidate` of ``[n_max + 1, T]`` arrays) and the caps; a
    :class:`ParameterError` for other modes (a chain, or a drafter with state along the path)."""
    replays = replays_of(oracle, policy.mode)
    if len(replays) != 1 or replays[0].stateful:
        raise ParameterError(
            f"draft-length schedules replay a single drafter without state along the path (draft-mtp, ngram-simple, "
            f"the draft models and heads), not drafter={policy.mode.name!r}"
        )
    lengths = np.arange(policy.n_max + 1)
    cap, reason = draft_caps(oracle, lengths, policy.max_tokens, server_slot)
    cand = replays[0].candidate(cap, reason, policy.p_min, policy.n_min, policy.n_max > 0)
    full = Candidate(*(np.broadcast_to(getattr(cand, f.name), cap.shape) for f in dataclasses.fields(Candidate)))
    return replays[0], full, cap


def _at_lengths(cand: Candidate, at: np.ndarray) -> Candidate:
    """The proposals with the draft cap ``at[g]`` at every position ``g``."""
    cols = np.arange(len(at))
    return Candidate(*(getattr(cand, f.name)[at, cols] for f in dataclasses.fields(Candidate)))


def steps_at_lengths(
    policy: DraftSettings, replay: DrafterReplay, cand: Candidate, cap: np.ndarray, path: np.ndarray, at: np.ndarray
) -> Steps:
    """The steps at the positions of ``path``, the draft cap at every position ``g`` being ``at[g]`` (``cand`` and
    ``cap`` of every cap: :func:`length_candidates`)."""
    chosen = _at_lengths(cand, at)
    match = replay.match_len
    acc = np.minimum(chosen.n_drafted[path], match[path])
    expected = np.full(len(path), np.nan)
    if policy.n_max > 0 and replay.available:
        expected = replay.expectation().along(path, chosen.n_raw, match, acc)
    zeros = np.zeros(len(path), dtype=np.int64)
    return _gather(
        policy.mode, (replay,), [chosen], [match], cap[at, np.arange(len(at))], path, zeros, expected[None, :], zeros
    )


def run_schedule(
    oracle: OracleTrace, policy: DraftSettings, schedule: Schedule, server_slot: bool = False
) -> tuple[Steps, np.ndarray]:
    """The steps of a single drafter whose draft cap at each step is ``schedule``'s (at most ``policy.n_max``), and the
    length each step asked for (see :func:`length_candidates` for the drafters it replays)."""
    replay, cand, cap = length_candidates(oracle, policy, server_slot)
    n_drafted, match = cand.n_drafted.tolist(), replay.match_len.tolist()
    T_end = min(oracle.n_positions, policy.max_tokens)
    path, lengths, g = [], [], 0
    while g < T_end:
        length = schedule.length()
        d = n_drafted[length][g]
        a = min(d, match[g])
        schedule.observe(StepOutcome(length, d, a))
        path.append(g)
        lengths.append(length)
        g += a + 1
    P, asked = np.asarray(path, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    at = np.full(oracle.n_positions, policy.n_max, dtype=np.int64)
    at[P] = asked
    steps = steps_at_lengths(policy, replay, cand, cap, P, at)
    return steps, asked


def _asked_along(mode: DrafterMode, cands: Sequence[Candidate], path: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """[drafters of the mode, steps]: the drafter was asked at the step by the policy (every one, or under a policy
    that stops at the chosen usable draft, those up to it)."""
    D = len(cands)
    if D == 1 or CHAIN_POLICY_ASKS_ALL[mode.policy]:
        return np.ones((D, len(path)), dtype=bool)
    usable = np.stack([np.broadcast_to(c.usable, c.n_raw.shape)[path] for c in cands])
    stopped = usable[chosen, np.arange(len(path))]
    return (np.arange(D)[:, None] <= chosen[None, :]) | ~stopped[None, :]


def only_asked(cand: Candidate, asked: np.ndarray) -> Candidate:
    """A proposal where the policy asked the drafter; nothing (not asked, no decodes) elsewhere."""
    return Candidate(
        np.where(asked, cand.n_raw, 0),
        cand.stop,
        cand.dropped & asked,
        cand.asked & asked,
        np.where(asked, cand.decodes, 0),
    )


def _follow(cand: Candidate, match: np.ndarray, T_end: int, checkpoints: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The positions a single drafter's steps start at, and the tokens each verifies again (``checkpoints``: the
    step after a partial acceptance replays its accepted tokens and correction, drafting nothing)."""
    acc = np.minimum(cand.n_drafted, match)
    nxt = (np.arange(len(match)) + acc + 1).tolist()
    partial = (acc < cand.n_drafted).tolist() if checkpoints else None
    path, replayed, g, replay = [], [], 0, 0
    while g < T_end:
        path.append(g)
        replayed.append(replay)
        if replay:
            g, replay = g + 1, 0
        else:
            replay = int(acc[g]) + 1 if checkpoints and partial[g] else 0  # type: ignore[index]
            g = nxt[g]
    return np.asarray(path, dtype=np.int64), np.asarray(replayed, dtype=np.int64)


class _Walk:
    """Steps taken one by one: at each, the expected lengths of the drafters that learn, the policy's choice,
    then those drafters observe the outcome."""

    def __init__(
        self,
        cands: Sequence[Candidate],
        matches: Sequence[np.ndarray],
        estimators: list,
        policy,
        asks_all: bool = True,
        states: Sequence[DrafterState | None] = (),
    ) -> None:
        T = len(matches[0])
        self.asks_all = asks_all
        self.states = list(states) if any(st is not None for st in states) else []
        self.matches = matches
        self.usable = [c.usable.tolist() for c in cands]
        self.n_raw = [c.n_raw.tolist() for c in cands]
        self.dropped = [c.dropped.tolist() for c in cands]
        self.match = [m.tolist() for m in matches]
        # stateless estimates known at every position at once; the others asked (and told) at every step
        self.fixed = [
            e.per_position(c.n_raw) if e is not None and e.stateless else None for e, c in zip(estimators, cands)
        ]
        self.expected = [f.tolist() if f is not None else [math.nan] * T for f in self.fixed]
        self.learning = [(d, e) for d, e in enumerate(estimators) if e is not None and not e.stateless]
        self.pick = policy(self.usable, self.expected)

    def run(self, T_end: int, starts: Sequence[int] | None, checkpoints: bool = False):
        path, chosen, replayed, replay = [], [], [], 0
        starts = list(starts) if starts is not None else None
        n_raw, dropped, match, pick = self.n_raw, self.dropped, self.match, self.pick
        expects = [(self.expected[d], est.expected, n_raw[d]) for d, est in self.learning]
        observers = [(d, est.observe, n_raw[d], match[d]) for d, est in self.learning]
        g, i, last = (starts[0] if starts else 0), 0, -1
        while g < T_end:
            if replay:  # a checkpoint replay: nothing drafted or asked; the drafter verified last hears the replayed
                for d, st in enumerate(self.states):  # tokens as accepted, as llama.cpp tells it only now
                    if st is not None:
                        st.told(g, True, d == last, replay, replay=True)
                path.append(g)
                chosen.append(0)
                replayed.append(replay)
                replay, i = 0, i + 1
                if starts is None:
                    g += 1
                elif i < len(starts):
                    g = starts[i]
                else:
                    break
                continue
            if self.states:
                self._ask(g)
            for out, expect, proposed in expects:
                out[g] = expect(g, proposed[g])
            c = pick(g)
            a = 0 if dropped[c][g] else n_raw[c][g]
            if match[c][g] < a:
                a = match[c][g]
            last_asked = c if not self.asks_all and self.usable[c][g] else len(n_raw) - 1
            for d, observe, proposed, matched in observers:
                if d <= last_asked:  # a drafter the policy did not ask learns nothing from the step
                    observe(g, proposed[g], matched[g], a + 1)
            if self.usable[c][g]:
                last = c
            restored = checkpoints and self.usable[c][g] and a < n_raw[c][g]
            for d, st in enumerate(self.states):
                if st is not None:
                    st.told(g, bool(st.asked[g]), d == last and not restored, a)
            path.append(g)
            chosen.append(c)
            replayed.append(0)
            if restored:
                replay = a + 1
            i += 1
            if starts is not None:
                if i >= len(starts):
                    break
                g = starts[i]
            else:
                g = g + a + 1
        P = np.asarray(path, dtype=np.int64)
        expected = (
            np.stack(
                [
                    (f if f is not None else np.asarray(e, dtype=np.float64))[P]
                    for f, e in zip(self.fixed, self.expected)
                ]
            )
            if path
            else np.zeros((len(n_raw), 0))
        )
        return P, np.asarray(chosen, dtype=np.int64), expected, np.asarray(replayed, dtype=np.int64)

    def _ask(self, g: int) -> None:
        """The stateful drafters propose at ``g`` in the mode's order (under a policy that stops at the first usable
        draft, none after it is asked), and their proposals join the walk's lists."""
        for d, st in enumerate(self.states):
            if st is not None:
                st.propose(g)
                n = int(st.n_raw[g])
                self.n_raw[d][g], self.dropped[d][g] = n, n < st.n_min
                self.usable[d][g] = bool(st.asked[g]) and n >= st.n_min and n > 0
                self.match[d][g] = int(self.matches[d][g])
            if not self.asks_all and self.usable[d][g]:
                break


def _gather(mode: DrafterMode, replays, cands, matches, cap, path, chosen, expected, replayed) -> Steps:
    """Per-step arrays along a path from the chosen drafters' proposals (none at a checkpoint replay)."""

    def pick(arrays) -> np.ndarray:
        out = np.asarray(arrays[0])[path].astype(np.result_type(*arrays), copy=False)
        for i in range(1, len(arrays)):
            rows = chosen == i
            out[rows] = np.asarray(arrays[i])[path[rows]]
        return out

    replay = replayed > 0
    n_d = np.where(replay, 0, pick([c.n_drafted for c in cands]))
    acc = np.minimum(n_d, pick(matches))
    index = np.array([s.index for s in mode.drafters], dtype=np.int64)
    src = np.where(pick([c.usable for c in cands]) & ~replay, index[chosen], -1).astype(np.int8)
    proposals = tuple(c.take(path) for c in cands)
    head = model_follows(replays, proposals, (len(path),))  # a model follows the target whether or not it is asked
    asked = _asked_along(mode, cands, path, chosen) & ~replay[None, :]
    proposals = tuple(only_asked(p, a) for p, a in zip(proposals, asked))
    e = expected[chosen, np.arange(len(path))]
    return Steps(
        g=path,
        chosen=chosen,
        n_drafted=n_d,
        n_accepted=acc,
        stop_reason=np.where(replay, STOP["n_max"], pick([c.stop for c in cands])).astype(np.int8),
        drafter=src,
        expected_accepted=np.where(src >= 0, e, np.nan),
        cap=np.where(replay, 0, cap[path]),
        head=head,
        proposals=proposals,
        expected=expected,
        replayed=replayed,
    )


def model_follows(replays: Sequence[DrafterReplay], proposals: Sequence[Candidate], shape) -> np.ndarray:
    """Where a drafter's model follows the target (its catch-up runs, the target's caches are cold)."""
    followers = [p.asked for r, p in zip(replays, proposals) if r.follows_target]
    return functools.reduce(np.logical_or, followers, np.zeros(shape, dtype=bool))
