"""A greedy request drafted by a chain with ngram-simple, step by step as a llama-server 0.3.36 slot runs it where
the server differs from this engine: :func:`server_lookup_steps`.

- the look-up's draft is cut by the budget left minus one and the context only, not by ``n_max``
  (``server_slot::get_n_draft_max``; :func:`~mtp_explorer.analysis.replay.ngram_simple_draft` of the path gives the
  whole look-up past the oracle's depth); the model drafters' by ``n_max`` too;
- on a recurrent target, a rejection that rolls back more tokens than the target's snapshot slots (``n_rs_seq``:
  ``--spec-draft-n-max`` of them with a model drafter in the chain, none without) restores the speculative
  checkpoint, and the next step verifies the accepted tokens and the correction again (``spec_is_replay``), drafting
  nothing: it emits them and the token after them;
- no draft before the first token (a slot samples it from the prompt's last batch), and a model drafter that stops
  at an end-of-generation token drafts on to its cap (counted in ``draft_n``, not verified).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from ..core import drafters
from ..core.settings import DraftSettings
from .replay import STOP, ngram_simple_draft
from .walk import draft_caps

if TYPE_CHECKING:
    from .oracle import OracleTrace

__all__ = ["ServerLookupSteps", "server_lookup_steps"]


@dataclasses.dataclass(frozen=True)
class ServerLookupSteps:
    """The server's steps of one request (one entry each): the rows each verifies (its draft + 1, or a checkpoint
    replay's accepted tokens + 1), the tokens it emits, its position, its model drafter's decodes, whether the slot
    drafted, and the server's counters (``n_predict``, ``draft_n``, ``draft_n_accepted``)."""

    rows: np.ndarray
    tokens: np.ndarray
    pos: np.ndarray
    draft_decodes: np.ndarray
    drafting: np.ndarray
    counters: dict[str, int]


def server_lookup_steps(oracle: OracleTrace, settings: DraftSettings) -> ServerLookupSteps | None:
    """The steps of ``oracle``'s request as a llama-server slot drafts it with ``settings`` (see the module
    docstring); ``None`` where ``settings`` drafts with no look-up, another look-up than ngram-simple, a policy other
    than llama.cpp's ``first``, or a model drafter with state (the engine's replay of those is the server's)."""
    settings = settings.check(oracle.limits)
    mode = settings.mode
    lookups = [s for s in mode.drafters if s.is_lookup]
    if settings.n_max == 0 or not lookups or any(s.name != drafters.NGRAM_SIMPLE for s in lookups):
        return None
    replays = [None if s.is_lookup else oracle.replay(s) for s in mode.drafters]
    if (len(mode.drafters) > 1 and mode.policy != "first") or any(r is not None and r.stateful for r in replays):
        return None
    opts = drafters.option_values(settings.options)
    size_n, size_m = int(opts["ngram_simple_size_n"]), int(opts["ngram_simple_size_m"])
    max_tokens, T = int(settings.max_tokens), oracle.n_positions
    cap, reason = draft_caps(oracle, settings.n_max, max_tokens, server_slot=True)
    cap_lookup = draft_caps(oracle, max_tokens, max_tokens, server_slot=True)[0]
    history = list(oracle.prompt_tokens) + [int(t) for t in oracle.columns["token"]]
    n_prompt = len(oracle.prompt_tokens)
    looked = [
        ngram_simple_draft(history[: n_prompt - 1 + g], history[n_prompt - 1 + g], size_n, size_m)[: int(c)]
        for g, c in enumerate(cap_lookup.tolist())
    ]
    width = max(1, max(map(len, looked)))
    table = np.full((T, width), -1, dtype=np.int64)
    for g, d in enumerate(looked):
        table[g, : len(d)] = d
    lookup_len = np.array([len(d) for d in looked], dtype=np.int64)
    lookup_match = oracle.accepted_prefix(table, lookup_len)
    cands = [
        None if r is None else (r.candidate(cap, reason, settings.p_min, settings.n_min, True), r.match_len)
        for r in replays
    ]
    eog = oracle.columns["token_eog"].astype(bool)
    pos = oracle.columns["pos"]
    recurrent = bool(oracle.settings.get("is_recurrent"))
    n_rs = mode.n_rs_seq(settings.n_max)
    steps: list[tuple[int, int, int, int, bool]] = []  # rows, tokens, pos, draft decodes, drafting
    g, drafted, accepted, end = 0, 0, 0, min(T, max_tokens)
    while g < end:
        n, a, extra, decodes = 0, 0, 0, 0
        for c in cands:  # llama.cpp's order: the first drafter with a draft
            if c is None:
                if lookup_len[g] > 0:
                    n, a = int(lookup_len[g]), int(lookup_match[g])
                    break
            elif bool(c[0].usable[g]):
                n = int(c[0].n_drafted[g])
                a = min(n, int(c[1][g]))
                extra = int(cap[g]) - n if int(c[0].stop[g]) == STOP["eos"] else 0
                decodes = n + extra
                break
        drafted += n + extra
        accepted += a
        if recurrent and n - a > n_rs:  # the checkpoint replay: accepted + correction again, then one more
            emitted = a + 1 if eog[min(g + a, T - 1)] else a + 2
            steps += [(n + 1, 0, int(pos[g]), decodes, cap[g] > 0), (a + 1, emitted, int(pos[g]), 0, False)]
            g += emitted
        else:
            steps.append((n + 1, a + 1, int(pos[g]), decodes, cap[g] > 0))
            g += a + 1
    rows, tokens, at, dec, drafting = (np.array(col) for col in zip(*steps))
    over = int(tokens.sum()) - min(g, end)  # the last step's tokens past the budget are not emitted
    tokens[-1] -= over
    return ServerLookupSteps(
        rows=rows.astype(np.int64),
        tokens=tokens.astype(np.int64),
        pos=at.astype(np.int64),
        draft_decodes=dec.astype(np.int64),
        drafting=drafting.astype(bool),
        counters={"n_predict": min(g, end), "draft_n": drafted, "draft_n_accepted": accepted},
    )
