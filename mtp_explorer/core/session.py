"""Sessions: one model loaded for MTP speculative decoding, generating traces."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import drafters, hooks
from .checks import check_int
from .errors import CancelledError, ParameterError
from .handle import EngineHandle, Prompt, check_streamable, finishing_on_interrupt
from .parallel import ParallelGeneration
from .probes import Probes
from .schema import FINISH_REASONS
from .settings import DraftSettings, Limits, resolve
from .trace import Step, Trace


@dataclasses.dataclass
class OracleColumns:
    """An oracle recording as the engine gives it (:meth:`Session.oracle_columns`): its columns, the settings it
    records, its wall seconds, and the prompt and output fields a trace holds (``prompt``, ``tokens``, ``text``,
    ...)."""

    columns: dict[str, np.ndarray]
    settings: dict[str, Any]
    wall_seconds: float
    output: dict[str, Any]


class Session(ParallelGeneration, Probes, EngineHandle):
    """A model with a target context and an MTP draft context, ready to generate.

    Open with :meth:`Session.open`; use as a context manager or call :meth:`close`.
    """

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompt: Prompt, settings: DraftSettings | None = None, **keywords: Any) -> Trace:
        """Run one generation to the end (or until :meth:`cancel`) and return its trace.

        A ``KeyboardInterrupt`` (JupyterLab's "Interrupt the kernel") stops it within one step on Python's main thread;
        :attr:`last_trace` then holds what it generated (``finish_reason`` ``"cancelled"``).

        ``settings`` (a :class:`~mtp_explorer.DraftSettings`; default: its defaults) says how to draft, and
        ``keywords`` change any of its fields or drafter options: ``max_tokens`` (128), ``n_max`` (3), ``p_min``
        (0.0), ``n_min`` (0), ``temperature`` (0.0), ``seed`` (``None``: the session's), ``drafter`` and
        ``chain_policy``, and the drafters' options named after llama.cpp's flags (``ngram_simple_size_n=3``, ...,
        and file names such as ngram-cache's ``lookup_cache_static=path``: see
        :func:`~mtp_explorer.core.drafters.all_options`).

        ``drafter`` is llama.cpp's ``--spec-type`` value (:data:`~mtp_explorer.core.drafters.DRAFTER_MODES` lists
        the usual ones): ``"draft-mtp"`` (the model's MTP head), ``"ngram-simple"`` (prompt look-up; ``p_min`` does
        not apply, it has no confidence), a chain such as ``"ngram-simple,draft-mtp"`` or a list of names (see
        :func:`~mtp_explorer.core.drafters.mode`). The short spellings ``"mtp"``, ``"ngram"`` and ``"chain"`` (the
        chain under ``chain_policy="best"``) are taken and recorded under llama.cpp's names. A chain's drafters are
        asked in llama.cpp's order; ``chain_policy`` picks the draft verified: ``"first"`` (llama.cpp's, the default for
        ``--spec-type`` chains: the first usable draft) or ``"best"``; the ``drafter`` column says whose. The trace
        records the settings (:attr:`Trace.draft_settings`).
        """
        with self._run():
            prompt_tokens = self._begin(prompt, resolve(settings, keywords))
            with finishing_on_interrupt(self._engine, lambda: self._finish(prompt, prompt_tokens)):
                self._engine.run()
            return self._finish(prompt, prompt_tokens)

    def stream(self, prompt: Prompt, settings: DraftSettings | None = None, **keywords: Any) -> Iterator[Step]:
        """Generate step by step, yielding a :class:`Step` after each verification (arguments as
        :meth:`generate`). When the iteration ends, :attr:`last_trace` holds the whole trace (after an interrupt or a
        ``close()`` of the iterator, what was generated, finished as cancelled). A session with
        ``telemetry="off"`` records no steps to yield: a :class:`ParameterError`."""
        check_streamable(self)
        with self._run():
            prompt_tokens = self._begin(prompt, resolve(settings, keywords))
            engine = self._engine
            with finishing_on_interrupt(self._engine, lambda: self._finish(prompt, prompt_tokens)):
                while True:
                    self.model_files.check()  # a stream may pause between steps
                    more = engine.step()
                    last = engine.columns(engine.n_rows - 1) if engine.n_rows else None
                    if more or (last is not None and FINISH_REASONS[engine.finish] != "cancelled"):
                        yield Step.from_columns(last, 0)  # type: ignore[arg-type]
                    if not more:
                        break
            self._finish(prompt, prompt_tokens)

    def record_oracle(
        self,
        prompt: Prompt,
        max_tokens: int = 128,
        depth: int | None = None,
        *,
        probe: bool = True,
        batch_shift: bool = True,
        **options: int | str,
    ) -> Any:
        """Record an oracle trace (an :class:`~mtp_explorer.OracleTrace`): the greedy generation decoded once, one
        token per step, with the draft every drafter the model can run would propose at every position, up to
        ``depth`` tokens (default: the session's capacity; the MTP head's drafted with ``p_min = 0``; ``options``: the
        drafters' options, as for :meth:`generate`), and this machine's measured cost model (``probe=False`` skips
        the verify-batch probes; batch costs are then extrapolated from single-token steps). Replay any policy with
        ``n_max <= depth`` with :func:`mtp_explorer.simulate`. See :mod:`mtp_explorer.analysis.oracle`.

        ``batch_shift=True`` also attaches :meth:`batch_shift` for verify batches of up to ``depth + 1`` rows
        (measured once per file, machine and placement, then cached): the tie tolerance of
        :func:`~mtp_explorer.compare` and the uncertain positions of :func:`~mtp_explorer.simulate`.

        The same as :func:`mtp_explorer.analysis.oracle.record_oracle` (``record_oracle(session, ...)``).
        """
        return hooks.call(
            "record_oracle", self, prompt, max_tokens, depth, probe=probe, batch_shift=batch_shift, **options
        )

    def oracle_columns(
        self, prompt: Prompt, max_tokens: int, depth: int, *, probe: bool, options: dict[str, Any]
    ) -> OracleColumns:
        """The engine's oracle recording of ``prompt`` (``depth`` checked against the capacity, ``options`` the
        drafters' option values): what :func:`~mtp_explorer.analysis.oracle.record_oracle` makes an
        :class:`~mtp_explorer.OracleTrace` of. A cancelled recording raises :class:`CancelledError`."""
        engine = self._live()
        check_int("depth", depth, 1, self.capacity)
        check_int("max_tokens", max_tokens, 1, None)
        with self._run():
            tokens = self.prompt_tokens(prompt)
            self._mode = drafters.recording_mode(self.info.has_mtp, self.draft_kind)
            t0 = time.perf_counter()
            done, cols = engine.record_oracle(tokens, max_tokens, depth, drafters.engine_options(options), bool(probe))
            wall = time.perf_counter() - t0
            if not done:
                raise CancelledError("the oracle recording was cancelled")
            output = self._output(prompt, tokens)
            cols = dict(cols) | {"token_eog": np.array([engine.is_eog(t) for t in output["tokens"]], dtype=bool)}
            settings = (
                {
                    "max_tokens": max_tokens,
                    "depth": depth,
                    "probe": bool(probe),
                    "has_mtp": bool(self.info.has_mtp),
                    "has_draft_model": self.has_draft_model and self.draft_kind,
                    "is_recurrent": bool(engine.is_recurrent),
                    "draft_block_limit": engine.draft_block_limit,
                    "mtp_head_limit": engine.mtp_head_limit,
                    "n_prompt": len(tokens),
                }
                | self._session_settings()
                | options
            )
        return OracleColumns(columns=cols, settings=settings, wall_seconds=wall, output=output)

    def set_params(self, settings: DraftSettings | None = None, **keywords: Any) -> None:
        """Change ``n_max``, ``p_min`` and ``n_min`` (those of ``settings``, or given as keywords; an ``n_max`` below
        the current ``n_min`` lowers it); a running generation uses them from its next step."""
        unknown = sorted(set(keywords) - {"n_max", "p_min", "n_min"})
        if unknown:
            raise ParameterError(f"set_params changes n_max, p_min and n_min only, not {unknown}")
        current = getattr(self, "_draft_settings", None) or DraftSettings()
        if settings is not None:
            keywords = {"n_max": settings.n_max, "p_min": settings.p_min, "n_min": settings.n_min} | keywords
        p = self._live().params()
        changed = resolve(current.replace(n_max=p.n_max, p_min=p.p_min, n_min=p.n_min), keywords)
        changed.check(self.limits)
        self._engine.set_params(changed.native_params())
        self._draft_settings = changed

    @property
    def params(self) -> dict:
        p = self._live().params()
        return {"n_max": p.n_max, "p_min": p.p_min, "n_min": p.n_min}

    @property
    def drafter_modes(self) -> tuple[str, ...]:
        """The listed ``drafter=`` choices (:data:`~mtp_explorer.DRAFTER_MODES`) this session can draft with: its MTP
        head's, the look-ups, and those of its draft model's kind."""
        if self.checkpoints:  # no snapshot slots: the look-ups, and draft-simple with a draft model
            plain_draft_model = self.has_draft_model and self.draft_kind == "draft_model"
            return drafters.available_modes(False, "draft_model" if plain_draft_model else False)
        return drafters.available_modes(bool(self.info.has_mtp), self.has_draft_model and self.draft_kind)

    @property
    def limits(self) -> Limits:
        """What this session can draft with, and how deep: the bounds every :class:`DraftSettings` is checked
        against here."""
        reason = (
            "the draft depth its telemetry holds, its capacity (no snapshot slots: checkpoints)"
            if self.checkpoints
            else "its n_rs_seq recurrent snapshot slots"
            if self._live().is_recurrent
            else "the draft depth its telemetry holds, set by n_rs_seq"
        )
        return Limits(
            capacity=self.capacity,
            has_mtp=bool(self.info.has_mtp),
            has_draft_model=self.has_draft_model and self.draft_kind,
            model=f"{self.info.name} ({self.info.path})",
            reason=reason,
        )

    def drafter_stats(self) -> list[dict]:
        """Per drafter of the last generation, llama.cpp's speculative statistics (drafts generated and
        accepted, accepted tokens, acceptance per position), ``n_resets`` (the times it forgot what it learned:
        ngram-mod's table reset on low acceptance) and its times in ns (``t_begin_ns``, ``t_draft_ns``,
        ``t_accept_ns``; a draft model's decode of each verify batch counts in the last)."""
        return list(self._live().drafter_stats())

    def cancel(self) -> None:
        """Stop the running generation within one step; the session stays usable."""
        if not self._closed:
            self._engine.cancel()

    # -- internals -------------------------------------------------------------------------------
    def _begin(self, prompt: Prompt, settings: DraftSettings) -> list[int]:
        settings.check(self.limits)
        settings.warn_unused(stacklevel=4)
        seed = self.seed if settings.seed is None else settings.seed
        tokens = self.prompt_tokens(prompt)
        self._mode = settings.mode
        self._draft_settings = settings
        self._settings = settings.replace(seed=seed).to_dict() | self._session_settings()
        self._engine.begin(tokens, settings.native_config(seed), settings.native_params())
        return tokens

    def _finish(self, prompt: Prompt, prompt_tokens: list[int]) -> Trace:
        engine = self._engine
        trace = Trace(
            columns=dict(engine.columns(0)),
            settings=self._settings,
            t_prefill_ns=engine.t_prefill_ns,
            totals=dict(engine.request_state(0)["totals"]),
            **self._output(prompt, prompt_tokens),
        )
        self.last_trace = trace
        return trace
