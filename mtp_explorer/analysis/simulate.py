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
(:func:`mtp_explorer.core.drafters.mode`); the chain policies are replayed by
:data:`~mtp_explorer.analysis.walk.CHAIN_POLICY_REPLAYS`.

:mod:`~mtp_explorer.analysis.walk` takes the steps; this module prices them. :func:`simulate_grid`
(:mod:`~mtp_explorer.analysis.grid`) evaluates many settings over many oracles at once, for sweeps; a single
:func:`simulate` call costs about a millisecond, cheap enough for a slider.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core import drafters, metrics
from ..core.drafters import DrafterMode
from ..core.errors import ParameterError
from ..core.options import is_full_telemetry
from ..core.schema import PHASES, Dims, empty_columns
from ..core.settings import DraftSettings
from ..core.trace import Trace
from .oracle import OracleTrace
from .profile import Costs, with_costs
from .replay import DrafterReplay
from .schedules import ScheduleSpec, check_schedule
from .schedules import schedule as make_schedule
from .walk import (
    CHAIN_POLICY_ASKS_ALL,
    Steps,
    check_policy,
    draft_caps,
    model_follows,
    only_asked,
    replays_of,
    run_policy,
    run_schedule,
)


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


def draft_phase_ns(oracle: OracleTrace, replays, proposals, cap_pos, pos):
    """The draft phase: every asked drafter's draft call."""
    total = 0.0
    for replay, proposal in zip(replays, proposals):
        total = total + replay.draft_ns(oracle.cost, proposal, cap_pos, pos)
    return total


def follow_phase_ns(oracle: OracleTrace, replays, pos):
    """What following each step's verify batch costs the drafters besides the MTP catch-up (a draft model's decode)."""
    return sum((r.follow_ns(oracle.cost, pos) for r in replays), 0.0)


def phase_times(
    oracle: OracleTrace, steps: Steps, mode: DrafterMode, fresh: bool | None = None
) -> dict[str, np.ndarray]:
    """Predicted time of each phase of each step (the verify graph reused when ``k`` repeats, or at every step
    built anew, ``fresh=True``, or reused, ``fresh=False``)."""
    k = steps.verify_rows  # a checkpoint replay's rows have logits and are sampled again
    rows = np.where(is_full_telemetry(oracle.settings.get("telemetry")), k, steps.replayed + steps.n_accepted + 1)
    built = np.ones(len(k), dtype=bool)
    built[1:] = k[1:] != k[:-1]
    pos = oracle.columns["pos"][steps.g].astype(np.float64)
    replays = replays_of(oracle, mode)
    draft = draft_phase_ns(oracle, replays, steps.proposals, steps.cap > 0, pos)
    return oracle.cost.phase_ns(
        steps.head,
        k,
        draft,
        rows,
        steps.n_drafted - steps.n_accepted,
        pos,
        built if fresh is None else np.full(len(k), fresh),
        follow_phase_ns(oracle, replays, pos),
    )


