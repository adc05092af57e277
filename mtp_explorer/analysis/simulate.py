"""Exact replay of drafting policies on an oracle trace, in numpy, without the model.

:func:`simulate` turns an :class:`~mtp_explorer.analysis.oracle.OracleTrace` and a policy (``n_max``,
``p_min``, ``n_min``, drafter) into a :class:`SimTrace`: the steps the engine would take, each with
its draft, accepted count, stop reason and predicted phase times. It follows ``Engine::step``
rule for rule (draft cap from budget and context, each drafter's proposal as its replay in
:mod:`~mtp_explorer.analysis.replay` gives it, ``n_min`` drop, longest accepted prefix, the chain
policy's choice), so under greedy decoding its per-step counts equal a real run's, up to
floating-point argmax ties between the real run's batched numerics and the oracle's: use
:func:`compare` to check a real trace step by step and to classify every difference.

Which drafters a ``drafter=`` mode runs and how a chain picks its draft come from the registry
(:func:`mtp_explorer.core.drafters.mode`); the chain policies are replayed by :data:`CHAIN_POLICY_REPLAYS`.

:func:`simulate_grid` evaluates many settings over many oracles at once (vectorised over settings
for single-drafter modes), for sweeps; a single :func:`simulate` call costs about a millisecond,
cheap enough for a slider.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..core import drafters, metrics
from ..core.drafters import DRAFTER_SPECS, DrafterMode
from ..core.errors import ParameterError
from ..core.options import is_full_telemetry
from ..core.schema import DRAFTERS, PHASES, STOP_REASONS, Dims, empty_columns
from ..core.settings import DraftSettings
from ..core.trace import Trace
from .batch_shift import BatchShift, tolerance_of
from .oracle import OracleTrace
from .profile import Costs, resolve_costs, with_costs
from .replay import STOP, Candidate, DrafterReplay, DrafterState, ReplayApproximate

DEFAULT_TOL_LOGIT = 1e-3
"""The tie tolerance in logits where the batch-shape shift was not measured (an oracle without one)."""


class SimTrace(Trace):
    """A :class:`Trace` predicted by :func:`simulate`: the same columns, with the timing columns
    predicted by the oracle's cost model (``h_norm_*`` and ``draft_target_cos`` are NaN, and
    ``target_tokens`` past the first rejection are -1: the oracle only knows the greedy path).

    Extra per-step arrays in :attr:`sim`: ``n_decodes`` (model decodes of the draft calls), ``g``
    (tokens generated before the step). ``summary()["tokens_per_second"]`` is the prediction.
    """

    def __init__(self, *, oracle: OracleTrace, policy: dict[str, Any], sim: dict[str, np.ndarray], **kw):
        super().__init__(**kw)
        self.oracle = oracle
        self.policy = policy
        self.sim = sim

    @property
    def predicted_tokens_per_second(self) -> float:
        return self.summary()["tokens_per_second"]

    def uncertainty(self) -> dict[str, Any]:
        """Where the prediction may not hold: the positions whose one-row top-2 margin is within the oracle's
        measured batch-shape tolerance (a real run's verify batch may emit the other token there, and from there
        on it follows another text), and the predicted totals as ranges (:func:`uncertainty_of`)."""
        c = self.columns
        return uncertainty_of(
            self.oracle,
            int(self.policy["n_max"]),
            self.sim["g"],
            c["n_drafted"],
            c["n_accepted"],
            self.summary()["tokens_per_second"],
            len(self.tokens),
        )

    def ceiling_tokens_per_second(self) -> float:
        """The bound with every draft accepted: each step drafts ``n_max`` tokens and keeps them all."""
        return ceiling_tokens_per_second(
            self.oracle, int(self.policy["n_max"]), self.policy["drafter"], int(self.policy["max_tokens"])
        )


# -- policies -----------------------------------------------------------------------------------------
def _check_policy(
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


def _replays(oracle: OracleTrace, mode: DrafterMode) -> tuple[DrafterReplay, ...]:
    return tuple(oracle.replay(spec) for spec in mode.drafters)


# -- per-position caps --------------------------------------------------------------------------------
def _caps(oracle: OracleTrace, n_max, max_tokens: int, server_slot: bool = False):
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
class _Steps:
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


def _run_policy(
    oracle: OracleTrace,
    policy: DraftSettings,
    start_steps: Sequence[int] | None = None,
    server_slot: bool = False,
    checkpoints: bool = False,
) -> _Steps:
    """The per-step outcome of a policy: steps start at the positions it visits, or (``start_steps``
    given) at those positions (aligned prediction for :func:`compare`); ``checkpoints``: each partial acceptance is
    followed by a replay step that drafts nothing (:func:`simulate`)."""
    replays = _replays(oracle, policy.mode)
    cap, reason = _caps(oracle, policy.n_max, policy.max_tokens, server_slot)
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


def _asked_along(mode: DrafterMode, cands: Sequence[Candidate], path: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """[drafters of the mode, steps]: the drafter was asked at the step by the policy (every one, or under a policy
    that stops at the chosen usable draft, those up to it)."""
    D = len(cands)
    if D == 1 or CHAIN_POLICY_ASKS_ALL[mode.policy]:
        return np.ones((D, len(path)), dtype=bool)
    usable = np.stack([np.broadcast_to(c.usable, c.n_raw.shape)[path] for c in cands])
    stopped = usable[chosen, np.arange(len(path))]
    return (np.arange(D)[:, None] <= chosen[None, :]) | ~stopped[None, :]


def _only_asked(cand: Candidate, asked: np.ndarray) -> Candidate:
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
                        st.told(g, True, d == last, replay)
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


def _gather(mode: DrafterMode, replays, cands, matches, cap, path, chosen, expected, replayed) -> _Steps:
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
    head = _head(replays, proposals, (len(path),))  # a model follows the target whether or not it is asked
    asked = _asked_along(mode, cands, path, chosen) & ~replay[None, :]
    proposals = tuple(_only_asked(p, a) for p, a in zip(proposals, asked))
    e = expected[chosen, np.arange(len(path))]
    return _Steps(
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


def _head(replays: Sequence[DrafterReplay], proposals: Sequence[Candidate], shape) -> np.ndarray:
    """Where a drafter's model follows the target (its catch-up runs, the target's caches are cold)."""
    followers = [p.asked for r, p in zip(replays, proposals) if r.follows_target]
    return functools.reduce(np.logical_or, followers, np.zeros(shape, dtype=bool))


def _draft_ns(oracle: OracleTrace, replays, proposals, cap_pos, pos):
    """The draft phase: every asked drafter's draft call."""
    total = 0.0
    for replay, proposal in zip(replays, proposals):
        total = total + replay.draft_ns(oracle.cost, proposal, cap_pos, pos)
    return total


