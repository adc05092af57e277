"""Exact replay of drafting policies on an oracle trace, in numpy, without the model.

:func:`simulate` turns an :class:`~mtp_explorer.oracle.OracleTrace` and a policy (``n_max``,
``p_min``, ``n_min``, drafter) into a :class:`SimTrace`: the steps the engine would take, each with
its draft, accepted count, stop reason and predicted phase times. It follows ``Engine::step``
rule for rule (draft cap from budget and context, the ``p_min`` test before each draft token, stop
at an end-of-generation token, ``n_min`` drop, longest accepted prefix, the chain's choice by
expected accepted length), so under greedy decoding its per-step counts equal a real run's, up to
floating-point argmax ties between the real run's batched numerics and the oracle's: use
:func:`compare` to check a real trace step by step and to classify every difference.

:func:`simulate_grid` evaluates many settings over many oracles at once (vectorised over settings),
for sweeps; a single :func:`simulate` call costs about a millisecond, cheap enough for a slider.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

import numpy as np

from .oracle import OracleTrace
from .trace import DRAFTER_MODES, DRAFTERS, STOP_REASONS, Trace

_N_MAX, _P_MIN, _EOS, _BUDGET, _CONTEXT, _EXHAUSTED = (STOP_REASONS.index(r) for r in
                                                       ("n_max", "p_min", "eos", "budget", "context", "exhausted"))
_MTP, _NGRAM = DRAFTERS.index("mtp"), DRAFTERS.index("ngram")


class SimTrace(Trace):
    """A :class:`Trace` predicted by :func:`simulate`: the same columns, with the timing columns
    predicted by the oracle's cost model (``h_norm_*`` and ``draft_target_cos`` are NaN, and
    ``target_tokens`` past the first rejection are -1: the oracle only knows the greedy path).

    Extra per-step arrays in :attr:`sim`: ``n_decodes`` (MTP decodes of the draft call), ``g``
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

    def ceiling_tokens_per_second(self) -> float:
        """The bound with every draft accepted: each step drafts ``n_max`` tokens and keeps them all."""
        return ceiling_tokens_per_second(self.oracle, int(self.policy["n_max"]), self.policy["drafter"],
                                         int(self.policy["max_tokens"]))


def ceiling_tokens_per_second(oracle: OracleTrace, n_max: int, drafter: str = "mtp", max_tokens: int | None = None) -> float:
    """Tokens/s if every draft were accepted: each step drafts as many tokens as it may (``n_max``,
    cut by the budget and the context as the engine cuts it) and keeps them all, at the positions
    the steps reach (``n_max = 0``: plain decoding), from the oracle's cost model."""
    max_tokens = oracle.max_tokens if max_tokens is None else int(max_tokens)
    T = min(oracle.n_positions, max_tokens)
    if T == 0:
        return math.nan
    cap_at = _caps(oracle, n_max, max_tokens)[0]
    steps, g = [], 0
    while g < T:
        steps.append(g)
        g += int(cap_at[g]) + 1
    g = np.asarray(steps)
    cap = cap_at[g]
    k = cap + 1
    pos = oracle.columns["pos"][g].astype(np.float64)
    mode = "mtp" if n_max == 0 else drafter
    fresh = np.r_[True, k[1:] != k[:-1]]
    drafting = np.full(len(g), n_max > 0)
    parts = oracle.cost.step_ns(mode, drafting, cap > 0, k, cap, k, 0, None if mode == "mtp" else cap > 0,
                                pos=pos, fresh=fresh)
    seconds = float(sum(np.broadcast_to(np.asarray(p, dtype=np.float64), g.shape).sum() for p in parts)) / 1e9
    return T / seconds


# -- per-position candidates ------------------------------------------------------------------------
def _caps(oracle: OracleTrace, n_max, max_tokens: int):
    """Draft cap and its reason at every position (broadcast over leading setting axes)."""
    c = oracle.columns
    T = oracle.n_positions
    g = np.arange(T)
    budget = max_tokens - g - 1
    ctx = int(oracle.settings["n_ctx"]) - c["pos"].astype(np.int64) - 2
    n_max = np.asarray(n_max)[..., None]
    cap = np.broadcast_to(n_max, np.broadcast(n_max, g).shape).astype(np.int64)
    reason = np.full(cap.shape, _N_MAX, dtype=np.int8)
    reason = np.where(budget < cap, _BUDGET, reason)
    cap = np.minimum(cap, budget)
    reason = np.where(ctx < cap, _CONTEXT, reason)
    cap = np.minimum(cap, ctx)
    return np.maximum(cap, 0), reason