def summed_ns(phases: Mapping[str, np.ndarray]):
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
    cap_at = draft_caps(oracle, n_max, max_tokens)[0][:T]
    pos = oracle.columns["pos"][:T].astype(np.float64)
    replays = replays_of(oracle, mode)
    lengths = range(int(cap_at.max()) + 1)
    step_ns = np.full((len(lengths), T), np.inf)
    for j in lengths:  # every position's step drafting j tokens, all kept (its graph reused: fresh_ns added apart)
        cap = np.minimum(cap_at, j)
        full = [r.full(cap, n_max > 0) for r in replays]
        head = model_follows(replays, full, cap.shape)
        if not CHAIN_POLICY_ASKS_ALL[mode.policy]:  # the first drafter's full draft is verified, the others not asked
            full = [f if i == 0 else only_asked(f, np.zeros(cap.shape, bool)) for i, f in enumerate(full)]
        parts = oracle.cost.phase_ns(
            head,
            cap + 1,
            draft_phase_ns(oracle, replays, full, cap > 0, pos),
            cap + 1,
            0,
            pos,
            False,
            follow_phase_ns(oracle, replays, pos),
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
    schedule: ScheduleSpec | None = None,
    window: int | None = None,
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
    more; the checkpoint's save and restore are not priced. ``schedule`` chooses each step's draft cap (at most
    ``n_max``) from the steps before it: ``"fixed"`` (``n_max`` every step, llama.cpp's), ``"heuristic"``, ``"window"``
    (over ``window`` steps) or a callable ``(history, n_max) -> length`` (:mod:`~mtp_explorer.analysis.schedules`;
    ``None``: the settings', ``"fixed"`` unless ``n_max`` is a :class:`~mtp_explorer.DraftSettings` that names one);
    the ``n_max`` column then holds each step's length. A schedule replays a single drafter without state along the
    path, and not with ``checkpoints``. Bad input (a profile of another model or shallower than the oracle included)
    raises :class:`~mtp_explorer.ParameterError`.
    """
    policy = check_policy(oracle, n_max, p_min, n_min, drafter, max_tokens)
    server_slot = policy.server_slot if server_slot is None else bool(server_slot)
    oracle = with_costs(oracle, costs)
    schedule = policy.schedule if schedule is None else schedule
    window = policy.window if window is None else window
    name = check_schedule(schedule, window, custom=True)
    if name == "fixed":
        steps = run_policy(oracle, policy, server_slot=server_slot, checkpoints=checkpoints)
        return _build_trace(oracle, steps, policy, server_slot, checkpoints)
    if checkpoints:
        raise ParameterError("a draft-length schedule is replayed with snapshot slots, not with checkpoints=True")
    steps, lengths = run_schedule(oracle, policy, make_schedule(schedule, policy.n_max, window), server_slot)
    return _build_trace(
        oracle, steps, policy, server_slot, schedule={"schedule": name, "window": window}, lengths=lengths
    )


def _build_trace(
    oracle: OracleTrace,
    steps: Steps,
    policy: DraftSettings,
    server_slot: bool = False,
    checkpoints: bool = False,
    schedule: dict[str, Any] | None = None,
    lengths: np.ndarray | None = None,
) -> SimTrace:
    """The steps as a trace: the schema's columns, filled with what the oracle knows; ``lengths``: each step's draft
    cap where a schedule chose them (else the policy's ``n_max``)."""
    S = len(steps.g)
    cols = empty_columns(S, Dims(depth=int(oracle.settings["capacity"]), topk=oracle.dims.topk))
    _fill_step(cols, oracle, steps, policy, lengths)
    if server_slot:
        cols["n_max"][steps.g == 0] = 0
    _fill_drafts(cols, replays_of(oracle, policy.mode), steps, oracle.depth)
    _fill_verification(cols, oracle, steps, checkpoints)
    _fill_candidates(cols, steps, policy.mode)
    _fill_batch(cols, steps, policy.mode)
    times = phase_times(oracle, steps, policy.mode)
    for phase in PHASES:
        cols[f"t_{phase}_ns"][:] = np.rint(times[phase])
    n_tok = int(steps.g[-1] + steps.n_accepted[-1] + 1) if S else 0
    pieces = oracle.pieces[:n_tok]
    settings = (
        dict(oracle.settings)
        | policy.to_dict()
        | {"simulated": True, "server_slot": server_slot, "checkpoints": checkpoints}
        | (schedule or {})
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


def _fill_step(
    cols: dict[str, np.ndarray],
    oracle: OracleTrace,
    steps: Steps,
    policy: DraftSettings,
    lengths: np.ndarray | None = None,
) -> None:
    cols["step"][:] = np.arange(len(steps.g))
    cols["pos"][:] = oracle.columns["pos"][steps.g]
    cols["n_max"][:] = policy.n_max if lengths is None else lengths
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


def _fill_drafts(cols: dict[str, np.ndarray], replays: Sequence[DrafterReplay], steps: Steps, N: int) -> None:
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
    cols: dict[str, np.ndarray], oracle: OracleTrace, steps: Steps, checkpoints: bool = False
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


def _fill_candidates(cols: dict[str, np.ndarray], steps: Steps, mode: DrafterMode) -> None:
    """Each asked drafter's proposal length and expected accepted length, in its engine column."""
    for i, (spec, proposal) in enumerate(zip(mode.drafters, steps.proposals)):
        cols["candidate_len"][:, spec.index] = np.where(proposal.asked, proposal.n_raw, -1)
        cols["candidate_expected"][:, spec.index] = np.where(proposal.asked, steps.expected[i], np.nan)


def _fill_batch(cols: dict[str, np.ndarray], steps: Steps, mode: DrafterMode) -> None:
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