def _follow_ns(oracle: OracleTrace, replays, pos):
    """What following each step's verify batch costs the drafters besides the MTP catch-up (a draft model's decode)."""
    return sum((r.follow_ns(oracle.cost, pos) for r in replays), 0.0)


def _phase_times(oracle: OracleTrace, steps: _Steps, mode: DrafterMode) -> dict[str, np.ndarray]:
    """Predicted time of each phase of each step (the verify graph reused when ``k`` repeats)."""
    k = steps.verify_rows  # a checkpoint replay's rows have logits and are sampled again
    rows = np.where(is_full_telemetry(oracle.settings.get("telemetry")), k, steps.replayed + steps.n_accepted + 1)
    fresh = np.ones(len(k), dtype=bool)
    fresh[1:] = k[1:] != k[:-1]
    pos = oracle.columns["pos"][steps.g].astype(np.float64)
    replays = _replays(oracle, mode)
    draft = _draft_ns(oracle, replays, steps.proposals, steps.cap > 0, pos)
    return oracle.cost.phase_ns(
        steps.head, k, draft, rows, steps.n_drafted - steps.n_accepted, pos, fresh, _follow_ns(oracle, replays, pos)
    )


def _total_ns(phases: Mapping[str, np.ndarray]):
    return functools.reduce(operator.add, phases.values())


def ceiling_tokens_per_second(
    oracle: OracleTrace,
    n_max: int,
    drafter: str | DrafterMode = drafters.DEFAULT_MODE,
    max_tokens: int | None = None,
    *,
    costs: Costs | None = None,
) -> float:
    """Tokens/s if every draft were accepted: the fastest run whose steps each keep every token they draft, each step
    drafting as many tokens as pays best (0 to ``n_max``, cut by the budget and the context as the engine cuts it),
    from the oracle's cost model (or ``costs``: a :class:`~mtp_explorer.CostProfile`, the path of a saved one, or a
    :class:`~mtp_explorer.CostModel`). No policy at this ``n_max`` is predicted faster (``n_max = 0``: plain
    decoding). Where a verify of more rows costs more per token than a plain decode, as a large vocabulary's
    output layer can make it, that run drafts less than ``n_max`` at some steps."""
    mode = drafters.mode(drafter)
    oracle = with_costs(oracle, costs)
    max_tokens = oracle.max_tokens if max_tokens is None else int(max_tokens)
    T = min(oracle.n_positions, max_tokens)
    if T == 0:
        return math.nan
    cap_at = _caps(oracle, n_max, max_tokens)[0][:T]
    pos = oracle.columns["pos"][:T].astype(np.float64)
    replays = _replays(oracle, mode)
    lengths = range(int(cap_at.max()) + 1)
    step_ns = np.full((len(lengths), T), np.inf)
    for j in lengths:  # every position's step drafting j tokens, all kept (its graph reused: fresh_ns added apart)
        cap = np.minimum(cap_at, j)
        full = [r.full(cap, n_max > 0) for r in replays]
        head = _head(replays, full, cap.shape)
        if not CHAIN_POLICY_ASKS_ALL[mode.policy]:  # the first drafter's full draft is verified, the others not asked
            full = [f if i == 0 else _only_asked(f, np.zeros(cap.shape, bool)) for i, f in enumerate(full)]
        parts = oracle.cost.phase_ns(
            head,
            cap + 1,
            _draft_ns(oracle, replays, full, cap > 0, pos),
            cap + 1,
            0,
            pos,
            False,
            _follow_ns(oracle, replays, pos),
        )
        total = sum(np.broadcast_to(np.asarray(v, dtype=np.float64), (T,)) for v in parts.values())
        step_ns[j] = np.where(j <= cap_at, total, np.inf)
    return T / (_fastest_ns(step_ns, float(oracle.cost.fresh_ns)) / 1e9)


def _fastest_ns(step_ns: np.ndarray, fresh_ns: float) -> float:
    """The least time to generate every position when a step at position ``g`` drafting ``j`` tokens (all kept)
    costs ``step_ns[j, g]`` and goes on at ``g + j + 1``, plus ``fresh_ns`` where its verify size differs from the
    previous step's (the first step's graph is always built)."""
    J, T = step_ns.shape
    switch = np.where(np.eye(J, dtype=bool), 0.0, fresh_ns)  # [previous j, j]
    best = np.zeros((T + 1, J))  # best[g, p]: the least time from position g on, the previous step having drafted p
    ahead, lanes = np.arange(J) + 1, np.arange(J)
    for g in range(T - 1, -1, -1):
        rest = step_ns[:, g] + best[np.minimum(g + ahead, T), lanes]  # [j]: this step drafting j, then the best
        best[g] = (switch + rest[None, :]).min(axis=1)
    return float((step_ns[:, 0] + fresh_ns + best[np.minimum(ahead, T), lanes]).min())


