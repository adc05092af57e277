"""Every drafter llama.cpp offers for one target, side by side on the same prompts: ``compare_drafters``.

The target's own drafters (the MTP head, the look-ups) run in one session; each draft model or head that ships for it
(:func:`~mtp_explorer.draft_heads`, or the ``heads`` given: ``draft-simple``'s draft model, ``draft-eagle3``'s and
``draft-dflash``'s heads) in a session of its own, as llama.cpp's ``-md``. For each drafter the table gives what a
user weighs: acceptance by draft position, tokens accepted per step, drafting time per step, tokens/s measured here
beside plain decoding, and tokens/s predicted by the simulator from an oracle recording of each prompt, priced with
this machine's costs or with a cost profile measured on another (``costs=``, :func:`~mtp_explorer.profile_costs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core import drafters
from ..core.errors import ParameterError
from ..core.session import Session
from ..core.trace import Trace
from ..models import default_model_path, draft_heads
from .profile import Costs
from .simulate import simulate

#: The look-up choices compared (llama.cpp's defaults but their lengths cut to n_max); the best one is marked.
LOOKUP_MODES: tuple[str, ...] = tuple(m.name for m in drafters.MODES.values() if not m.is_chain and m.runs_with(False))


@dataclasses.dataclass(frozen=True)
class DrafterComparison:
    """The comparison: ``frame``, one row per drafter (see :func:`compare_drafters`), and every generation behind it
    (``traces[drafter]``, one per prompt; ``"plain"``: without drafting)."""

    frame: Any
    traces: dict[str, list[Trace]]
    n_max: int
    costs_label: str

    @property
    def best_lookup(self) -> str | None:
        """The look-up with the highest measured tokens/s (``None``: none compared)."""
        rows = self.frame[self.frame["lookup"]]
        return None if rows.empty else str(rows.sort_values("tokens_per_second").iloc[-1]["drafter"])


def _by_depth(traces: Sequence[Trace], depth: int) -> list[float]:
    """Acceptance at each draft position over all steps of ``traces``: of the drafts that reached position j, the
    share whose token j was accepted."""
    drafted = np.zeros(depth)
    accepted = np.zeros(depth)
    for t in traces:
        j = np.arange(depth)[None, :]
        drafted += (t.n_drafted[:, None] > j).sum(axis=0)
        accepted += (t.n_accepted[:, None] > j).sum(axis=0)
    return [float(a / d) if d else float("nan") for a, d in zip(accepted, drafted)]


def _row(name: str, head: str, traces: Sequence[Trace], plain_seconds: float, predicted: float, n_max: int) -> dict:
    steps = sum(t.n_steps for t in traces)
    drafted = sum(int(t.n_drafted.sum()) for t in traces)
    accepted = sum(int(t.n_accepted.sum()) for t in traces)
    tokens = sum(len(t.tokens) for t in traces)
    seconds = sum(sum(t.summary()["phase_seconds"].values()) for t in traces)
    draft_seconds = sum(t.summary()["phase_seconds"]["draft"] for t in traces)
    spec = drafters.mode(name).drafters[0]
    return {
        "drafter": name,
        "label": drafters.mode(name).label or name,
        "head": head,
        "lookup": spec.is_lookup,
        "acceptance_rate": accepted / drafted if drafted else float("nan"),
        "acceptance_by_depth": _by_depth(traces, n_max),
        "accepted_per_step": accepted / steps if steps else 0.0,
        "draft_ms_per_step": 1e3 * draft_seconds / steps if steps else 0.0,
        "tokens_per_second": tokens / seconds,
        "speedup": plain_seconds / seconds,
        "predicted_tokens_per_second": predicted,
        "n_tokens": tokens,
        "n_steps": steps,
    }


def _run(
    session: Session, name: str, prompts: Sequence[str], n_max: int, max_tokens: int, costs: Costs | None, options: dict
) -> tuple[list[Trace], float]:
    """``name``'s generations of ``prompts`` and the simulator's tokens/s for them (one oracle per prompt)."""
    chosen = {k: v for k, v in options.items() if k in {o.name for o in drafters.mode(name).options}}
    traces = [session.generate(p, max_tokens=max_tokens, n_max=n_max, drafter=name, **chosen) for p in prompts]
    tokens = seconds = 0.0
    for p in prompts:
        oracle = session.record_oracle(p, max_tokens=max_tokens, depth=n_max, **chosen)
        s = simulate(oracle, n_max, drafter=name, costs=costs).summary()
        tokens += s["n_tokens"]
        seconds += s["n_tokens"] / s["tokens_per_second"]
    return traces, tokens / seconds


def compare_drafters(
    prompts: Iterable[str],
    *,
    target: str | Path | None = None,
    heads: Iterable[str | Path] | None = None,
    n_max: int = 3,
    max_tokens: int = 64,
    threads: int | None = None,
    costs: Costs | None = None,
    lookups: Sequence[str] = LOOKUP_MODES,
    n_ctx: int = 2048,
) -> DrafterComparison:
    """Run every drafter of ``target`` (default: the bundled model) greedily on ``prompts`` at ``n_max``: its MTP head
    where it has one, each of ``lookups`` (their lengths cut to ``n_max``), and the drafter of each draft model or head
    file in ``heads`` (default: those :func:`~mtp_explorer.draft_heads` lists for this target), each file in a session
    of its own. ``costs`` prices the predictions (a :class:`~mtp_explorer.CostProfile` of another machine, the path of a
    saved one; default: each oracle's own costs, this machine's)."""
    prompts = list(prompts)
    if not prompts:
        raise ParameterError("compare_drafters needs at least one prompt")
    target = Path(target or default_model_path())
    if heads is None:
        heads = [h.head_path for h in draft_heads() if Path(h.target_path).resolve() == target.resolve()]
    # the look-ups' lengths cut to n_max and their keys 3 tokens long (llama.cpp's 12 and 24 find few matches in
    # short generations), as the notebooks set them
    options = (
        {o.name: n_max for o in drafters.all_options() if o.name.endswith(("_size_m", "_n_max"))}
        | {o.name: 1 for o in drafters.all_options() if o.name.endswith("_n_min")}
        | {o.name: 3 for o in drafters.all_options() if o.name.endswith(("_size_n", "_n_match"))}
    )
    traces: dict[str, list[Trace]] = {}
    rows, predicted = [], {}
    with Session.open(target, n_ctx=n_ctx, threads=threads, n_rs_seq=max(n_max, 1)) as s:
        traces["plain"] = [s.generate(p, max_tokens=max_tokens, n_max=0) for p in prompts]
        names = ([drafters.DEFAULT_MODE] if s.info.has_mtp else []) + list(lookups)
        for name in names:
            traces[name], predicted[name] = _run(s, name, prompts, n_max, max_tokens, costs, options)
    plain_seconds = sum(sum(t.summary()["phase_seconds"].values()) for t in traces["plain"])
    rows += [_row(n, "", traces[n], plain_seconds, predicted[n], n_max) for n in names]
    for head in heads:
        with Session.open(target, n_ctx=n_ctx, threads=threads, n_rs_seq=max(n_max, 1), draft_model=head) as s:
            name = next(
                m
                for m in drafters.available_modes(s.info.has_mtp, s.draft_kind)
                if drafters.mode(m).needs_draft_model and not drafters.mode(m).is_chain
            )
            traces[name], p = _run(s, name, prompts, n_max, max_tokens, costs, options)
            rows.append(_row(name, Path(head).name, traces[name], plain_seconds, p, n_max))
    import pandas as pd

    label = "this machine's costs" if costs is None else f"the cost profile {getattr(costs, 'label', costs)}"
    return DrafterComparison(pd.DataFrame(rows), traces, n_max, label)
