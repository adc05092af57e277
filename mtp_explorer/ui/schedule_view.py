"""The what-if's comparison of draft-length schedules: would an adaptive draft length pay on these prompts?

:class:`ScheduleView` is a *Schedules* toggle and, while it is on, a table of :func:`schedules_table`: for the current
prompt's oracle, and for every recorded prompt together where there are several (the user's workload, one category per
column), the best fixed ``n_max``, each named schedule (``heuristic``, ``window``) and the hindsight bound, predicted
from the oracles (:func:`mtp_explorer.schedule_advice`), each against the best fixed setting. The advice is cached by
its inputs, so moving ``n_max`` costs nothing: the schedules are compared up to the oracles' depth.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import ipywidgets as W

from ..analysis.hindsight import ScheduleAdvice, schedule_advice
from ..analysis.oracle import OracleTrace
from ..core.drafters import DrafterMode
from ..core.settings import DEFAULT_WINDOW

__all__ = ["ScheduleView", "schedules_table", "THIS_PROMPT"]

#: The column of the current prompt's oracle.
THIS_PROMPT = "this prompt"

_HOVER = {
    "fixed": "the fixed n_max with the highest predicted tokens/s (every value from 1 to the oracle's depth replayed)",
    "heuristic": "all drafts of a step accepted: the next step drafts 2 more, otherwise 1 fewer, within [1, n_max] "
    "(Hugging Face's assisted generation, Gemma's heuristic schedule)",
    "window": f"the length that the acceptance by depth over the last {DEFAULT_WINDOW} steps says is worth drafting",
    "bound": "the best draft length of every step, chosen knowing the whole recording: the most any schedule of "
    "n_max could reach (mx.hindsight_best)",
}


def schedules_table(columns: dict[str, ScheduleAdvice]) -> str:
    """The advice of each column (by label) as an HTML table: predicted tokens/s of the best fixed setting, each
    schedule and the bound, each against the best fixed setting; each column's advice in words below it."""
    first = next(iter(columns.values())).table
    rows = [("best fixed n_max", "fixed")] + [
        (setting, "bound" if setting.startswith("hindsight") else setting.split(" ")[0])
        for setting in first["setting"]
        if not setting.startswith("fixed")
    ]
    head = "".join(f"<th>{html.escape(label)}</th>" for label in columns)
    body = []
    for setting, kind in rows:
        cells = []
        for advice in columns.values():
            if kind == "fixed":
                tps, n = advice.best_fixed_tokens_per_second, advice.best_fixed_n_max
                cells.append(f"<td>{tps:.0f} tok/s (n_max {n})</td>")
                continue
            row = advice.table[advice.table["setting"] == setting].iloc[0]
            cells.append(f"<td>{row['tokens_per_second']:.0f} tok/s ({row['vs_best_fixed']:.2f}×)</td>")
        body.append(
            f'<tr><td title="{html.escape(_HOVER[kind])}"><span style="border-bottom:1px dotted;cursor:help">'
            f"{html.escape(setting)}</span></td>{''.join(cells)}</tr>"
        )
    notes = "".join(
        f"<div>{html.escape(label)}: {html.escape(advice.note)}.</div>" for label, advice in columns.items()
    )
    style = 'style="border-collapse:collapse;font-size:13px" cellpadding="3"'
    return (
        f'<table class="mtpx-whatif-schedules-table" {style}><tr><th>predicted</th>{head}</tr>{"".join(body)}</table>'
        f'<div style="font-size:12px;color:#555">{notes}</div>'
    )


class ScheduleView(W.VBox):
    """The *Schedules* toggle (:attr:`toggle`, placed by the panel) and the table it shows (:func:`schedules_table`)."""

    def __init__(self) -> None:
        self.toggle = W.ToggleButton(
            description="Schedules",
            icon="sliders",
            tooltip="would an adaptive draft length pay? the best fixed n_max, each schedule and the hindsight "
            "bound, predicted for this prompt and for every recorded prompt",
            layout=W.Layout(width="115px", flex="none"),
        )
        self.table = W.HTML()
        self.table.add_class("mtpx-whatif-schedules")
        self._cache: dict[tuple, tuple[list[OracleTrace], ScheduleAdvice]] = {}  # the oracles kept: their ids key
        super().__init__([self.table])

    def show(
        self,
        oracle: OracleTrace | None,
        recorded: Sequence[OracleTrace],
        p_min: float,
        n_min: int,
        drafter: str | DrafterMode,
    ) -> None:
        """The table for ``oracle`` and (where there are several) every ``recorded`` oracle, or nothing while the
        toggle is off or without an oracle."""
        if not self.toggle.value or oracle is None:
            self.table.value = ""
            return
        columns = {THIS_PROMPT: [oracle]}
        if len(recorded) > 1:
            columns[f"all {len(recorded)} recorded prompts"] = list(recorded)
        self.table.value = schedules_table(
            {label: self._advice(oracles, p_min, n_min, drafter) for label, oracles in columns.items()}
        )

    def _advice(
        self, oracles: Sequence[OracleTrace], p_min: float, n_min: int, drafter: str | DrafterMode
    ) -> ScheduleAdvice:
        key = (tuple(id(o) for o in oracles), p_min, n_min, repr(drafter))
        if key not in self._cache:
            self._cache[key] = (list(oracles), schedule_advice(oracles, p_min=p_min, n_min=n_min, drafter=drafter))
        return self._cache[key][1]