# -- simulate -----------------------------------------------------------------------------------------
def simulate(
    oracle: OracleTrace,
    n_max: int | DraftSettings = 3,
    p_min: float = 0.0,
    n_min: int = 0,
    *,
    drafter: str | DrafterMode = drafters.DEFAULT_MODE,
    max_tokens: int | None = None,
    costs: Costs | None = None,
    server_slot: bool | None = None,
    checkpoints: bool = False,
) -> SimTrace:
    """Replay a policy on an oracle trace: the steps the engine would take, and predicted timings.

    ``n_max <= oracle.depth`` (or ``n_max`` a :class:`~mtp_explorer.DraftSettings`, e.g. a trace's
    :attr:`~mtp_explorer.Trace.draft_settings`, greedy); ``max_tokens`` defaults to (and may not exceed) the oracle's
    budget; ``drafter`` is one of :data:`~mtp_explorer.core.drafters.DRAFTER_MODES`. The timings come from the
    oracle's cost model, or from ``costs``: a :class:`~mtp_explorer.CostProfile` measured on the machine to
    predict (:func:`~mtp_explorer.profile_costs`), the path of a saved one, or a :class:`~mtp_explorer.CostModel`.
    ``server_slot=True`` replays the request as a llama-server slot runs it: the first token is sampled from the
    prompt before any draft (the first step is plain; its ``n_max`` column is 0), every later draft is cut to the
    budget left minus one, as here (``None``: the settings' :attr:`~mtp_explorer.DraftSettings.server_slot`).
    ``checkpoints=True`` replays the run of a session without snapshot slots (``Session.open(n_rs_seq=0)``, as llama.cpp
    runs a chain of look-ups on a recurrent target): each partial acceptance is followed by a step that verifies its
    accepted tokens and correction again, drafting nothing (``replayed``), priced as a verify of those rows and one
    more; the checkpoint's save and restore are not priced. Bad input (a profile of another model or shallower than the
    oracle included) raises :class:`~mtp_explorer.ParameterError`.
    """
    policy = _check_policy(oracle, n_max, p_min, n_min, drafter, max_tokens)
    server_slot = policy.server_slot if server_slot is None else bool(server_slot)
    oracle = with_costs(oracle, costs)
    steps = _run_policy(oracle, policy, server_slot=server_slot, checkpoints=checkpoints)
    return _build_trace(oracle, steps, policy, server_slot, checkpoints)


def _build_trace(
    oracle: OracleTrace, steps: _Steps, policy: DraftSettings, server_slot: bool = False, checkpoints: bool = False
) -> SimTrace:
    """The steps as a trace: the schema's columns, filled with what the oracle knows."""
    S = len(steps.g)
    cols = empty_columns(S, Dims(depth=int(oracle.settings["capacity"]), topk=oracle.dims.topk))
    _fill_step(cols, oracle, steps, policy)
    if server_slot:
        cols["n_max"][steps.g == 0] = 0
    _fill_drafts(cols, _replays(oracle, policy.mode), steps, oracle.depth)
    _fill_verification(cols, oracle, steps, checkpoints)
    _fill_candidates(cols, steps, policy.mode)
    _fill_batch(cols, steps, policy.mode)
    times = _phase_times(oracle, steps, policy.mode)
    for phase in PHASES:
        cols[f"t_{phase}_ns"][:] = np.rint(times[phase])
    n_tok = int(steps.g[-1] + steps.n_accepted[-1] + 1) if S else 0
    pieces = oracle.pieces[:n_tok]
    settings = (
        dict(oracle.settings)
        | policy.to_dict()
        | {"simulated": True, "server_slot": server_slot, "checkpoints": checkpoints}
    )
    return SimTrace(
        oracle=oracle,
        policy=policy.to_dict(),
        sim={"n_decodes": steps.n_decodes, "g": steps.g},
        prompt=oracle.prompt,
        prompt_tokens=list(oracle.prompt_tokens),
        tokens=[int(t) for t in oracle.tokens[:n_tok]],
        text="".join(pieces),
        pieces=list(pieces),
        columns=cols,
        finish_reason=oracle.finish_reason if n_tok == oracle.n_positions else "budget",
        settings=settings,
        model=dict(oracle.model),
        t_prefill_ns=0,
    )


def _fill_step(cols: dict[str, np.ndarray], oracle: OracleTrace, steps: _Steps, policy: DraftSettings) -> None:
    cols["step"][:] = np.arange(len(steps.g))
    cols["pos"][:] = oracle.columns["pos"][steps.g]
    cols["n_max"][:] = policy.n_max
    cols["p_min"][:] = policy.p_min
    cols["n_min"][:] = policy.n_min
    cols["n_drafted"][:] = steps.n_drafted
    cols["n_accepted"][:] = steps.n_accepted
    replay = steps.replayed > 0  # a checkpoint replay drafts nothing (n_max 0, as the engine records it)
    cols["n_max"][replay] = cols["n_min"][replay] = 0
    cols["replayed"][:] = steps.replayed
    cols["replay_agreed"][:] = np.where(replay, steps.replayed, -1)  # the oracle's greedy path, sampled alike
    cols["stop_reason"][:] = steps.stop_reason
    cols["drafter"][:] = steps.drafter
    cols["expected_accepted"][:] = steps.expected_accepted


def _fill_drafts(cols: dict[str, np.ndarray], replays: Sequence[DrafterReplay], steps: _Steps, N: int) -> None:
    """The verified drafts, their confidence and alternatives, from the replay whose draft each step chose."""
    real = np.arange(N)[None, :] < steps.n_drafted[:, None]
    for i, replay in enumerate(replays):
        rows = slice(None) if len(replays) == 1 else steps.chosen == i
        at, m = steps.g[rows], real[rows]
        cols["drafted"][rows, :N] = np.where(m, replay.tokens[at], -1)
        if replay.confidence is not None:
            cols["draft_prob"][rows, :N] = np.where(m, replay.confidence[at], np.nan)
        if replay.alternatives is not None:
            ids, probs = replay.alternatives
            cols["topk_ids"][rows, :N] = np.where(m[..., None], ids[at], -1)
            cols["topk_probs"][rows, :N] = np.where(m[..., None], probs[at], np.nan)


