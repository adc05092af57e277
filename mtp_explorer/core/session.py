"""Sessions: one model loaded for MTP speculative decoding, generating traces."""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from .. import _native
from . import drafters
from .checks import PminNotApplicable, check_draft_params, check_int, check_drafters_available, check_sampling
from .errors import CancelledError
from .handle import EngineHandle, Prompt
from .parallel import ParallelGeneration
from .schema import FINISH_REASONS
from .trace import Step, Trace

if TYPE_CHECKING:
    from ..analysis.batch_shift import BatchShift
    from ..analysis.oracle import OracleTrace


class Session(ParallelGeneration, EngineHandle):
    """A model with a target context and an MTP draft context, ready to generate.

    Open with :meth:`Session.open`; use as a context manager or call :meth:`close`.
    """

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: Prompt,
        max_tokens: int = 128,
        n_max: int = 3,
        p_min: float = 0.0,
        n_min: int = 0,
        temperature: float = 0.0,
        seed: int | None = None,
        drafter: str | Sequence[str] = drafters.DEFAULT_MODE,
        chain_policy: str | None = None,
        **options: int | str,
    ) -> Trace:
        """Run one generation to the end (or until :meth:`cancel`) and return its trace.

        ``drafter`` is llama.cpp's ``--spec-type`` value (``"draft-mtp"``, ``"ngram-simple"``, a chain such as
        ``"ngram-simple,draft-mtp"`` or a list of names; see :func:`~mtp_explorer.core.drafters.mode`) or one of
        :data:`~mtp_explorer.core.drafters.DRAFTER_MODES`: ``"mtp"`` (= ``draft-mtp``, the model's MTP head),
        ``"ngram"`` (= ``ngram-simple``, prompt look-up; ``p_min`` does not apply, it has no confidence) or
        ``"chain"`` (both asked every step, the draft with the highest expected accepted length verified). A
        chain's drafters are asked in llama.cpp's order; ``chain_policy`` picks the draft verified: ``"first"``
        (llama.cpp's, the default for ``--spec-type`` chains: the first usable draft) or ``"best"``; the
        ``drafter`` column says whose. ``options`` are the drafters' options by keyword, named after llama.cpp's
        flags (``ngram_simple_size_n=3``, ..., and file names such as ngram-cache's ``lookup_cache_static=path``:
        see :func:`~mtp_explorer.core.drafters.all_options`), their defaults where not given.
        """
        drafter = drafters.mode(drafter, chain_policy)
        with self._run():
            prompt_tokens = self._begin(prompt, max_tokens, n_max, p_min, n_min, temperature, seed, drafter, options)
            self._engine.run()
            return self._finish(prompt, prompt_tokens)

    def stream(
        self,
        prompt: Prompt,
        max_tokens: int = 128,
        n_max: int = 3,
        p_min: float = 0.0,
        n_min: int = 0,
        temperature: float = 0.0,
        seed: int | None = None,
        drafter: str | Sequence[str] = drafters.DEFAULT_MODE,
        chain_policy: str | None = None,
        **options: int | str,
    ) -> Iterator[Step]:
        """Generate step by step, yielding a :class:`Step` after each verification (arguments as
        :meth:`generate`). When the iteration ends, :attr:`last_trace` holds the whole trace."""
        drafter = drafters.mode(drafter, chain_policy)
        with self._run():
            prompt_tokens = self._begin(prompt, max_tokens, n_max, p_min, n_min, temperature, seed, drafter, options)
            engine = self._engine
            while True:
                more = engine.step()
                last = engine.columns(engine.n_rows - 1) if engine.n_rows else None
                if more or (last is not None and FINISH_REASONS[engine.finish] != "cancelled"):
                    yield Step.from_columns(last, 0)
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
    ) -> "OracleTrace":
        """Record an oracle trace: the greedy generation decoded once, one token per step, with the draft
        every drafter the model can run would propose at every position, up to ``depth`` tokens (default: the
        session's capacity; the MTP head's drafted with ``p_min = 0``; ``options``: the drafters' options, as
        for :meth:`generate`), and this machine's measured cost model (``probe=False`` skips the
        verify-batch probes; batch costs are then extrapolated from single-token steps). Replay any
        policy with ``n_max <= depth`` with :func:`mtp_explorer.simulate`. See
        :mod:`mtp_explorer.analysis.oracle`.

        ``batch_shift=True`` also attaches :meth:`batch_shift` for verify batches of up to ``depth + 1`` rows
        (measured once per file, machine and placement, then cached): the tie tolerance of
        :func:`~mtp_explorer.compare` and the uncertain positions of :func:`~mtp_explorer.simulate`.
        """
        from ..analysis.oracle import OracleTrace

        engine = self._live()
        depth = self.capacity if depth is None else depth
        check_int("depth", depth, 1, self.capacity)
        check_int("max_tokens", max_tokens, 1, None)
        values = drafters.option_values(options)
        with self._run():
            tokens = self._prompt_tokens(prompt)
            self._mode = drafters.recording_mode(self.info.has_mtp, self.has_draft_model)
            t0 = time.perf_counter()
            done, cols = engine.record_oracle(tokens, max_tokens, depth, drafters.engine_options(values),
                                              bool(probe))
            wall = time.perf_counter() - t0
            if not done:
                raise CancelledError("the oracle recording was cancelled")
            output = self._output(prompt, tokens)
            cols = dict(cols) | {"token_eog": np.array([engine.is_eog(t) for t in output["tokens"]], dtype=bool)}
            settings = {"max_tokens": max_tokens, "depth": depth, "probe": bool(probe),
                        "has_mtp": bool(self.info.has_mtp), "has_draft_model": self.has_draft_model,
                        "is_recurrent": bool(engine.is_recurrent),
                        "n_prompt": len(tokens)} | self._session_settings() | values
            oracle = OracleTrace(columns=cols, settings=settings, wall_seconds=wall, **output)
        if batch_shift:
            oracle.batch_shift = self.batch_shift(range(2, depth + 2))
        return oracle

    def batch_shift(self, ks: Iterable[int] | None = None, *, text: Prompt | None = None, max_position: int = 1024,
                    refresh: bool = False) -> "BatchShift":
        """How far this model's target logits move when positions are decoded in ``k``-row batches instead of
        one row at a time, for every ``k`` in ``ks`` (default: 2 .. ``capacity + 1``, every verify batch this
        session can make), on this machine and placement: the tie tolerance of every greedy check (see
        :mod:`mtp_explorer.analysis.batch_shift`). Measured over KV lengths 0 to ``max_position`` (at most
        ``n_ctx_seq``; runs that go deeper want a larger one) of ``text`` (a string or token ids; default: a fixed
        probe text of code and prose, repeated) the first time, then read from the cache (``refresh=True``
        measures again). Ends nothing: call it between generations."""
        from ..analysis.batch_shift import measure

        return measure(self, ks, text=text, max_position=max_position, refresh=refresh)

    def set_params(self, n_max: int | None = None, p_min: float | None = None, n_min: int | None = None) -> None:
        """Change drafting parameters; a running generation uses them from its next step."""
        cur = self._live().params()
        n_max = cur.n_max if n_max is None else n_max
        p_min = cur.p_min if p_min is None else p_min
        n_min = min(cur.n_min, n_max) if n_min is None else n_min
        self._validate_params(n_max, p_min, n_min, getattr(self, "_mode", drafters.mode(drafters.DEFAULT_MODE)))
        self._engine.set_params(_native.DraftParams(n_max=n_max, p_min=float(p_min), n_min=n_min))

    @property
    def params(self) -> dict:
        p = self._live().params()
        return {"n_max": p.n_max, "p_min": p.p_min, "n_min": p.n_min}

    def drafter_stats(self) -> list[dict]:
        """Per drafter of the last generation, llama.cpp's speculative statistics (drafts generated and
        accepted, accepted tokens, acceptance per position) and its times in ns (``t_begin_ns``, ``t_draft_ns``,
        ``t_accept_ns``; a draft model's decode of each verify batch counts in the last)."""
        return list(self._live().drafter_stats())

    def cancel(self) -> None:
        """Stop the running generation within one step; the session stays usable."""
        if not self._closed:
            self._engine.cancel()

    # -- internals -------------------------------------------------------------------------------
    def _validate_params(self, n_max, p_min, n_min, mode: drafters.DrafterMode) -> None:
        reason = ("its n_rs_seq recurrent snapshot slots" if self._engine.is_recurrent
                  else "the draft depth its telemetry holds, set by n_rs_seq")
        check_draft_params(n_max, p_min, n_min, capacity=self.capacity, capacity_reason=reason)
        check_drafters_available(n_max, mode, self.info.has_mtp, self.has_draft_model,
                                 f"{self.info.name} ({self.info.path})",
                                 drafters.available_modes(self.info.has_mtp, self.has_draft_model))

    def _begin(self, prompt, max_tokens, n_max, p_min, n_min, temperature, seed, drafter, options) -> list[int]:
        mode = drafters.mode(drafter)
        values = drafters.option_values(options)
        self._validate_params(n_max, p_min, n_min, mode)
        if p_min > 0 and not mode.has_confidence:
            warnings.warn(f"p_min={p_min} does not apply to drafter={mode.name!r}: its drafts have no confidence",
                          PminNotApplicable, stacklevel=4)
        check_int("max_tokens", max_tokens, 1, None)
        temperature, seed = check_sampling(temperature, self.seed if seed is None else seed)
        tokens = self._prompt_tokens(prompt)
        self._mode = mode
        self._settings = {
            "max_tokens": max_tokens, "n_max": n_max, "p_min": float(p_min), "n_min": n_min,
            "temperature": temperature, "seed": seed, "drafter": mode.name, "chain_policy": mode.policy,
        } | self._session_settings() | values
        config = _native.GenerationConfig(
            max_tokens=max_tokens, temperature=temperature, seed=seed, drafters=[d.name for d in mode.drafters],
            chain_policy=mode.policy, options=drafters.engine_options(values))
        self._engine.begin(tokens, config, _native.DraftParams(n_max=n_max, p_min=float(p_min), n_min=n_min))
        return tokens

    def _finish(self, prompt: Prompt, prompt_tokens: list[int]) -> Trace:
        engine = self._engine
        trace = Trace(columns=dict(engine.columns(0)), settings=self._settings, t_prefill_ns=engine.t_prefill_ns,
                      **self._output(prompt, prompt_tokens))
        self.last_trace = trace
        return trace