def _mtp_candidate(oracle: OracleTrace, cap, reason, p_min, n_min, drafting):
    """The MTP draft at every position: (n_raw, stop, decodes, dropped)."""
    c = oracle.columns
    L = c["chain_len"].astype(np.int64)
    eos = c["chain_eos"].astype(bool)
    prob = c["chain_prob"]
    N = prob.shape[1]
    valid = np.arange(N)[None, :] < L[:, None]
    # prefix length with every confidence >= p_min (the engine compares float32 values)
    p = np.asarray(p_min, dtype=np.float32)[..., None, None]
    ok = np.where(valid, prob >= p, False)
    d_pmin = np.where(ok.all(axis=-1), N, np.argmin(ok, axis=-1))
    d_pmin = np.minimum(d_pmin, L)
    drafting = np.asarray(drafting)[..., None] & (cap > 0)
    pstop = d_pmin < np.minimum(cap, L)
    eosstop = ~pstop & eos & (L <= cap)
    n_raw = np.where(pstop, d_pmin, np.where(eosstop, L, cap))
    if (~pstop & ~eosstop & (L < cap) & drafting).any():
        raise ValueError("the oracle's chains are shorter than this policy drafts (depth too small?)")
    stop = np.where(pstop, _P_MIN, np.where(eosstop, _EOS, reason))
    decodes = np.where(pstop, d_pmin + 1, n_raw)
    n_raw = np.where(drafting, n_raw, 0)
    decodes = np.where(drafting, decodes, 0)
    stop = np.where(drafting, stop, reason).astype(np.int8)
    dropped = n_raw < np.asarray(n_min)[..., None]
    return n_raw, stop, decodes, dropped


def _ngram_candidate(oracle: OracleTrace, cap, reason, n_min, asked):
    c = oracle.columns
    L = c["ngram_len"].astype(np.int64)
    eos = c["ngram_eos"].astype(bool)
    asked = np.asarray(asked)[..., None] & (cap > 0)
    n_raw = np.where(asked, np.minimum(L, cap), 0)
    stop = np.where(eos & (L <= cap), _EOS, np.where(L >= cap, reason, _EXHAUSTED))
    stop = np.where(asked, stop, reason).astype(np.int8)
    dropped = n_raw < np.asarray(n_min)[..., None]
    return n_raw, stop, dropped


def _expected_mtp(oracle: OracleTrace) -> np.ndarray:
    """[T, N+1]: expected accepted length of the first n chain tokens (sum of prefix products, in
    float64 like the engine)."""
    prob = np.nan_to_num(oracle.columns["chain_prob"].astype(np.float64), nan=0.0)
    cum = np.cumsum(np.cumprod(prob, axis=1), axis=1)
    return np.concatenate([np.zeros((prob.shape[0], 1)), cum], axis=1)


class _NgramStats:
    """The n-gram drafter's running acceptance (NgramDrafter::observe / expected_accepted)."""

    def __init__(self) -> None:
        self.tested: list[int] = []
        self.accepted: list[int] = []

    def expected(self, n: int) -> float:
        e, reach = 0.0, 1.0
        for j in range(n):
            t = self.tested[j] if j < len(self.tested) else 0
            a = self.accepted[j] if j < len(self.accepted) else 0
            reach *= (a + 1.0) / (t + 2.0)
            e += reach
        return e

    def observe(self, n_proposed: int, n_match: int, n_emitted: int) -> None:
        n = min(n_proposed, n_emitted)
        while len(self.tested) < n:
            self.tested.append(0)
            self.accepted.append(0)
        for j in range(n):
            self.tested[j] += 1
            if j >= n_match:
                break
            self.accepted[j] += 1


# -- simulate -----------------------------------------------------------------------------------------
def _check_policy(oracle: OracleTrace, n_max: int, p_min: float, n_min: int, drafter: str, max_tokens: int) -> None:
    if drafter not in DRAFTER_MODES:
        raise ValueError(f"drafter must be one of {DRAFTER_MODES}, got {drafter!r}")
    if not isinstance(n_max, (int, np.integer)) or not 0 <= n_max <= oracle.depth:
        raise ValueError(f"n_max must be between 0 and the oracle's depth {oracle.depth}, got {n_max!r}")
    if not (isinstance(p_min, (int, float, np.floating)) and 0.0 <= p_min <= 1.0):
        raise ValueError(f"p_min must be in [0, 1], got {p_min!r}")
    if not isinstance(n_min, (int, np.integer)) or not 0 <= n_min <= n_max:
        raise ValueError(f"n_min must be between 0 and n_max, got {n_min!r}")
    if not 1 <= max_tokens <= oracle.max_tokens:
        raise ValueError(f"max_tokens must be between 1 and the oracle's {oracle.max_tokens}, got {max_tokens}")
    if n_max > 0 and drafter != "ngram" and not oracle.has_mtp:
        raise ValueError("the oracle's model has no MTP head: use drafter='ngram' or n_max=0")


