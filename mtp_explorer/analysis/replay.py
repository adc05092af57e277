"""The simulator's replay of each drafter on an oracle recording.

A replay answers, for one drafter and every position of an :class:`~mtp_explorer.analysis.oracle.OracleTrace`:
what it would propose there under a policy (:meth:`DrafterReplay.candidate`), how long a prefix of that the
target accepts (:attr:`DrafterReplay.match_len`), its expected accepted length as the engine estimates it
(:meth:`DrafterReplay.expectation`, the chain policy compares these) and what its draft call costs
(:meth:`DrafterReplay.draft_ns`). The simulator (:mod:`~mtp_explorer.analysis.simulate`) asks the replays of
a mode's drafters and applies the mode's chain policy; it never names a drafter.

Each drafter's registry record names its replay (:attr:`DrafterSpec.replay
<mtp_explorer.core.drafters.DrafterSpec.replay>`). The oracle keeps every drafter's drafts in the same
per-drafter columns (:data:`DRAFT_COLUMNS`: ``draft`` [T, S, depth] ids, ``draft_len``, ``draft_eos``, and for
a drafter with a confidence :data:`CONFIDENCE_COLUMNS`), indexed by the drafter's :attr:`DrafterSpec.index
<mtp_explorer.core.drafters.DrafterSpec.index>`; the base class reads its slice of them.
:meth:`OracleTrace.replay <mtp_explorer.analysis.oracle.OracleTrace.replay>` builds each replay once per
recording.

To replay a new drafter: subclass :class:`DrafterReplay`, implement :meth:`~DrafterReplay.candidate` and
:meth:`~DrafterReplay.expectation` (and :meth:`~DrafterReplay.draft_ns` and :meth:`~DrafterReplay.full` if its
draft call costs model decodes rather than a look-up), and name the class in the drafter's record.
"""

from __future__ import annotations

import abc
import dataclasses
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..core import native
from ..core.drafters import DrafterSpec, option_values, recorded_options, register_replays
from ..core.errors import ParameterError
from ..core.schema import STOP_REASONS

if TYPE_CHECKING:
    from .oracle import CostModel, OracleTrace

#: Stop-reason codes (indices into :data:`~mtp_explorer.core.schema.STOP_REASONS`) the replays set.
STOP: dict[str, int] = {name: i for i, name in enumerate(STOP_REASONS)}

#: The per-drafter oracle columns every replay reads (its slice ``[:, spec.index]``): draft ids [T, depth], length
#: [T], ends with an end-of-generation token [T].
DRAFT_COLUMNS: tuple[str, ...] = ("draft", "draft_len", "draft_eos")
#: The per-drafter oracle columns a drafter with a confidence is read from besides: confidence and top-1 minus
#: top-2 logit [T, depth], top-k alternatives (ids, probabilities) [T, depth, K].
CONFIDENCE_COLUMNS: tuple[str, ...] = ("draft_prob", "draft_margin", "topk_ids", "topk_probs")


class ReplayApproximate(UserWarning):
    """A replay cannot be exact for these settings (its drafter's state depends on what the oracle does not record);
    the message says why."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One drafter's proposal at every position, as arrays ``[..., T]`` (leading axes: settings of a grid)."""

    n_raw: np.ndarray  #: tokens proposed, before the ``n_min`` drop (0 where not asked)
    stop: np.ndarray  #: why the proposal stopped (int8 index into STOP_REASONS)
    dropped: np.ndarray  #: shorter than ``n_min``: nothing of it is verified
    asked: np.ndarray  #: the drafter took part (the trace's ``candidate_*`` columns are set); may be ``[..., 1]``
    decodes: np.ndarray  #: model decodes of the draft call (0 for a look-up)

    @cached_property
    def n_drafted(self) -> np.ndarray:
        """Tokens verified if this proposal is chosen."""
        return np.where(self.dropped, 0, self.n_raw)

    @cached_property
    def usable(self) -> np.ndarray:
        """A non-empty proposal that was not dropped: the chain policy may choose it."""
        return self.asked & ~self.dropped & (self.n_raw > 0)

    def take(self, idx: np.ndarray) -> Candidate:
        """The proposals at positions ``idx`` (the steps of a path)."""
        shape = np.shape(self.n_raw)
        return Candidate(*(np.broadcast_to(getattr(self, f.name), shape)[..., idx] for f in dataclasses.fields(self)))


