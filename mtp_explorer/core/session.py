"""Sessions: one model loaded for MTP speculative decoding, generating traces."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import drafters, hooks, native
from .checks import check_int
from .errors import CancelledError, ParameterError
from .handle import EngineHandle, Prompt, check_streamable, finishing_on_interrupt
from .info import ModelInfo
from .parallel import ParallelGeneration, ParallelStep, ParallelTrace
from .probes import Probes
from .schema import FINISH_REASONS
from .settings import DraftSettings, resolve
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


class Session(EngineHandle):
    """A model with a target context and an MTP draft context, ready to generate.

    Open with :meth:`Session.open`; use as a context manager or call :meth:`close`. The session is the handle of its
    engine (life cycle, facts, tokenization); parallel generation and the probes are collaborators it delegates to
    (:attr:`parallel`, :attr:`probes`), which use the handle's public methods only.
    """

    def __init__(
        self, engine: native.Engine, info: ModelInfo, *, seed: int, draft_info: ModelInfo | None = None
    ) -> None:
        super().__init__(engine, info, seed=seed, draft_info=draft_info)
        self.last_trace: Trace | None = None
        """The last :meth:`generate` or :meth:`stream` result (as far as it went after an interrupt)."""
        self._draft_settings = DraftSettings()
        self._settings: dict[str, Any] = {}
        # the collaborators hold the session weakly: a session dropped without close() is freed (and its model with
        # it) at once, not at the cycle collector's next pass
        handle, drafting = weakref.proxy(self), weakref.WeakMethod(self._drafting)
        self.parallel = ParallelGeneration(handle, lambda settings: drafting()(settings))  # type: ignore[misc]
        """Runs :meth:`generate_parallel` and :meth:`stream_parallel`."""
        self.probes = Probes(handle)
        """Runs :meth:`probe_batch_shift` and :meth:`layer_inputs`."""

    @property
    def last_parallel_trace(self) -> ParallelTrace | None:
        """The last :meth:`generate_parallel` or :meth:`stream_parallel` result (a ``ParallelTrace``)."""
        return self.parallel.last_trace

    @last_parallel_trace.setter
    def last_parallel_trace(self, value: ParallelTrace | None) -> None:
        self.parallel.last_trace = value

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
        with self.stepping(prompt, settings, **keywords) as engine:
            engine.run()
        return self.last_trace  # type: ignore[return-value]

    def stream(self, prompt: Prompt, settings: DraftSettings | None = None, **keywords: Any) -> Iterator[Step]:
        """Generate step by step, yielding a :class:`Step` after each verification (arguments as
        :meth:`generate`). When the iteration ends, :attr:`last_trace` holds the whole trace (after an interrupt or a
        ``close()`` of the iterator, what was generated, finished as cancelled). A session with
        ``telemetry="off"`` records no steps to yield: a :class:`ParameterError`."""
        check_streamable(self)
        with self.stepping(prompt, settings, **keywords) as engine:
            while True:
                self.model_files.check()  # a stream may pause between steps
                more = engine.step()
                last = engine.columns(engine.n_rows - 1) if engine.n_rows else None
                if more or (last is not None and FINISH_REASONS[engine.finish] != "cancelled"):
                    yield Step.from_columns(last, 0)  # type: ignore[arg-type]
                if not more:
                    break

    @contextlib.contextmanager
    def stepping(
        self, prompt: Prompt, settings: DraftSettings | None = None, **keywords: Any
    ) -> Iterator[native.Engine]:
        """Begin a generation (arguments as :meth:`generate`) and give its engine to code that steps it itself (a
        harness applying its own rule between ``engine.step()`` calls; ``engine.run()`` runs it to the end). On
        leaving, the generation is finished into :attr:`last_trace`; an interrupt (a ``KeyboardInterrupt``, a stream
        closed early) finishes it as cancelled first. :meth:`generate` and :meth:`stream` are this."""
        with self.hold() as engine:
            prompt_tokens = self._begin(prompt, resolve(settings, keywords))
            with finishing_on_interrupt(engine, lambda: self._finish(prompt, prompt_tokens)):
                yield engine
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
        check_int("depth", depth, 1, self.capacity)
        check_int("max_tokens", max_tokens, 1, None)
        with self.hold() as engine:
            tokens = self.prompt_tokens(prompt)
            t0 = time.perf_counter()
            done, cols = engine.record_oracle(tokens, max_tokens, depth, drafters.engine_options(options), bool(probe))
            wall = time.perf_counter() - t0
            if not done:
                raise CancelledError("the oracle recording was cancelled")
            output = self.output(prompt, tokens)
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
                | self.recorded_settings()
                | options
            )
        return OracleColumns(columns=cols, settings=settings, wall_seconds=wall, output=output)

    def set_params(self, settings: DraftSettings | None = None, **keywords: Any) -> None:
        """Change ``n_max``, ``p_min`` and ``n_min`` (those of ``settings``, or given as keywords; an ``n_max`` below
        the current ``n_min`` lowers it); a running generation uses them from its next step."""
        unknown = sorted(set(keywords) - {"n_max", "p_min", "n_min"})
        if unknown:
            raise ParameterError(f"set_params changes n_max, p_min and n_min only, not {unknown}")
        current = self._draft_settings
        if settings is not None:
            keywords = {"n_max": settings.n_max, "p_min": settings.p_min, "n_min": settings.n_min} | keywords
        p = self.engine.params()
        changed = resolve(current.replace(n_max=p.n_max, p_min=p.p_min, n_min=p.n_min), keywords)
        changed.check(self.limits)
        self.engine.set_params(changed.native_params())
        self._draft_settings = changed

    @property
    def params(self) -> dict:
        p = self.engine.params()
        return {"n_max": p.n_max, "p_min": p.p_min, "n_min": p.n_min}

    # -- parallel generation (:attr:`parallel`) ---------------------------------------------------
    def generate_parallel(
        self,
        prompts: Sequence[Prompt],
        settings: DraftSettings | Sequence[DraftSettings] | None = None,
        *,
        arrivals: Sequence[int] | None = None,
        params: Sequence[Mapping[str, Any] | None] | None = None,
        **keywords: Any,
    ) -> ParallelTrace:
        """Run several requests on the session's ``n_parallel`` sequences and return their traces.

        ``settings`` is one :class:`~mtp_explorer.DraftSettings` for every request or a list of them, one per
        request; ``keywords`` change fields or drafter options of each, as for :meth:`generate`. ``params`` (one
        mapping or ``None`` per prompt) overrides ``n_max``, ``p_min``, ``n_min`` and ``max_tokens`` per request,
        llama-server's per-request settings (per-request settings may differ in those and in sampling; the drafter
        and its options are the whole generation's, as llama-server's ``--spec-type``). Without ``arrivals`` all
        requests start together, so there may be at most ``n_parallel``; ``arrivals`` (an engine step per prompt)
        lets them join a running batch, each waiting for a free sequence. Greedy requests generate what each would
        alone (up to floating-point near-ties between batch shapes: :func:`~mtp_explorer.check_parallel` finds them);
        with ``temperature`` > 0 request ``i`` samples with ``seed + i`` (a list of settings: each its own ``seed``,
        or the session's + ``i`` where it has none). A ``KeyboardInterrupt`` stops it within one step, as for
        :meth:`generate`, and :attr:`last_parallel_trace` then holds what each request generated.
        """
        return self.parallel.generate(prompts, settings, arrivals, params, keywords)

    def stream_parallel(
        self,
        prompts: Sequence[Prompt],
        settings: DraftSettings | Sequence[DraftSettings] | None = None,
        *,
        arrivals: Sequence[int] | None = None,
        params: Sequence[Mapping[str, Any] | None] | None = None,
        **keywords: Any,
    ) -> Iterator[list[ParallelStep]]:
        """As :meth:`generate_parallel` (the same arguments), yielding after every engine step a :class:`ParallelStep`
        for each sequence in it. When the iteration ends, :attr:`last_parallel_trace` holds the whole result."""
        yield from self.parallel.stream(prompts, settings, arrivals, params, keywords)

    # -- probes (:attr:`probes`) -------------------------------------------------------------------
    def batch_shift(
        self,
        ks: Iterable[int] | None = None,
        *,
        text: Prompt | None = None,
        max_position: int = 1024,
        refresh: bool = False,
    ) -> Any:
        """How far this model's target logits move when positions are decoded in ``k``-row batches instead of
        one row at a time, for every ``k`` in ``ks`` (default: 2 .. ``capacity + 1``, every verify batch this
        session can make), on this machine and placement (a :class:`~mtp_explorer.BatchShift`): the tie tolerance
        of every greedy check (see :mod:`mtp_explorer.analysis.batch_shift`, whose ``measure`` this runs). Measured
        over KV lengths 0 to ``max_position`` (at most ``n_ctx_seq``; runs that go deeper want a larger one) of
        ``text`` (a string or token ids; default: a fixed probe text of code and prose, repeated) the first time, then
        read from the cache (``refresh=True`` measures again). Ends nothing: call it between generations."""
        return hooks.call("batch_shift", self, ks, text=text, max_position=max_position, refresh=refresh)

    def probe_batch_shift(self, tokens: Sequence[int], ks: Sequence[int]) -> dict[str, np.ndarray]:
        """The engine's raw batch-shape probe (what :meth:`batch_shift` summarises and caches): ``tokens`` decoded
        one row at a time and in batches of each of ``ks`` rows, the session held for the time it takes."""
        return self.probes.batch_shift_rows(tokens, ks)

    def layer_inputs(self, prompt: Prompt, layers: Sequence[int]) -> np.ndarray:
        """The hidden state entering each of the target's trunk ``layers`` (the residual stream before the layer's
        norm, Hugging Face's ``hidden_states[il]``) at every token of ``prompt``, decoded from an empty memory: a
        float32 array ``[tokens, len(layers), n_embd]``, the layers in the order given. These are the features
        llama.cpp's draft-eagle3 and draft-dflash read (``llama_get_embeddings_layer_inp``); only the architectures
        of :data:`~mtp_explorer.core.probes.LAYER_INPUT_ARCHS` give them, and a layer is ``0 .. n_layer - 1`` (a
        :class:`ParameterError` otherwise, raised before anything runs)."""
        return self.probes.layer_inputs(prompt, layers)

    def drafter_stats(self) -> list[dict]:
        """Per drafter of the last generation, llama.cpp's speculative statistics (drafts generated and
        accepted, accepted tokens, acceptance per position), ``n_resets`` (the times it forgot what it learned:
        ngram-mod's table reset on low acceptance) and its times in ns (``t_begin_ns``, ``t_draft_ns``,
        ``t_accept_ns``; a draft model's decode of each verify batch counts in the last)."""
        return list(self.engine.drafter_stats())

    def cancel(self) -> None:
        """Stop the running generation within one step; the session stays usable."""
        if not self.closed:
            self.engine.cancel()

    # -- internals -------------------------------------------------------------------------------
    def _drafting(self, settings: DraftSettings) -> None:
        """A generation begins drafting with ``settings``: :meth:`set_params` changes them from here."""
        self._draft_settings = settings

    def _begin(self, prompt: Prompt, settings: DraftSettings) -> list[int]:
        settings.check(self.limits)
        settings.warn_unused(stacklevel=6)  # the caller of generate / stream, past stepping's contextlib frame
        seed = self.seed if settings.seed is None else settings.seed
        tokens = self.prompt_tokens(prompt)
        self._drafting(settings)
        self._settings = settings.replace(seed=seed).to_dict() | self.recorded_settings()
        self.engine.begin(tokens, settings.native_config(seed), settings.native_params())
        return tokens

    def _finish(self, prompt: Prompt, prompt_tokens: list[int]) -> Trace:
        engine = self.engine
        trace = Trace(
            columns=dict(engine.columns(0)),
            settings=self._settings,
            t_prefill_ns=engine.t_prefill_ns,
            totals=dict(engine.request_state(0)["totals"]),
            **self.output(prompt, prompt_tokens),
        )
        self.last_trace = trace
        return trace