def _fill_verification(
    cols: dict[str, np.ndarray], oracle: OracleTrace, steps: _Steps, checkpoints: bool = False
) -> None:
    """The target's tokens (the greedy path up to the first rejection), the correction and the rollback (by
    snapshot slot on a recurrent target, unless ``checkpoints``)."""
    tok = np.asarray(oracle.columns["token"], dtype=np.int32)
    P, acc = steps.g, steps.n_accepted
    width = cols["target_tokens"].shape[1]
    tidx = P[:, None] + np.arange(width)[None, :]
    known = np.arange(width)[None, :] <= acc[:, None]
    cols["target_tokens"][:] = np.where(known, tok[np.minimum(tidx, oracle.n_positions - 1)], -1)
    cols["correction"][:] = tok[P + acc]
    rollback = steps.n_drafted - acc
    cols["rollback"][:] = rollback
    recurrent = bool(oracle.settings.get("is_recurrent", False)) and not checkpoints
    cols["rs_slot"][:] = np.where(recurrent & (rollback > 0), rollback, -1)


def _fill_candidates(cols: dict[str, np.ndarray], steps: _Steps, mode: DrafterMode) -> None:
    """Each asked drafter's proposal length and expected accepted length, in its engine column."""
    for i, (spec, proposal) in enumerate(zip(mode.drafters, steps.proposals)):
        cols["candidate_len"][:, spec.index] = np.where(proposal.asked, proposal.n_raw, -1)
        cols["candidate_expected"][:, spec.index] = np.where(proposal.asked, steps.expected[i], np.nan)


def _fill_batch(cols: dict[str, np.ndarray], steps: _Steps, mode: DrafterMode) -> None:
    """A simulated generation runs alone: each step its own batch, of one sequence (its verify rows, a row per MTP
    draft decode)."""
    cols["batch_step"][:] = np.arange(len(steps.g))
    cols["n_active"][:] = 1
    cols["verify_rows"][:] = steps.verify_rows
    depth = cols["draft_rows"].shape[1]
    for spec, proposal in zip(mode.drafters, steps.proposals):
        if spec.needs_mtp:
            decodes = np.where(proposal.asked, proposal.decodes, 0)
            cols["draft_rows"][:] = np.where(np.arange(depth)[None, :] < decodes[:, None], 1, -1)


# -- grids ---------------------------------------------------------------------------------------------
def simulate_grid(
    oracles: OracleTrace | Iterable[OracleTrace],
    n_max: Sequence[int],
    p_min: Sequence[float],
    n_min: int | Sequence[int] = 0,
    *,
    drafter: str | DrafterMode = drafters.DEFAULT_MODE,
    labels: Sequence[Any] | None = None,
    costs: Costs | None = None,
    checkpoints: bool = False,
):
    """Summary metrics of every (oracle, n_max, p_min) combination as a pandas DataFrame.

    Vectorised over settings for single-drafter modes (a chain replays each setting). Columns: ``prompt``
    (label), ``n_max``, ``p_min``, ``n_min``, ``drafter``, ``n_tokens``, ``n_steps``, ``n_drafted``,
    ``n_accepted``, ``acceptance_rate``, ``mean_accepted_length``, ``acceptance_by_depth`` (list),
    ``tokens_per_second`` (predicted), ``ceiling_tokens_per_second``, ``plain_tokens_per_second``,
    ``seconds``, and where the oracle carries a measured batch shift the uncertainty columns of
    :meth:`SimTrace.uncertainty`: ``n_uncertain``, ``first_uncertain`` (the first position a real run may leave
    the predicted text at; ``None``: none), ``tokens_per_second_low`` / ``_high`` and
    ``mean_accepted_length_low`` / ``_high``. ``costs``: price every oracle with one
    :class:`~mtp_explorer.CostProfile` (or the path of a saved one, or a :class:`~mtp_explorer.CostModel`) instead
    of its own cost model, as :func:`simulate`. ``checkpoints=True``: each setting run as a session without snapshot
    slots runs it (:func:`simulate`'s ``checkpoints``; one replay per setting). Bad input raises
    :class:`~mtp_explorer.ParameterError`.
    """
    import pandas as pd

    oracles = [oracles] if isinstance(oracles, OracleTrace) else list(oracles)
    if not oracles:
        raise ParameterError("simulate_grid needs at least one oracle trace")
    costs = resolve_costs(costs)
    oracles = [with_costs(o, costs) for o in oracles]
    labels = list(labels) if labels is not None else [getattr(o, "prompt", None) for o in oracles]
    if len(labels) != len(oracles):
        raise ParameterError(f"{len(labels)} labels for {len(oracles)} oracle traces")
    mode = drafters.mode(drafter)
    grid_n, grid_p, grid_nmin = _grid(n_max, p_min, n_min)
    rows = []
    for label, oracle in zip(labels, oracles):
        policies = [
            _check_policy(oracle, n, p, m, mode, None)
            for n, p, m in zip(grid_n.tolist(), grid_p.tolist(), grid_nmin.tolist())
        ]
        if checkpoints or mode.is_chain or any(oracle.replay(d).stateful for d in mode.drafters):
            stats = [_stats_of(oracle, _run_policy(oracle, pol, checkpoints=checkpoints), pol) for pol in policies]
        else:
            stats = _grid_stats(oracle, grid_n, grid_p, grid_nmin, mode)
        for i, st in enumerate(stats):
            rows.append(
                {
                    "prompt": label,
                    "n_max": int(grid_n[i]),
                    "p_min": float(grid_p[i]),
                    "n_min": int(grid_nmin[i]),
                    "drafter": mode.name,
                }
                | st
            )
    return pd.DataFrame(rows)