class Expectation(abc.ABC):
    """A drafter's estimate of its expected accepted length over one replayed generation (what the engine's
    ``expected_accepted`` computes); stateful estimators learn from every step's outcome."""

    #: The estimate depends only on the position and the proposal, not on earlier steps (see
    #: :class:`StatelessExpectation`).
    stateless: ClassVar[bool] = False

    @abc.abstractmethod
    def expected(self, g: int, n: int) -> float:
        """The expected accepted length of the first ``n`` tokens of the proposal at position ``g``."""

    def observe(self, g: int, n_proposed: int, n_match: int, n_emitted: int) -> None:  # noqa: B027 (a no-op hook)
        """A step at ``g`` ended: the proposal had ``n_proposed`` tokens of which the first ``n_match`` equal the
        greedy path, and the step emitted ``n_emitted`` tokens (whoever drafted them)."""

    def along(self, path: np.ndarray, n_raw: np.ndarray, match: np.ndarray, accepted: np.ndarray) -> np.ndarray:
        """The expected lengths at the steps of ``path`` (positions), each step observed in turn."""
        n_raw_l, match_l = n_raw.tolist(), match.tolist()
        out = np.empty(len(path))
        for i, (g, a) in enumerate(zip(path.tolist(), accepted.tolist())):
            out[i] = self.expected(g, n_raw_l[g])
            self.observe(g, n_raw_l[g], match_l[g], a + 1)
        return out