def _run_policy(oracle: OracleTrace, n_max: int, p_min: float, n_min: int, drafter: str, max_tokens: int,
                start_steps: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The per-step outcome of a policy: steps start at the positions it visits, or (``start_steps``
    given) at those positions (aligned prediction for :func:`compare`)."""
    T_end = min(oracle.n_positions, max_tokens)
    cap, reason = _caps(oracle, n_max, max_tokens)
    use_mtp = drafter != "ngram" and oracle.has_mtp
    use_ngram = drafter != "mtp"
    drafting = use_mtp and n_max > 0
    asked = use_ngram and n_max > 0
    m_raw, m_stop, m_dec, m_drop = _mtp_candidate(oracle, cap, reason, p_min, n_min, drafting)
    n_raw, n_stop, n_drop = _ngram_candidate(oracle, cap, reason, n_min, asked)
    m_match = oracle.match_len
    n_match = oracle.ngram_match_len
    e_mtp_tab = _expected_mtp(oracle)
    T = oracle.n_positions

    m_ok = drafting & ~m_drop & (m_raw > 0)
    n_ok = (asked & ~n_drop & (n_raw > 0)) if asked else np.zeros(T, bool)
    e_mtp = e_mtp_tab[np.arange(T), m_raw] if drafting else np.full(T, np.nan)

    if drafter != "chain" and start_steps is None:
        # the choice does not depend on the history: vectorised, then follow the path
        if drafter == "mtp":
            src = np.where(m_ok, _MTP, -1)
            n_d = np.where(m_drop, 0, m_raw)
            acc = np.minimum(n_d, m_match)
        else:
            src = np.where(n_ok, _NGRAM, -1)
            n_d = np.where(n_drop, 0, n_raw)
            acc = np.minimum(n_d, n_match)
        nxt = (np.arange(T) + acc + 1).tolist()
        path, g = [], 0
        while g < T_end:
            path.append(g)
            g = nxt[g]
        P = np.asarray(path, dtype=np.int64)
        choose_ngram = np.full(len(P), drafter == "ngram")
    else:
        # sequential: the chain's choice reads the n-gram drafter's running acceptance
        stats = _NgramStats()
        starts = list(start_steps) if start_steps is not None else None
        path, choice, e_ng_list = [], [], []
        g, i = (starts[0] if starts else 0), 0
        m_ok_l, n_ok_l = m_ok.tolist(), n_ok.tolist()
        e_mtp_l = e_mtp.tolist()
        m_raw_l, n_raw_l, m_drop_l, n_drop_l = m_raw.tolist(), n_raw.tolist(), m_drop.tolist(), n_drop.tolist()
        m_match_l, n_match_l = m_match.tolist(), n_match.tolist()
        while g < T_end:
            e_ng = stats.expected(n_raw_l[g]) if asked else math.nan
            if drafter == "ngram":
                ng = True
            elif drafter == "mtp":
                ng = False
            else:
                ng = n_ok_l[g] and (not m_ok_l[g] or e_ng > e_mtp_l[g])
            if ng:
                nd = 0 if n_drop_l[g] else n_raw_l[g]
                a = min(nd, n_match_l[g])
            else:
                nd = 0 if m_drop_l[g] else m_raw_l[g]
                a = min(nd, m_match_l[g])
            if asked:
                stats.observe(n_raw_l[g], n_match_l[g], a + 1)
            path.append(g)
            choice.append(ng)
            e_ng_list.append(e_ng)
            i += 1
            if starts is not None:
                if i >= len(starts):
                    break
                g = starts[i]
            else:
                g = g + a + 1
        P = np.asarray(path, dtype=np.int64)
        choose_ngram = np.asarray(choice, dtype=bool)
        e_ng_path = np.asarray(e_ng_list, dtype=np.float64)

    S = len(P)
    ng = choose_ngram
    n_d = np.where(ng, np.where(n_drop[P], 0, n_raw[P]), np.where(m_drop[P], 0, m_raw[P]))
    match = np.where(ng, n_match[P], m_match[P])
    acc = np.minimum(n_d, match)
    src = np.where(ng, np.where(n_ok[P], _NGRAM, -1), np.where(m_ok[P], _MTP, -1)).astype(np.int8)
    stop = np.where(ng, n_stop[P], m_stop[P]).astype(np.int8)
    if drafter != "chain" and start_steps is None:
        e_ng_path = _ngram_expected_along(oracle, P, n_raw, n_match, acc, asked)
    e_m = e_mtp[P]
    expected = np.where(src == _MTP, e_m, np.where(src == _NGRAM, e_ng_path, np.nan))
    return {
        "g": P, "n_drafted": n_d, "n_accepted": acc, "stop_reason": stop, "drafter": src,
        "from_ngram": ng, "n_decodes": m_dec[P], "cap": cap[P], "expected_accepted": expected,
        "cand_len_mtp": m_raw[P] if drafting else np.full(S, -1),
        "cand_len_ngram": np.where(cap[P] > 0, n_raw[P], -1) if asked else np.full(S, -1),
        "cand_exp_mtp": e_m if drafting else np.full(S, np.nan),
        "cand_exp_ngram": np.where(cap[P] > 0, e_ng_path, np.nan) if asked else np.full(S, np.nan),
        "drafting": np.full(S, drafting), "asked": np.full(S, asked) & (cap[P] > 0),
    }


def _ngram_expected_along(oracle, P, n_raw, n_match, acc, asked) -> np.ndarray:
    if not asked:
        return np.full(len(P), np.nan)
    stats = _NgramStats()
    out = np.empty(len(P))
    for i, (g, a) in enumerate(zip(P.tolist(), acc.tolist())):
        out[i] = stats.expected(int(n_raw[g]))
        stats.observe(int(n_raw[g]), int(n_match[g]), a + 1)
    return out


def simulate(oracle: OracleTrace, n_max: int = 3, p_min: float = 0.0, n_min: int = 0, *, drafter: str = "mtp",
             max_tokens: int | None = None) -> SimTrace:
    """Replay a policy on an oracle trace: the steps the engine would take, and predicted timings.

    ``n_max <= oracle.depth``; ``max_tokens`` defaults to (and may not exceed) the oracle's budget.
    """
    max_tokens = oracle.max_tokens if max_tokens is None else int(max_tokens)
    _check_policy(oracle, n_max, p_min, n_min, drafter, max_tokens)
    r = _run_policy(oracle, int(n_max), float(p_min), int(n_min), drafter, max_tokens)
    return _build_trace(oracle, r, int(n_max), float(p_min), int(n_min), drafter, max_tokens)


def _phase_times(oracle: OracleTrace, r: dict[str, np.ndarray], drafter: str):
    cm = oracle.cost
    k = r["n_drafted"] + 1
    tel = bool(oracle.settings.get("telemetry", True))
    rows = np.where(tel, k, r["n_accepted"] + 1)
    fresh = np.ones(len(k), dtype=bool)
    fresh[1:] = k[1:] != k[:-1]
    pos = oracle.columns["pos"][r["g"]].astype(np.float64)
    return cm.step_ns(drafter, r["drafting"], r["cap"] > 0, k, r["n_decodes"], rows,
                      r["n_drafted"] - r["n_accepted"], r["asked"] if drafter != "mtp" else None,
                      pos=pos, fresh=fresh)


def _build_trace(oracle: OracleTrace, r: dict[str, np.ndarray], n_max, p_min, n_min, drafter, max_tokens) -> SimTrace:
    c = oracle.columns
    P = r["g"]
    S = len(P)
    D = int(oracle.settings["capacity"])
    N = oracle.depth
    K = c["topk_ids"].shape[2]
    n_d = r["n_drafted"]
    acc = r["n_accepted"]
    ng = r["from_ngram"]
    depth_idx = np.arange(D)[None, :]
    real = depth_idx < n_d[:, None]
    chain_w = np.full((oracle.n_positions, D), -1, dtype=np.int32)
    chain_w[:, :N] = c["chain"]
    ngram_w = np.full((oracle.n_positions, D), -1, dtype=np.int32)
    ngram_w[:, :N] = c["ngram"]
    prob_w = np.full((oracle.n_positions, D), np.nan, dtype=np.float32)
    prob_w[:, :N] = c["chain_prob"]
    drafted = np.where(real, np.where(ng[:, None], ngram_w[P], chain_w[P]), -1).astype(np.int32)
    draft_prob = np.where(real & ~ng[:, None], prob_w[P], np.nan).astype(np.float32)
    topk_ids = np.full((S, D, K), -1, dtype=np.int32)
    topk_probs = np.full((S, D, K), np.nan, dtype=np.float32)
    mtp_real = real[:, :N] & ~ng[:, None]
    topk_ids[:, :N] = np.where(mtp_real[..., None], c["topk_ids"][P], -1)
    topk_probs[:, :N] = np.where(mtp_real[..., None], c["topk_probs"][P], np.nan)
    tok = np.asarray(c["token"], dtype=np.int32)
    T = oracle.n_positions
    tidx = P[:, None] + np.arange(D + 1)[None, :]
    known = np.arange(D + 1)[None, :] <= acc[:, None]
    target_tokens = np.where(known, tok[np.minimum(tidx, T - 1)], -1).astype(np.int32)
    correction = tok[P + acc]
    rollback = (n_d - acc).astype(np.int32)
    recurrent = bool(oracle.settings.get("is_recurrent", False))
    rs_slot = np.where(recurrent & (rollback > 0), rollback, -1).astype(np.int32)
    catchup, draft, verify, sample = _phase_times(oracle, r, drafter)
    nan_d = np.full((S, D), np.nan, dtype=np.float32)
    columns = {
        "step": np.arange(S, dtype=np.int32), "pos": c["pos"][P].astype(np.int32),
        "n_max": np.full(S, n_max, np.int32), "p_min": np.full(S, p_min, np.float32),
        "n_min": np.full(S, n_min, np.int32),
        "drafted": drafted, "n_drafted": n_d.astype(np.int32), "n_accepted": acc.astype(np.int32),
        "draft_prob": draft_prob, "topk_ids": topk_ids, "topk_probs": topk_probs,
        "target_tokens": target_tokens, "stop_reason": r["stop_reason"].astype(np.int8),
        "correction": correction.astype(np.int32), "rollback": rollback, "rs_slot": rs_slot,
        "h_norm_target": np.full((S, D + 1), np.nan, dtype=np.float32), "h_norm_draft": nan_d,
        "draft_target_cos": nan_d.copy(),
        "t_catchup_ns": np.rint(catchup).astype(np.int64), "t_draft_ns": np.rint(draft).astype(np.int64),
        "t_verify_ns": np.rint(verify).astype(np.int64), "t_sample_ns": np.rint(sample).astype(np.int64),
        "drafter": r["drafter"].astype(np.int8), "expected_accepted": r["expected_accepted"].astype(np.float32),
        "candidate_len": np.stack([r["cand_len_mtp"], r["cand_len_ngram"]], axis=1).astype(np.int32),
        "candidate_expected": np.stack([r["cand_exp_mtp"], r["cand_exp_ngram"]], axis=1).astype(np.float32),
    }
    n_tok = int(P[-1] + acc[-1] + 1) if S else 0
    tokens = [int(t) for t in oracle.tokens[:n_tok]]
    pieces = oracle.pieces[:n_tok]
    if n_tok == oracle.n_positions:
        finish = oracle.finish_reason
    else:
        finish = "budget"
    policy = {"n_max": n_max, "p_min": p_min, "n_min": n_min, "drafter": drafter, "max_tokens": max_tokens}
    settings = dict(oracle.settings) | policy | {"simulated": True}
    return SimTrace(
        oracle=oracle, policy=policy, sim={"n_decodes": r["n_decodes"], "g": P},
        prompt=oracle.prompt, prompt_tokens=list(oracle.prompt_tokens), tokens=tokens,
        text="".join(pieces), pieces=list(pieces), columns=columns, finish_reason=finish,
        settings=settings, model=dict(oracle.model), t_prefill_ns=0,
    )


# -- grids ---------------------------------------------------------------------------------------------
def simulate_grid(oracles: OracleTrace | Iterable[OracleTrace], n_max: Sequence[int], p_min: Sequence[float],
                  n_min: int | Sequence[int] = 0, *, drafter: str = "mtp", labels: Sequence[Any] | None = None):
    """Summary metrics of every (oracle, n_max, p_min) combination as a pandas DataFrame.

    Vectorised over settings for ``drafter="mtp"``/``"ngram"`` (chain replays each setting).
    Columns: ``prompt`` (label), ``n_max``, ``p_min``, ``n_min``, ``drafter``, ``n_tokens``,
    ``n_steps``, ``n_drafted``, ``n_accepted``, ``acceptance_rate``, ``mean_accepted_length``,
    ``acceptance_by_depth`` (list), ``tokens_per_second`` (predicted), ``ceiling_tokens_per_second``,
    ``plain_tokens_per_second``, ``seconds``.
    """
    import pandas as pd

    if isinstance(oracles, OracleTrace):
        oracles = [oracles]
    oracles = list(oracles)
    labels = list(labels) if labels is not None else [o.prompt for o in oracles]
    n_max_l = [int(n) for n in n_max]
    p_min_l = [float(p) for p in p_min]
    grid_n = np.repeat(np.asarray(n_max_l, dtype=np.int64), len(p_min_l))
    grid_p = np.tile(np.asarray(p_min_l, dtype=np.float64), len(n_max_l))
    nm = np.broadcast_to(np.asarray(n_min, dtype=np.int64), grid_n.shape)
    grid_nmin = np.minimum(nm, grid_n)
    rows = []
    for label, oracle in zip(labels, oracles):
        for n, p, m in zip(grid_n.tolist(), grid_p.tolist(), grid_nmin.tolist()):
            _check_policy(oracle, n, p, m, drafter, oracle.max_tokens)
        if drafter == "chain":
            stats = [_stats_of(oracle, _run_policy(oracle, n, p, m, drafter, oracle.max_tokens), n, drafter)
                     for n, p, m in zip(grid_n.tolist(), grid_p.tolist(), grid_nmin.tolist())]
        else:
            stats = _grid_stats(oracle, grid_n, grid_p, grid_nmin, drafter)
        for i, st in enumerate(stats):
            rows.append({"prompt": label, "n_max": int(grid_n[i]), "p_min": float(grid_p[i]),
                         "n_min": int(grid_nmin[i]), "drafter": drafter} | st)
    return pd.DataFrame(rows)


def _stats_of(oracle: OracleTrace, r: dict[str, np.ndarray], n_max: int, drafter: str) -> dict:
    c, d, v, s = _phase_times(oracle, r, drafter)
    seconds = float((c + d + v + s).sum()) / 1e9
    n_d, acc = r["n_drafted"], r["n_accepted"]
    n_tok = int(r["g"][-1] + acc[-1] + 1) if len(acc) else 0
    return _metrics(oracle, n_tok, len(acc), n_d, acc, seconds, n_max, drafter)


def _metrics(oracle, n_tok, n_steps, n_d, acc, seconds, n_max, drafter) -> dict:
    by_depth = []
    for d in range(1, oracle.depth + 1):
        reached = n_d >= d
        by_depth.append(float((acc[reached] >= d).mean()) if reached.any() else math.nan)
    n_drafted, n_acc = int(n_d.sum()), int(acc.sum())
    return {
        "n_tokens": n_tok, "n_steps": n_steps, "n_drafted": n_drafted, "n_accepted": n_acc,
        "acceptance_rate": n_acc / n_drafted if n_drafted else math.nan,
        "mean_accepted_length": n_acc / n_steps if n_steps else math.nan,
        "acceptance_by_depth": by_depth,
        "tokens_per_second": n_tok / seconds if seconds > 0 else math.nan,
        "ceiling_tokens_per_second": ceiling_tokens_per_second(oracle, n_max, drafter),
        "plain_tokens_per_second": ceiling_tokens_per_second(oracle, 0),
        "seconds": seconds,
    }


def _grid_stats(oracle: OracleTrace, grid_n, grid_p, grid_nmin, drafter: str) -> list[dict]:
    """All settings of one oracle at once: per-position outcomes as [S, T] arrays, then the paths
    followed in lock step."""
    T = oracle.n_positions
    S = len(grid_n)
    max_tokens = oracle.max_tokens
    T_end = min(T, max_tokens)
    cap, reason = _caps(oracle, grid_n, max_tokens)
    use_mtp = drafter == "mtp" and oracle.has_mtp
    drafting = (grid_n > 0) & use_mtp
    if drafter == "mtp":
        n_raw, _, decodes, dropped = _mtp_candidate(oracle, cap, reason, grid_p, grid_nmin, drafting)
        match = oracle.match_len[None, :]
        asked = None
    else:
        asked_s = grid_n > 0
        n_raw, _, dropped = _ngram_candidate(oracle, cap, reason, grid_nmin, asked_s)
        decodes = np.zeros_like(n_raw)
        match = oracle.ngram_match_len[None, :]
        asked = asked_s[:, None] & (cap > 0)
    n_d = np.where(dropped, 0, n_raw)
    acc = np.minimum(n_d, match)
    k = n_d + 1
    tel = bool(oracle.settings.get("telemetry", True))
    rows_sampled = k if tel else acc + 1
    pos = oracle.columns["pos"].astype(np.float64)[None, :]
    c, d, v, s = oracle.cost.step_ns(drafter, drafting[:, None], cap > 0, k, decodes, rows_sampled, n_d - acc, asked,
                                     pos=pos, fresh=True)
    step_fresh = c + d + v + s
    step_reused = step_fresh - oracle.cost.fresh_ns
    nxt = np.arange(T)[None, :] + acc + 1
    # follow every lane's path in lock step (the verify graph is reused when k repeats)
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
    n_steps = visited.sum(axis=1)
    seconds = total_ns / 1e9
    n_drafted = np.where(visited, n_d, 0).sum(axis=1)
    n_accepted = np.where(visited, acc, 0).sum(axis=1)
    by_depth = []
    for dd in range(1, oracle.depth + 1):
        reached = (visited & (n_d >= dd)).sum(axis=1)
        hit = (visited & (acc >= dd)).sum(axis=1)
        by_depth.append(np.where(reached > 0, hit / np.maximum(reached, 1), np.nan))
    by_depth = np.stack(by_depth, axis=1)
    ceiling = {n: ceiling_tokens_per_second(oracle, n, drafter) for n in set(grid_n.tolist())}
    plain = ceiling_tokens_per_second(oracle, 0)
    out = []
    for i in range(S):
        nd, na, ns, sec = int(n_drafted[i]), int(n_accepted[i]), int(n_steps[i]), float(seconds[i])
        out.append({
            "n_tokens": T_end, "n_steps": ns, "n_drafted": nd, "n_accepted": na,
            "acceptance_rate": na / nd if nd else math.nan,
            "mean_accepted_length": na / ns if ns else math.nan,
            "acceptance_by_depth": by_depth[i].tolist(),
            "tokens_per_second": T_end / sec if sec > 0 else math.nan,
            "ceiling_tokens_per_second": ceiling[int(grid_n[i])],
            "plain_tokens_per_second": plain,
            "seconds": sec,
        })
    return out


# -- exactness -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Comparison:
    """A real trace checked step by step against the oracle's prediction at the same positions.

    ``mismatches``: one dict per differing step with ``step``, ``g``, the real and predicted values,
    ``kind`` (``tie`` or ``unexplained``) and ``cause``: ``target_argmax`` (the real run's greedy
    token differs where the target's top-2 logits are within ``tol_logit``: the rest of the run is
    not comparable), ``draft_argmax`` (a draft token differs where the MTP head's top-2 are within
    ``tol_logit`` / ``tol_prob``), ``p_min_threshold`` (a confidence within ``tol_prob`` of
    ``p_min``), ``chain_choice`` (the chain's two expected lengths within ``tol_prob`` of each other,
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


def compare(oracle: OracleTrace, trace: Trace, *, tol_logit: float = 1e-3, tol_prob: float = 1e-4) -> Comparison:
    """Check every step of a real greedy ``trace`` against the oracle's prediction for the same
    position and the settings in force at that step (live ``set_params`` changes included; in the
    chain mode the n-gram drafter's running acceptance is then replayed per stretch of constant
    settings, so a change mid-run can leave chain choices unexplained)."""
    c = trace.columns
    drafter = trace.settings.get("drafter", "mtp")
    n_steps = trace.n_steps
    otok = oracle.tokens
    mismatches: list[dict] = []
    g = 0
    n_compared = 0
    # the steps grouped by the settings in force (the chain's statistics run across all of them)
    starts = []
    for i in range(n_steps):
        starts.append(g)
        g += int(c["n_accepted"][i]) + 1
    real_tokens = trace.tokens
    diverge = next((i for i, (a, b) in enumerate(zip(real_tokens, otok)) if a != b), None)
    settings = list(zip(c["n_max"].tolist(), c["p_min"].tolist(), c["n_min"].tolist()))
    pred_by_step: dict[int, dict] = {}
    i = 0
    while i < n_steps:
        j = i
        while j < n_steps and settings[j] == settings[i]:
            j += 1
        n_max, p_min, n_min = settings[i]
        seg = [s for s in starts[i:j] if s < oracle.n_positions]
        if seg:
            r = _run_policy(oracle, int(n_max), float(np.float32(p_min)), int(n_min), drafter,
                            int(trace.settings.get("max_tokens", oracle.max_tokens)), start_steps=seg)
            for q, step in enumerate(range(i, i + len(seg))):
                pred_by_step[step] = {key: val[q] for key, val in r.items() if isinstance(val, np.ndarray)}
        i = j
    for i in range(n_steps):
        g = starts[i]
        if diverge is not None and g > diverge:
            break
        if i not in pred_by_step:
            break
        pr = pred_by_step[i]
        n_compared += 1
        real_nd, real_acc = int(c["n_drafted"][i]), int(c["n_accepted"][i])
        real_draft = c["drafted"][i, :real_nd].tolist()
        pred_nd, pred_acc = int(pr["n_drafted"]), int(pr["n_accepted"])
        from_ng = bool(pr["from_ngram"])
        pred_draft = (oracle.columns["ngram"] if from_ng else oracle.columns["chain"])[g, :pred_nd].tolist()
        real_src = int(c["drafter"][i]) if "drafter" in c else (_MTP if real_nd else -1)
        same = (real_nd == pred_nd and real_acc == pred_acc and real_draft == pred_draft
                and int(c["stop_reason"][i]) == int(pr["stop_reason"]) and real_src == int(pr["drafter"]))
        if same and (diverge is None or g + real_acc < diverge):
            continue
        mm = {"step": i, "g": g, "n_max": settings[i][0], "p_min": settings[i][1], "n_min": settings[i][2],
              "real": {"n_drafted": real_nd, "n_accepted": real_acc, "drafted": real_draft,
                       "stop_reason": STOP_REASONS[int(c["stop_reason"][i])],
                       "drafter": DRAFTERS[real_src] if real_src >= 0 else None},
              "predicted": {"n_drafted": pred_nd, "n_accepted": pred_acc, "drafted": pred_draft,
                            "stop_reason": STOP_REASONS[int(pr["stop_reason"])],
                            "drafter": DRAFTERS[int(pr["drafter"])] if int(pr["drafter"]) >= 0 else None}}
        mm.update(_classify(oracle, trace, i, g, pr, diverge, tol_logit, tol_prob))
        mismatches.append(mm)
        if mm["cause"] == "target_argmax":
            break
    return Comparison(n_steps=n_steps, n_compared=n_compared, mismatches=mismatches)


def _classify(oracle, trace, i, g, pr, diverge, tol_logit, tol_prob) -> dict:
    c = trace.columns
    oc = oracle.columns
    real_nd = int(c["n_drafted"][i])
    real_acc = int(c["n_accepted"][i])
    if diverge is not None and g + real_acc >= diverge:
        margin = float(oc["target_margin"][diverge]) if diverge < oracle.n_positions else math.inf
        return {"kind": "tie" if margin < tol_logit else "unexplained", "cause": "target_argmax",
                "margin": margin, "position": diverge}
    p_min = float(np.float32(c["p_min"][i]))
    L = int(oc["chain_len"][g])
    real_draft = c["drafted"][i, :real_nd]
    # a draft token that differs: an argmax tie in the MTP head?
    if not pr["from_ngram"] and (int(c["drafter"][i]) if "drafter" in c else 0) != _NGRAM:
        for j in range(min(real_nd, L)):
            if int(real_draft[j]) != int(oc["chain"][g, j]):
                margin = float(oc["chain_margin"][g, j])
                tp = c["topk_probs"][i, j]
                real_gap = float(tp[0] - tp[1]) if tp.shape[0] > 1 and not np.isnan(tp[1]) else math.inf
                tie = margin < tol_logit or real_gap < tol_prob
                return {"kind": "tie" if tie else "unexplained", "cause": "draft_argmax", "margin": margin,
                        "depth": j + 1}
    # the same tokens but a different cut: a confidence at p_min?
    probs = list(oc["chain_prob"][g, :L]) + list(c["draft_prob"][i, :real_nd])
    near = [float(p) for p in probs if not math.isnan(p) and abs(float(p) - p_min) < tol_prob]
    if near and p_min > 0:
        return {"kind": "tie", "cause": "p_min_threshold", "margin": min(abs(p - p_min) for p in near)}
    if "candidate_expected" in c:
        e = c["candidate_expected"][i]
        if not np.isnan(e).any() and abs(float(e[0]) - float(e[1])) < tol_prob:
            return {"kind": "tie", "cause": "chain_choice", "margin": abs(float(e[0]) - float(e[1]))}
    return {"kind": "unexplained", "cause": "none", "margin": math.nan}


def settings_grid(n_max: Sequence[int], p_min: Sequence[float]) -> list[tuple[int, float]]:
    return [(int(n), float(p)) for n in n_max for p in p_min]


# -- cost model consistency ---------------------------------------------------------------------------
_PHASES = ("catchup", "draft", "verify", "sample")


def cost_consistency(oracle: OracleTrace, trace: Trace) -> dict[str, Any]:
    """How well the oracle's cost model predicts a real run's step times.

    The steps of ``trace`` are predicted where they happened (same positions, settings, draft
    sizes, graph reuse), then compared phase by phase. ``ratio_raw`` is measured / predicted time in
    total; on a shared machine it carries the spikes of whatever else runs. ``ratio_robust`` groups
    the steps by phase and shape (verify: rows and whether the graph was reused; catch-up: rows;
    draft: MTP decodes), takes each group's median measured / predicted ratio, and weighs it by the
    group's predicted time: how far the model is from the typical step, spikes aside.
    """
    c = trace.columns
    drafter = trace.settings.get("drafter", "mtp")
    starts, g = [], 0
    for a in c["n_accepted"].tolist():
        starts.append(g)
        g += a + 1
    n_max, p_min, n_min = int(c["n_max"][0]), float(c["p_min"][0]), int(c["n_min"][0])
    if not ((c["n_max"] == n_max).all() and (c["p_min"] == c["p_min"][0]).all()):
        raise ValueError("cost_consistency needs a trace with constant settings")
    r = _run_policy(oracle, n_max, float(np.float32(p_min)), n_min, drafter,
                    int(trace.settings.get("max_tokens", oracle.max_tokens)), start_steps=starts)
    if len(r["g"]) != trace.n_steps or not np.array_equal(r["n_drafted"], c["n_drafted"]):
        raise ValueError("the trace's steps differ from the oracle's prediction (see compare())")
    pred = dict(zip(_PHASES, _phase_times(oracle, r, drafter)))
    k = r["n_drafted"] + 1
    fresh = np.ones(len(k), dtype=bool)
    fresh[1:] = k[1:] != k[:-1]
    keys = {"verify": k * 2 + fresh, "catchup": k, "draft": r["n_decodes"], "sample": np.zeros(len(k), int)}
    out: dict[str, Any] = {"per_phase": {}}
    total_pred = total_meas = total_robust = 0.0
    for ph in _PHASES:
        p = np.broadcast_to(np.asarray(pred[ph], dtype=np.float64), k.shape)
        m = c[f"t_{ph}_ns"].astype(np.float64)
        robust = 0.0
        for key in np.unique(keys[ph]):
            sel = (keys[ph] == key) & (p > 0)
            if sel.any():
                robust += float(np.median(m[sel] / p[sel])) * float(p[sel].sum())
        out["per_phase"][ph] = {"predicted_s": p.sum() / 1e9, "measured_s": m.sum() / 1e9, "robust_s": robust / 1e9}
        total_pred += p.sum()
        total_meas += m.sum()
        total_robust += robust
    out["predicted_seconds"] = total_pred / 1e9
    out["measured_seconds"] = total_meas / 1e9
    out["robust_measured_seconds"] = total_robust / 1e9
    out["ratio_raw"] = total_meas / total_pred if total_pred else math.nan
    out["ratio_robust"] = total_robust / total_pred if total_pred else math.nan
    n_tok = len(trace.tokens)
    out["predicted_tokens_per_second"] = n_tok / out["predicted_seconds"] if total_pred else math.nan
    out["measured_tokens_per_second"] = n_tok / out["measured_seconds"] if total_meas else math.nan
    out["robust_measured_tokens_per_second"] = n_tok / out["robust_measured_seconds"] if total_robust else math.nan
    return out