def _grid(n_max: Sequence[int], p_min: Sequence[float], n_min) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (n_max, p_min) pair as flat arrays, with n_min cut to n_max."""
    try:
        n_max_l = [int(n) for n in n_max]
        p_min_l = [float(p) for p in p_min]
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"n_max and p_min must be sequences of numbers ({exc})") from None
    if not n_max_l or not p_min_l:
        raise ParameterError("n_max and p_min need at least one value each")
    grid_n = np.repeat(np.asarray(n_max_l, dtype=np.int64), len(p_min_l))
    grid_p = np.tile(np.asarray(p_min_l, dtype=np.float64), len(n_max_l))
    try:
        nm = np.broadcast_to(np.asarray(n_min, dtype=np.int64), grid_n.shape)
    except (TypeError, ValueError):
        raise ParameterError(f"n_min must be an integer or one per setting ({len(grid_n)}), got {n_min!r}") from None
    return grid_n, grid_p, np.minimum(nm, grid_n)


def _next_uncertain(unc: np.ndarray) -> np.ndarray:
    """Per position g, how far on the next uncertain position is (g itself: 0; none: a large number)."""
    T = len(unc)
    at = np.where(unc, np.arange(T), 2 * T + 1)
    return np.minimum.accumulate(at[::-1])[::-1] - np.arange(T)


def _accepted_bounds(unc: np.ndarray, g: np.ndarray, n_d: np.ndarray, acc: np.ndarray):
    """Each step's accepted drafts if the batch flips its uncertain positions: at least up to the first uncertain
    token it emits (that token flips, rejecting the draft there), at most every draft (the token after the last
    accepted draft flips to the next draft's)."""
    T = len(unc)
    low = np.minimum(acc, _next_uncertain(unc)[np.minimum(g, T - 1)])
    high = np.where(unc[np.minimum(g + acc, T - 1)] & (acc < n_d), n_d, acc)
    return low, high


def uncertainty_of(
    oracle: OracleTrace,
    n_max: int,
    g: np.ndarray,
    n_d: np.ndarray,
    acc: np.ndarray,
    tokens_per_second: float,
    n_tokens: int,
) -> dict[str, Any]:
    """The uncertain positions of a predicted path (steps at ``g`` drafting ``n_d``, accepting ``acc``) and its
    totals as ranges: accepted drafts between :func:`_accepted_bounds`' sums, tokens/s scaled as the same steps
    emitting that many tokens (the text after a flip is another, assumed alike). ``tolerance`` NaN: the oracle
    carries no measured batch shift, so no position is marked. The tolerance is the shift's for verify batches of
    ``n_max + 1`` rows."""
    shift = oracle.batch_shift
    tol = shift.tolerance(n_max + 1) if shift is not None else math.nan
    unc = oracle.uncertain(n_max + 1)
    where = np.flatnonzero(unc[:n_tokens])
    low, high = _accepted_bounds(unc, g, n_d, acc) if len(g) else (acc, acc)
    steps, accepted = len(g), int(acc.sum())

    def scale(a: int) -> float:
        return tokens_per_second if a == accepted else tokens_per_second * (a + steps) / (accepted + steps)

    margins = oracle.columns["target_margin"]
    return {
        "tolerance": tol,
        "uncertain_positions": where.tolist(),
        "margins": [float(margins[p]) for p in where],
        "first_uncertain": int(where[0]) if len(where) else None,
        "n_accepted_range": (int(low.sum()), int(high.sum())),
        "mean_accepted_length_range": (
            metrics.accepted_per_step(int(low.sum()), steps),
            metrics.accepted_per_step(int(high.sum()), steps),
        ),
        "tokens_per_second_range": (scale(int(low.sum())), scale(int(high.sum()))),
    }


def _stats_of(oracle: OracleTrace, steps: _Steps, policy: DraftSettings) -> dict:
    seconds = float(_total_ns(_phase_times(oracle, steps, policy.mode)).sum()) / 1e9
    n_d, acc = steps.n_drafted, steps.n_accepted
    n_tok = int(steps.g[-1] + acc[-1] + 1) if len(acc) else 0
    row = _row(
        n_tok,
        len(acc),
        int(n_d.sum()),
        int(acc.sum()),
        metrics.acceptance_by_depth(n_d, acc, oracle.depth).rate,
        seconds,
        ceiling_tokens_per_second(oracle, policy.n_max, policy.mode),
        ceiling_tokens_per_second(oracle, 0, policy.mode),
    )
    return row | _range_columns(
        uncertainty_of(oracle, policy.n_max, steps.g, n_d, acc, row["tokens_per_second"], n_tok)
    )


def _range_columns(u: dict[str, Any]) -> dict[str, Any]:
    """A grid row's uncertainty columns, from :func:`uncertainty_of`."""
    return {
        "n_uncertain": len(u["uncertain_positions"]),
        "first_uncertain": u["first_uncertain"],
        "tokens_per_second_low": u["tokens_per_second_range"][0],
        "tokens_per_second_high": u["tokens_per_second_range"][1],
        "mean_accepted_length_low": u["mean_accepted_length_range"][0],
        "mean_accepted_length_high": u["mean_accepted_length_range"][1],
    }


def _row(
    n_tokens: int,
    n_steps: int,
    n_drafted: int,
    n_accepted: int,
    by_depth: list[float],
    seconds: float,
    ceiling: float,
    plain: float,
) -> dict:
    """One row of a grid: the run's numbers (from :mod:`~mtp_explorer.core.metrics`)."""
    return {
        "n_tokens": n_tokens,
        "n_steps": n_steps,
        "n_drafted": n_drafted,
        "n_accepted": n_accepted,
        "acceptance_rate": metrics.accepted_per_drafted(n_accepted, n_drafted),
        "mean_accepted_length": metrics.accepted_per_step(n_accepted, n_steps),
        "acceptance_by_depth": by_depth,
        "tokens_per_second": metrics.tokens_per_second(n_tokens, seconds),
        "ceiling_tokens_per_second": ceiling,
        "plain_tokens_per_second": plain,
        "seconds": seconds,
    }


def _grid_stats(oracle: OracleTrace, grid_n, grid_p, grid_nmin, mode: DrafterMode) -> list[dict]:
    """All settings of one oracle and a single-drafter mode at once: per-position outcomes as [S, T] arrays,
    then the paths followed in lock step."""
    (replay,) = _replays(oracle, mode)
    T_end = min(oracle.n_positions, oracle.max_tokens)
    cap, reason = _caps(oracle, grid_n, oracle.max_tokens)
    cand = replay.candidate(cap, reason, grid_p, grid_nmin, grid_n > 0)
    n_d = cand.n_drafted
    acc = np.minimum(n_d, replay.match_len[None, :])
    tel = is_full_telemetry(oracle.settings.get("telemetry"))
    pos = oracle.columns["pos"].astype(np.float64)[None, :]
    draft = _draft_ns(oracle, (replay,), (cand,), cap > 0, pos)
    step_fresh = _total_ns(
        oracle.cost.phase_ns(
            _head((replay,), (cand,), cand.asked.shape),
            n_d + 1,
            draft,
            n_d + 1 if tel else acc + 1,
            n_d - acc,
            pos,
            fresh=True,
            follow=_follow_ns(oracle, (replay,), pos),
        )
    )
    visited, total_ns = _follow_lanes(n_d + 1, acc, step_fresh, step_fresh - oracle.cost.fresh_ns, T_end)
    n_steps = visited.sum(axis=1)
    n_drafted = np.where(visited, n_d, 0).sum(axis=1)
    n_accepted = np.where(visited, acc, 0).sum(axis=1)
    by_depth = metrics.acceptance_by_depth_runs(n_d, acc, oracle.depth, visited)
    ceiling = {n: ceiling_tokens_per_second(oracle, n, mode) for n in set(grid_n.tolist())}
    plain = ceiling_tokens_per_second(oracle, 0, mode)
    rows = [
        _row(
            T_end,
            int(n_steps[i]),
            int(n_drafted[i]),
            int(n_accepted[i]),
            by_depth[i].tolist(),
            float(total_ns[i] / 1e9),
            ceiling[int(grid_n[i])],
            plain,
        )
        for i in range(len(grid_n))
    ]
    g = np.arange(n_d.shape[1])
    for row, n, v, nd, a in zip(rows, grid_n.tolist(), visited, n_d, acc):
        row.update(_range_columns(uncertainty_of(oracle, n, g[v], nd[v], a[v], row["tokens_per_second"], T_end)))
    return rows


def _follow_lanes(k: np.ndarray, acc: np.ndarray, step_fresh: np.ndarray, step_reused: np.ndarray, T_end: int):
    """Every setting's path followed in lock step (the verify graph is reused when ``k`` repeats): which
    positions each visits [S, T] and its total time in ns [S]."""
    S, T = k.shape
    nxt = np.arange(T)[None, :] + acc + 1
    visited = np.zeros((S, T), dtype=bool)
    total_ns = np.zeros(S)
    prev_k = np.full(S, -1, dtype=np.int64)
    lanes = np.arange(S)
    cur = np.zeros(S, dtype=np.int64)
    while lanes.size:
        visited[lanes, cur] = True
        kk = k[lanes, cur]
        total_ns[lanes] += np.where(kk == prev_k[lanes], step_reused[lanes, cur], step_fresh[lanes, cur])
        prev_k[lanes] = kk
        cur = nxt[lanes, cur]
        keep = cur < T_end
        lanes, cur = lanes[keep], cur[keep]
    return visited, total_ns


# -- exactness -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Comparison:
    """A real trace checked step by step against the oracle's prediction at the same positions.

    ``mismatches``: one dict per differing step with ``step``, ``g``, the real and predicted values,
    ``kind`` (``tie`` or ``unexplained``) and ``cause``: ``target_argmax`` (the real run's greedy
    token differs where the target's top-2 logits are within ``tol_logit``: the rest of the run is
    not comparable), ``draft_argmax`` (a draft token differs where the drafting head's top-2 are within
    ``tol_logit`` / ``tol_prob``), ``p_min_threshold`` (a confidence within ``tol_prob`` of
    ``p_min``), ``chain_choice`` (the chain's two best expected lengths within ``tol_prob`` of each other,
    or moved by a confidence tie), or ``none``.
    """

    n_steps: int
    n_compared: int
    mismatches: list[dict]

    @property
    def ties(self) -> list[dict]:
        return [m for m in self.mismatches if m["kind"] == "tie"]

    @property
    def unexplained(self) -> list[dict]:
        return [m for m in self.mismatches if m["kind"] != "tie"]

    @property
    def exact(self) -> bool:
        return not self.mismatches


def _trace_mode(trace: Trace) -> DrafterMode:
    return drafters.mode(trace.settings.get("drafter", drafters.DEFAULT_MODE), trace.settings.get("chain_policy"))


def _step_starts(n_accepted: np.ndarray) -> list[int]:
    """The oracle position each step of a trace starts at."""
    starts, g = [], 0
    for a in n_accepted.tolist():
        starts.append(g)
        g += a + 1
    return starts


def _settings_along(trace: Trace) -> list[tuple]:
    """Each step's (n_max, p_min, n_min); a checkpoint replay's (n_max 0, drafting nothing) are the step's before it."""
    c = trace.columns
    settings = list(zip(c["n_max"].tolist(), c["p_min"].tolist(), c["n_min"].tolist()))
    replayed = c["replayed"].tolist() if "replayed" in c else []  # (traces saved before the column)
    for j, r in enumerate(replayed):
        if r > 0 and j > 0:
            settings[j] = settings[j - 1]
    return settings


def _predict_at(oracle: OracleTrace, trace: Trace, starts: list[int]) -> dict[int, tuple[_Steps, int]]:
    """The prediction for each step of ``trace`` at its position, with the settings in force there (the
    drafters' running statistics are replayed per stretch of constant settings)."""
    mode = _trace_mode(trace)
    max_tokens = int(trace.settings.get("max_tokens", oracle.max_tokens))
    checkpoints = bool(trace.settings.get("checkpoints", False))
    settings = _settings_along(trace)
    out: dict[int, tuple[_Steps, int]] = {}
    i = 0
    while i < trace.n_steps:
        j = i
        while j < trace.n_steps and settings[j] == settings[i]:
            j += 1
        n_max, p_min, n_min = settings[i]
        seg = [s for s in starts[i:j] if s < oracle.n_positions]
        if seg:
            policy = DraftSettings(
                n_max=int(n_max),
                p_min=float(np.float32(p_min)),
                n_min=int(n_min),
                drafter=mode,  # type: ignore[arg-type]
                max_tokens=max_tokens,
            )
            steps = _run_policy(oracle, policy, start_steps=seg, checkpoints=checkpoints)
            out.update({step: (steps, q) for q, step in enumerate(range(i, i + len(seg)))})
        i = j
    return out


def _name(names: Sequence[str], i: int) -> str | None:
    return names[i] if i >= 0 else None


def compare(
    oracle: OracleTrace,
    trace: Trace,
    *,
    tol_logit: float | None = None,
    tol_prob: float = 1e-4,
    batch_rows: int | None = None,
) -> Comparison:
    """Check every step of a real greedy ``trace`` against the oracle's prediction for the same
    position and the settings in force at that step (live ``set_params`` changes included; in a
    chain mode the drafters' running statistics are then replayed per stretch of constant
    settings, so a change mid-run can leave chain choices unexplained; a stateful drafter, ngram-mod's table or
    ngram-map's key statistics, likewise starts afresh at each such stretch).

    ``tol_logit`` is the top-2 logit margin below which a differing token is a batch-shape tie. Default: the
    oracle's measured :attr:`~OracleTrace.batch_shift` tolerance for the run's largest target batch
    (``batch_rows``, default its largest verify batch, ``n_drafted + 1``; a parallel run's batches hold every
    active sequence's rows), else :data:`DEFAULT_TOL_LOGIT`. Every mismatch carries an ``explanation`` sentence
    and the ``tolerance`` used."""
    c = trace.columns
    given_tol = tol_logit
    if batch_rows is None:
        batch_rows = int(c["n_drafted"].max()) + 1 if trace.n_steps else 1
    replays = _replays(oracle, _trace_mode(trace))
    starts = _step_starts(c["n_accepted"])
    diverge = next((i for i, (a, b) in enumerate(zip(trace.tokens, oracle.tokens)) if a != b), None)
    # the KV length the tolerance is measured at: the divergence's, else the deepest the run compared
    kv = int(oracle.columns["pos"][min(diverge if diverge is not None else oracle.n_positions, oracle.n_positions) - 1])
    tol_logit = tolerance_of(oracle.batch_shift, tol_logit, DEFAULT_TOL_LOGIT, batch_rows, kv)
    predicted = _predict_at(oracle, trace, starts)
    mismatches: list[dict] = []
    n_compared = 0
    for i in range(trace.n_steps):
        g = starts[i]
        if (diverge is not None and g > diverge) or i not in predicted:
            break
        steps, q = predicted[i]
        n_compared += 1
        real_nd, real_acc = int(c["n_drafted"][i]), int(c["n_accepted"][i])
        real = {
            "n_drafted": real_nd,
            "n_accepted": real_acc,
            "drafted": c["drafted"][i, :real_nd].tolist(),
            "stop_reason": int(c["stop_reason"][i]),
            "drafter": int(c["drafter"][i]),
        }
        pred_nd = int(steps.n_drafted[q])
        pred = {
            "n_drafted": pred_nd,
            "n_accepted": int(steps.n_accepted[q]),
            "drafted": replays[int(steps.chosen[q])].tokens[g, :pred_nd].tolist(),
            "stop_reason": int(steps.stop_reason[q]),
            "drafter": int(steps.drafter[q]),
        }
        if real == pred and (diverge is None or g + real_acc < diverge):
            continue
        mm = {
            "step": i,
            "g": g,
            "n_max": int(c["n_max"][i]),
            "p_min": float(c["p_min"][i]),
            "n_min": int(c["n_min"][i]),
            "real": _named(real),
            "predicted": _named(pred),
        }
        mm.update(_classify(oracle, trace, i, g, replays[int(steps.chosen[q])], diverge, tol_logit, tol_prob))
        mm["tolerance"] = tol_logit
        mm["explanation"] = _explain(mm, oracle.batch_shift if given_tol is None else None, tol_logit, batch_rows, kv)
        mismatches.append(mm)
        if mm["cause"] == "target_argmax":
            break
    return Comparison(n_steps=trace.n_steps, n_compared=n_compared, mismatches=mismatches)


def _named(outcome: dict) -> dict:
    """A step's outcome with its stop reason and drafter as names."""
    return outcome | {
        "stop_reason": STOP_REASONS[outcome["stop_reason"]],
        "drafter": _name(DRAFTERS, outcome["drafter"]),
    }


def _explain(mm: dict, shift: BatchShift | None, tol_logit: float, batch_rows: int, kv: int) -> str:
    """A sentence for a mismatch: its kind, cause, margin and the tolerance it was judged by (``shift``: the
    measured shift that tolerance came from, else ``None``)."""
    margin, cause = mm.get("margin", math.nan), mm["cause"]
    if cause in ("target_argmax", "draft_argmax") and shift is not None and math.isfinite(margin):
        where = "the target's token" if cause == "target_argmax" else f"the draft at depth {mm.get('depth')}"
        return f"{where} differs: " + shift.explain(margin, batch_rows, kv)
    if mm["kind"] == "tie":
        return (
            f"{cause} near-tie: margin {margin:.3g} < tolerance {tol_logit:.3g} (given, not measured)"
            if cause in ("target_argmax", "draft_argmax")
            else f"{cause} near-tie: margin {margin:.3g}"
        )
    return f"unexplained ({cause}): margin {margin:.3g}, tolerance {tol_logit:.3g}: report it as a bug"


def _classify(
    oracle: OracleTrace, trace: Trace, i: int, g: int, chosen: DrafterReplay, diverge, tol_logit: float, tol_prob: float
) -> dict:
    c = trace.columns
    real_nd = int(c["n_drafted"][i])
    real_acc = int(c["n_accepted"][i])
    if diverge is not None and g + real_acc >= diverge:
        margin = float(oracle.columns["target_margin"][diverge]) if diverge < oracle.n_positions else math.inf
        return {
            "kind": "tie" if margin < tol_logit else "unexplained",
            "cause": "target_argmax",
            "margin": margin,
            "position": diverge,
        }
    real_src = int(c["drafter"][i])
    # a draft token that differs: an argmax tie in the drafting head?
    if chosen.margins is not None and real_src in (-1, chosen.spec.index):
        tie = _draft_tie(chosen, c, i, g, real_nd, tol_logit, tol_prob)
        if tie is not None:
            return tie
    # the same tokens but a different cut: a confidence at p_min?
    p_min = float(np.float32(c["p_min"][i]))
    probs = [
        p for spec in DRAFTER_SPECS.values() if spec.has_confidence for p in _confidences(oracle.replay(spec), g)
    ] + list(c["draft_prob"][i, :real_nd])
    near = [float(p) for p in probs if not math.isnan(p) and abs(float(p) - p_min) < tol_prob]
    if near and p_min > 0:
        return {"kind": "tie", "cause": "p_min_threshold", "margin": min(abs(p - p_min) for p in near)}
    gap = _choice_gap(c["candidate_expected"][i, [s.index for s in _trace_mode(trace).drafters]])
    if gap < tol_prob:
        return {"kind": "tie", "cause": "chain_choice", "margin": gap}
    return {"kind": "unexplained", "cause": "none", "margin": math.nan}


def _draft_tie(replay: DrafterReplay, c, i: int, g: int, real_nd: int, tol_logit: float, tol_prob: float):
    """The first draft token that differs from the replay's, classified (``None``: none differs)."""
    real_draft = c["drafted"][i, :real_nd]
    for j in range(min(real_nd, int(replay.length[g]))):
        if int(real_draft[j]) != int(replay.tokens[g, j]):
            margin = float(replay.margins[g, j])  # type: ignore[index]
            tp = c["topk_probs"][i, j]
            real_gap = float(tp[0] - tp[1]) if tp.shape[0] > 1 and not np.isnan(tp[1]) else math.inf
            tie = margin < tol_logit or real_gap < tol_prob
            return {"kind": "tie" if tie else "unexplained", "cause": "draft_argmax", "margin": margin, "depth": j + 1}
    return None


def _confidences(replay: DrafterReplay, g: int) -> list:
    return list(replay.confidence[g, : int(replay.length[g])])  # type: ignore[index]


def _choice_gap(expected: np.ndarray) -> float:
    """How far apart a chain's two best expected lengths were (inf unless every drafter was asked)."""
    if len(expected) < 2 or np.isnan(expected).any():
        return math.inf
    best = sorted((float(e) for e in expected), reverse=True)
    return best[0] - best[1]


def settings_grid(n_max: Sequence[int], p_min: Sequence[float]) -> list[tuple[int, float]]:
    return [(int(n), float(p)) for n in n_max for p in p_min]


# -- cost model consistency ---------------------------------------------------------------------------
def cost_consistency(oracle: OracleTrace, trace: Trace, *, costs: Costs | None = None) -> dict[str, Any]:
    """How well the oracle's cost model (or ``costs``, as :func:`simulate` takes it) predicts a real run's step
    times.

    The steps of ``trace`` are predicted where they happened (same positions, settings, draft
    sizes, graph reuse), then compared phase by phase. ``ratio_raw`` is measured / predicted time in
    total; on a shared machine it carries the spikes of whatever else runs. ``ratio_robust`` groups
    the steps by phase and shape (verify: rows and whether the graph was reused; catch-up: rows;
    draft: model decodes), takes each group's median measured / predicted ratio, and weighs it by the
    group's predicted time: how far the model is from the typical step, spikes aside.
    """
    c = trace.columns
    oracle = with_costs(oracle, costs)
    mode = _trace_mode(trace)
    settings = _settings_along(trace)
    n_max, p_min, n_min = settings[0]
    if any(st != settings[0] for st in settings):
        raise ParameterError("cost_consistency needs a trace with constant settings")
    policy = DraftSettings(
        n_max=int(n_max),
        p_min=float(np.float32(p_min)),
        n_min=int(n_min),
        drafter=mode,  # type: ignore[arg-type]
        max_tokens=int(trace.settings.get("max_tokens", oracle.max_tokens)),
    )
    steps = _run_policy(
        oracle,
        policy,
        start_steps=_step_starts(c["n_accepted"]),
        checkpoints=bool(trace.settings.get("checkpoints", False)),
    )
    if len(steps.g) != trace.n_steps or not np.array_equal(steps.n_drafted, c["n_drafted"]):
        raise ParameterError("the trace's steps differ from the oracle's prediction (see compare())")
    pred = _phase_times(oracle, steps, mode)
    k = steps.verify_rows
    fresh = np.ones(len(k), dtype=bool)
    fresh[1:] = k[1:] != k[:-1]
    keys = {"verify": k * 2 + fresh, "catchup": k, "draft": steps.n_decodes, "sample": np.zeros(len(k), int)}
    out: dict[str, Any] = {"per_phase": {}}
    total_pred = total_meas = total_robust = 0.0
    for ph in PHASES:
        p = np.broadcast_to(np.asarray(pred[ph], dtype=np.float64), k.shape)
        m = c[f"t_{ph}_ns"].astype(np.float64)
        robust = _robust_ns(m, p, keys[ph])
        out["per_phase"][ph] = {"predicted_s": p.sum() / 1e9, "measured_s": m.sum() / 1e9, "robust_s": robust / 1e9}
        total_pred += p.sum()
        total_meas += m.sum()
        total_robust += robust
    return out | _consistency_totals(len(trace.tokens), total_pred, total_meas, total_robust)


def _robust_ns(measured: np.ndarray, predicted: np.ndarray, keys: np.ndarray) -> float:
    """Per group of like steps, the median measured / predicted ratio weighed by the group's predicted time."""
    robust = 0.0
    for key in np.unique(keys):
        sel = (keys == key) & (predicted > 0)
        if sel.any():
            robust += float(np.median(measured[sel] / predicted[sel])) * float(predicted[sel].sum())
    return robust


def _consistency_totals(n_tok: int, pred: float, meas: float, robust: float) -> dict[str, float]:
    out = {
        "predicted_seconds": pred / 1e9,
        "measured_seconds": meas / 1e9,
        "robust_measured_seconds": robust / 1e9,
        "ratio_raw": meas / pred if pred else math.nan,
        "ratio_robust": robust / pred if pred else math.nan,
    }
    out["predicted_tokens_per_second"] = n_tok / out["predicted_seconds"] if pred else math.nan
    out["measured_tokens_per_second"] = n_tok / out["measured_seconds"] if meas else math.nan
    out["robust_measured_tokens_per_second"] = n_tok / out["robust_measured_seconds"] if robust else math.nan
    return out