class DrafterReplay(abc.ABC):
    """The replay of one drafter on one oracle recording (see the module docstring)."""

    #: Oracle columns of its own it reads besides the per-drafter ones (:data:`DRAFT_COLUMNS`, and
    #: :data:`CONFIDENCE_COLUMNS` for a drafter with a confidence). Empty for every drafter the engine has.
    extra_columns: ClassVar[tuple[str, ...]] = ()
    #: Its model catches up on every verified row (the MTP head): the catch-up phase runs, the target's caches
    #: are cold at the verify, and the sample phase carries the head's bookkeeping.
    follows_target: ClassVar[bool] = False
    #: Its proposals depend on its state along the path (:class:`LookupReplay`): the simulator walks step by step.
    stateful: ClassVar[bool] = False
    #: Why its drafts depend on the steps it is not asked in (a chain's earlier drafter drafted), which the oracle
    #: (every drafter asked at every position) never has: its replay behind a ``first``-policy chain is then
    #: approximate ('': they do not).
    state_note: ClassVar[str] = ""

    def approximation(self, mode, n_max: int) -> str:
        """Why replaying it in ``mode`` at ``n_max`` cannot be exact ('': it is): by default, :attr:`state_note` when
        an earlier drafter of a ``first``-policy chain takes steps from it."""
        chained_behind = mode.policy == "first" and self.spec in mode.drafters[1:]
        return f"once {mode.drafters[0].name} drafts, {self.state_note}" if chained_behind and self.state_note else ""

    def __init__(self, oracle: OracleTrace, spec: DrafterSpec) -> None:
        self.oracle = oracle
        self.spec = spec
        self.index = spec.index

    @property
    def columns(self) -> tuple[str, ...]:
        """The oracle columns this replay reads (of the per-drafter ones, only its slice)."""
        return DRAFT_COLUMNS + (CONFIDENCE_COLUMNS if self.spec.has_confidence else ()) + self.extra_columns

    def column(self, name: str) -> np.ndarray:
        """Its slice of a per-drafter oracle column: ``columns[name][:, index]``."""
        return self.oracle.columns[name][:, self.index]

    @property
    def available(self) -> bool:
        """The recorded model can run this drafter."""
        return self.spec.runs_with(self.oracle.has_mtp, self.oracle.has_draft_model)

    @property
    def tokens(self) -> np.ndarray:
        """[T, depth]: the draft ids at every position (-1 past its length)."""
        return self.column("draft")

    @cached_property
    def length(self) -> np.ndarray:
        """[T]: the draft's length at every position."""
        return self.column("draft_len").astype(np.int64)

    @cached_property
    def eos(self) -> np.ndarray:
        """[T]: the draft ends with an end-of-generation token."""
        return self.column("draft_eos").astype(bool)

    @cached_property
    def match_len(self) -> np.ndarray:
        """[T]: how many leading draft tokens the target accepts (the greedy path's tokens, not end-of-generation)."""
        return self.oracle.accepted_prefix(self.tokens, self.length)

    # what trace rows show of a verified draft (None: the drafter has no confidence, so no such thing)
    @property
    def confidence(self) -> np.ndarray | None:
        """[T, depth] float32: the value compared with p_min."""
        return self.column("draft_prob") if self.spec.has_confidence else None

    @property
    def margins(self) -> np.ndarray | None:
        """[T, depth]: top-1 minus top-2 draft logit (argmax ties)."""
        return self.column("draft_margin") if self.spec.has_confidence else None

    @property
    def alternatives(self) -> tuple[np.ndarray, np.ndarray] | None:
        """([T, depth, K] ids, probabilities): the draft's top-k alternatives."""
        return (self.column("topk_ids"), self.column("topk_probs")) if self.spec.has_confidence else None

    @abc.abstractmethod
    def candidate(self, cap: np.ndarray, reason: np.ndarray, p_min, n_min, active) -> Candidate:
        """The proposal at every position under a policy: ``cap`` / ``reason`` the draft cap and the stop reason of
        a draft that reaches it (``[..., T]``), ``p_min`` / ``n_min`` / ``active`` (``n_max > 0``) per setting
        (scalars or arrays of the leading axes)."""

    def full(self, cap: np.ndarray, active) -> Candidate:
        """The proposal if it always ran to the cap (the ceiling with every draft accepted)."""
        asked = np.asarray(active)[..., None] & (cap > 0)
        n_raw = np.where(asked, cap, 0)
        zero = np.zeros_like(n_raw)
        return Candidate(n_raw, zero.astype(np.int8), zero.astype(bool), asked, zero)

    @abc.abstractmethod
    def expectation(self) -> Expectation:
        """A fresh estimator of its expected accepted length for one replayed generation."""

    def draft_ns(self, cost: CostModel, proposal: Candidate, cap_pos: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Predicted time of its draft calls (``cap_pos``: the step's cap was > 0; ``pos``: n_past): by default
        one look-up wherever it was asked (a drafter without a model)."""
        return np.where(np.asarray(proposal.asked, bool), cost.lookup_ns(pos), 0.0)

    def follow_ns(self, cost: CostModel, pos: np.ndarray) -> np.ndarray | float:
        """Predicted time it takes to follow each step's verify batch besides the MTP catch-up (``pos``: n_past at
        the steps): none by default."""
        return 0.0


# -- the MTP head ---------------------------------------------------------------------------------------
class StatelessExpectation(Expectation):
    """An estimate that depends only on the position and the proposal: known at every position at once."""

    stateless = True

    @abc.abstractmethod
    def per_position(self, n_raw: np.ndarray) -> np.ndarray:
        """The estimate at every position for proposals of ``n_raw`` tokens ([T])."""


class PrefixProducts(StatelessExpectation):
    """Expected accepted length of a draft with confidences: the sum of the prefix products of its first ``n``
    confidences (stateless; a table ``[T, depth + 1]`` in float64, like the engine)."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table

    def per_position(self, n_raw: np.ndarray) -> np.ndarray:
        return self.table[np.arange(len(n_raw)), n_raw]

    def expected(self, g: int, n: int) -> float:
        return float(self.table[g, n])

    def along(self, path, n_raw, match, accepted) -> np.ndarray:
        return self.table[path, n_raw[path]]


class MtpReplay(DrafterReplay):
    """The MTP head: the oracle's chain drafted with ``p_min = 0``, cut where a confidence falls below ``p_min``,
    at an end-of-generation token or at the cap; its confidence gives the expected accepted length."""

    follows_target = True

    @cached_property
    def expected_table(self) -> np.ndarray:
        """[T, depth + 1]: expected accepted length of the first n chain tokens."""
        prob = np.nan_to_num(self.confidence.astype(np.float64), nan=0.0)  # type: ignore[union-attr]
        cum = np.cumsum(np.cumprod(prob, axis=1), axis=1)
        return np.concatenate([np.zeros((prob.shape[0], 1)), cum], axis=1)

    def candidate(self, cap, reason, p_min, n_min, active) -> Candidate:
        L, eos, prob = self.length, self.eos, self.confidence
        N = prob.shape[1]  # type: ignore[union-attr]
        limit = self.head_limit
        if limit:  # chained heads: llama.cpp caps the draft at the heads
            reason = np.where(cap > limit, STOP["n_max"], reason)
            cap = np.minimum(cap, limit)
        valid = np.arange(N)[None, :] < L[:, None]
        # prefix length with every confidence >= p_min (the engine compares float32 values)
        ok = np.where(valid, prob >= np.asarray(p_min, dtype=np.float32)[..., None, None], False)  # type: ignore[operator]
        d_pmin = np.minimum(np.where(ok.all(axis=-1), N, np.argmin(ok, axis=-1)), L)
        running = np.asarray(active) & self.available
        drafting = running[..., None] & (cap > 0)
        pstop = d_pmin < np.minimum(cap, L)
        eosstop = ~pstop & eos & (L <= cap)
        n_raw = np.where(pstop, d_pmin, np.where(eosstop, L, cap))
        if (~pstop & ~eosstop & (L < cap) & drafting).any():
            raise ParameterError("the oracle's chains are shorter than this policy drafts (depth too small?)")
        stop = np.where(pstop, STOP["p_min"], np.where(eosstop, STOP["eos"], reason))
        decodes = np.where(drafting, np.where(pstop, d_pmin + 1, n_raw), 0)
        n_raw = np.where(drafting, n_raw, 0)
        stop = np.where(drafting, stop, reason).astype(np.int8)
        # asked wherever it runs, even where the cap is 0 (the engine's candidate_len is then 0)
        return Candidate(n_raw, stop, n_raw < np.asarray(n_min)[..., None], running[..., None], decodes)

    @property
    def head_limit(self) -> int:
        """Chained MTP heads' most draft tokens (0: no such cap)."""
        return int(self.oracle.settings.get("mtp_head_limit", 0))

    def full(self, cap, active) -> Candidate:
        asked = np.broadcast_to(np.asarray(active)[..., None], cap.shape)
        n_raw = np.where(asked, cap, 0)
        return Candidate(n_raw, np.zeros(n_raw.shape, np.int8), np.zeros(n_raw.shape, bool), asked, n_raw)

    def expectation(self) -> Expectation:
        return PrefixProducts(self.expected_table)

    def draft_ns(self, cost, proposal, cap_pos, pos) -> np.ndarray:
        return np.where(proposal.asked & np.asarray(cap_pos, bool), cost.head_draft_ns(proposal.decodes, pos), 0.0)


# -- llama.cpp's draft-simple: a separate draft model --------------------------------------------------
class DraftModelReplay(MtpReplay):
    """A draft model (llama.cpp's draft-simple): drafted, cut and estimated as the MTP head (its chain drafted with
    ``p_min = 0``, cut where a confidence falls below ``p_min``, at an end-of-generation token or at the cap);
    its model decodes every verify batch, with or without drafting (the follow cost), but does not evict the
    target's caches as the MTP head's catch-up is priced to."""

    follows_target = False
    head_limit = 0  #: a draft model's drafts are not capped by MTP heads

    def draft_ns(self, cost, proposal, cap_pos, pos) -> np.ndarray:
        return np.where(proposal.asked & np.asarray(cap_pos, bool), cost.model_draft_ns(proposal.decodes, pos), 0.0)

    def follow_ns(self, cost, pos) -> np.ndarray | float:
        return cost.model_follow_ns(pos) if self.available else 0.0


class Eagle3Replay(DraftModelReplay):
    """An EAGLE-3 head (llama.cpp's draft-eagle3): drafted, cut and estimated as a draft model (its greedy chain
    recorded with ``p_min = 0``, cut where a confidence falls below ``p_min``); its encoder and decoder follow every
    verify batch (the follow cost), as a draft model does."""

    state_note = (
        "after a step it does not draft in, llama.cpp 0.3.36's draft-eagle3 writes the deferred row of its "
        "memory with the newest g instead of the deferred one (common_speculative_impl_draft_eagle3::process "
        "reads pending_g_last after overwriting it), so its later drafts differ from those the oracle "
        "recorded, where it drafts at every position"
    )


class DFlashReplay(DraftModelReplay):
    """A DFlash block drafter (llama.cpp's draft-dflash): the block the oracle recorded at every position (n = its
    depth clamped to the block size - 1), cut where a confidence falls below ``p_min`` or at the cap; one decode per
    draft, its feature injection following every verify batch (the follow cost). Inside a non-causal block every
    slot sees the others, so a smaller ``n_max`` (a smaller block) drafts other tokens: replays at another block size
    than the recorded one are approximate (:attr:`state_note`)."""

    def candidate(self, cap, reason, p_min, n_min, active) -> Candidate:
        c = super().candidate(cap, reason, p_min, n_min, active)
        return dataclasses.replace(c, decodes=np.where(c.decodes > 0, 1, 0))

    def approximation(self, mode, n_max: int) -> str:
        limit = int(self.oracle.settings.get("draft_block_limit", 0))  # block_size - 1 of a non-causal head
        recorded, asked = min(self.oracle.depth, limit), min(n_max, limit)
        if limit and asked != recorded:
            return (
                f"its non-causal block at n_max={n_max} has {asked} mask slots, the oracle recorded blocks of "
                f"{recorded} (record it with depth={asked})"
            )
        return super().approximation(mode, n_max)


# -- llama.cpp's ngram-simple ---------------------------------------------------------------------------
class RunningAcceptance(Expectation):
    """The engine's running acceptance of a drafter without confidence (``NgramDrafter::observe`` /
    ``expected_accepted``): per depth j, how often token j was tested and accepted so far; the expected length
    is the sum over depths of the products of (accepted + 1) / (tested + 2)."""

    def __init__(self) -> None:
        self.tested: list[int] = []
        self.accepted: list[int] = []

    def expected(self, g: int, n: int) -> float:
        tested, accepted = self.tested, self.accepted
        seen = min(n, len(tested))
        e, reach = 0.0, 1.0
        for j in range(seen):
            reach *= (accepted[j] + 1.0) / (tested[j] + 2.0)
            e += reach
        for _ in range(seen, n):  # depths never tested: (0 + 1) / (0 + 2)
            reach *= 0.5
            e += reach
        return e

    def observe(self, g: int, n_proposed: int, n_match: int, n_emitted: int) -> None:
        tested, accepted = self.tested, self.accepted
        n = n_proposed if n_proposed < n_emitted else n_emitted
        if len(tested) < n:
            tested.extend([0] * (n - len(tested)))
            accepted.extend([0] * (n - len(accepted)))
        for j in range(n):
            tested[j] += 1
            if j >= n_match:
                break
            accepted[j] += 1


def ngram_simple_draft(tokens: list[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """llama.cpp's ``common_ngram_simple_draft`` (0.3.36, common/ngram-map.cpp): after the history ``tokens`` and the
    last sampled token, the (at most ``size_m``) tokens that followed the latest earlier occurrence of the last
    ``size_n`` tokens; empty without a match, with too short a history (``size_n + size_m + 1`` tokens or fewer) or
    a continuation shorter than ``size_n``. Uncut: llama.cpp's callers cut it (to the draft cap). A parameter error for
    a size below 1."""
    return list(native.ngram_simple_draft(tokens, sampled, size_n, size_m))  # the engine's (ngram_drafter.h)


class NgramSimpleReplay(DrafterReplay):
    """llama.cpp's ngram-simple prompt look-up: the oracle's look-up at every position, cut to the cap; no
    confidence (``p_min`` does not apply), a running acceptance for its expected accepted length. Its whole look-up
    (past the recorded depth) is :func:`ngram_simple_draft` of the path."""

    def candidate(self, cap, reason, p_min, n_min, active) -> Candidate:
        L, eos = self.length, self.eos
        asked = np.asarray(active)[..., None] & (cap > 0)
        n_raw = np.where(asked, np.minimum(L, cap), 0)
        stop = np.where(eos & (L <= cap), STOP["eos"], np.where(L >= cap, reason, STOP["exhausted"]))
        stop = np.where(asked, stop, reason).astype(np.int8)
        return Candidate(n_raw, stop, n_raw < np.asarray(n_min)[..., None], asked, np.zeros_like(n_raw))

    def expectation(self) -> Expectation:
        return RunningAcceptance()


# -- stateful drafters ----------------------------------------------------------------------------------
class DrafterState(abc.ABC):
    """A stateful drafter's replay along one walk: asked position by position (:meth:`propose`), told each step's
    outcome (:meth:`told`), it fills in its proposals' arrays (:meth:`candidate`) as the engine would have drafted
    them on that path."""

    asked: np.ndarray  #: per position: whether it was asked there
    n_raw: np.ndarray  #: per position: its proposal's length before ``n_min``
    n_min: int

    @abc.abstractmethod
    def propose(self, g: int) -> None:
        """The drafter is asked at position ``g``: its proposal there, its state advanced as the engine's."""

    @abc.abstractmethod
    def told(self, g: int, asked: bool, last: bool, n_accepted: int, replay: bool = False) -> None:
        """The step at ``g`` ended: ``asked``: it drafted there (or the step is a checkpoint replay, which keeps the
        last draft to judge); ``last``: its draft is the one verified last (llama.cpp's impl_last, this step or
        before) and llama.cpp tells it the outcome (at a partial acceptance under checkpoints it tells none; the
        ``replay`` step after it tells the replayed tokens, all accepted); ``n_accepted``: the tokens accepted."""

    @abc.abstractmethod
    def candidate(self) -> Candidate:
        """Its proposals at the positions asked so far (the arrays of :class:`Candidate`)."""


class LookupReplay(DrafterReplay):
    """A look-up drafter whose proposals depend on what it saw along the path (ngram-mod's table, filled in
    llama.cpp's chunks and reset after five low-acceptance steps; ngram-map's key statistics; ngram-cache's context
    cache and its cache files): the simulator walks step by step and asks :attr:`state` (a :class:`LookupState`
    over the engine's own drafter, made by :meth:`candidate` for one setting) at each position. Its tokens, lengths
    and accepted prefixes are those of the last walk (the oracle's recording, asked at every position, before
    any)."""

    stateful = True

    def __init__(self, oracle: OracleTrace, spec: DrafterSpec) -> None:
        super().__init__(oracle, spec)
        self._tokens = np.array(self.column("draft"), dtype=np.int32)
        self._length = self.column("draft_len").astype(np.int64)
        self._eos = self.column("draft_eos").astype(bool)
        self._match = self.oracle.accepted_prefix(self._tokens, self._length)
        self.state: DrafterState | None = None

    @property
    def tokens(self) -> np.ndarray:
        return self._tokens

    @property
    def length(self) -> np.ndarray:  # type: ignore[override]
        return self._length

    @property
    def eos(self) -> np.ndarray:  # type: ignore[override]
        return self._eos

    @property
    def match_len(self) -> np.ndarray:  # type: ignore[override]
        return self._match

    @property
    def path_tokens(self) -> list[int]:
        """The prompt, then the greedy path: position g's history is ``path_tokens[: n_prompt - 1 + g]`` and its last
        sampled token the one after."""
        return list(self.oracle.prompt_tokens) + [int(t) for t in self.oracle.columns["token"]]

    def candidate(self, cap, reason, p_min, n_min, active) -> Candidate:
        if np.ndim(cap) != 1 or np.ndim(n_min) or np.ndim(active):
            raise ParameterError(f"{self.spec.name} is replayed one setting at a time (its state follows the path)")
        self.state = self.start(np.asarray(cap), np.asarray(reason), int(n_min), bool(active) and self.available)
        return self.state.candidate()

    def record(self, g: int, tokens: list[int], stop: int) -> int:
        """The engine drafter's proposal at ``g`` (its ``tokens`` and stop reason) into the replay's arrays; returns
        its length."""
        n, accept = len(tokens), self.oracle.accept_tokens
        row = self._tokens[g]
        row[:] = -1
        row[:n] = tokens
        m = 0
        while m < n and g + m < len(accept) and row[m] == accept[g + m]:
            m += 1
        self._length[g], self._eos[g], self._match[g] = n, stop == STOP["eos"], m
        return n

    def walk(self) -> native.LookupWalk:
        """The engine's drafter at the start of a generation over the recording's path, with the recorded options
        (a cache file named there and gone is a ParameterError naming it)."""
        model = self.oracle.model
        eog = model.get("eog_tokens")
        if eog is None:  # recorded before 2026-11-29: the end-of-generation tokens the path shows
            tokens = np.asarray(self.oracle.columns["token"])
            eog = sorted(set(tokens[self.oracle.columns["token_eog"].astype(bool)].tolist()))
        n_vocab = int(model.get("n_vocab", np.iinfo(np.int32).max))
        options = option_values(recorded_options(self.oracle.settings, self.spec.options))
        return native.LookupWalk(
            self.spec.name, options, self.path_tokens, len(self.oracle.prompt_tokens), n_vocab, list(eog)
        )

    def start(self, cap: np.ndarray, reason: np.ndarray, n_min: int, active: bool) -> DrafterState:
        """A fresh state at the start of a generation (its begin), for one setting."""
        walk = self.walk()
        self._walk = walk  # held until the next setting's is made: a cache file the two read is read once
        return LookupState(self, cap, reason, n_min, active, walk)

    def expectation(self) -> Expectation:
        return RunningAcceptance()


class LookupState(DrafterState):
    """A look-up drafter's proposals along one walk: the engine's drafter (``native_ext/lookup_walk.h``) asked and
    told position by position as the engine asks and tells it on the path the walk takes."""

    def __init__(
        self, replay: LookupReplay, cap: np.ndarray, reason: np.ndarray, n_min: int, active: bool, walk
    ) -> None:
        T = len(cap)
        self.replay, self.walk, self.n_min, self.active = replay, walk, n_min, active
        self.cap, self.reason = cap.tolist(), reason.tolist()
        self.n_raw = np.zeros(T, dtype=np.int64)
        self.stop = np.asarray(reason, dtype=np.int8).copy()
        self.asked = np.zeros(T, dtype=bool)

    def candidate(self) -> Candidate:
        return Candidate(
            self.n_raw.copy(), self.stop.copy(), self.n_raw < self.n_min, self.asked.copy(), np.zeros_like(self.n_raw)
        )

    def propose(self, g: int) -> None:
        if not self.active:
            return
        found = self.walk.propose(g, self.cap[g], self.reason[g], self.n_min)
        if found is None:  # the engine's look-up drafters take no part at a cap of 0
            return
        tokens, stop = found
        self.n_raw[g], self.stop[g], self.asked[g] = self.replay.record(g, tokens, stop), stop, True

    def told(self, g: int, asked: bool, last: bool, n_accepted: int, replay: bool = False) -> None:
        self.walk.told(g, asked, last, n_accepted, replay)


register_replays(
    MtpReplay,
    DraftModelReplay,
    Eagle3Replay,
    DFlashReplay,
    NgramSimpleReplay,
    LookupReplay,
)
