"""Sessions: one model loaded for MTP speculative decoding, generating traces."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import llama_cpp  # noqa: F401  (loads libllama first: the extension shares this one instance)
import numpy as np

from . import _native
from .errors import (
    ContextOverflowError,
    LibraryError,
    ModelLoadError,
    MtpUnavailableError,
    ParameterError,
    SessionBusyError,
    SessionClosedError,
)
from .info import ModelInfo, model_info
from .trace import DRAFTER_MODES, FINISH_REASONS, Step, Trace

DEFAULT_N_RS_SEQ = 8
MAX_TOPK = _native.DRAFT_N_CANDIDATES
DEFAULT_NGRAM_N = 3
"""n-gram drafter: length of the n-gram looked up (llama.cpp's ``--spec-ngram-simple-size-n``)."""
DEFAULT_NGRAM_M = 8
"""n-gram drafter: length of the continuation it proposes before ``n_max`` cuts it
(llama.cpp's ``--spec-ngram-simple-size-m``)."""

if TYPE_CHECKING:
    from .oracle import OracleTrace

Prompt = str | Sequence[int]


def _libllama_path() -> str:
    """The libllama whose nextn API is checked (the one the extension is linked against)."""
    return _native.libllama_path()


def check_nextn_api(path: str | None = None) -> None:
    """Raise :class:`LibraryError` if the libllama at ``path`` lacks the nextn (MTP) API."""
    lib = path or _libllama_path()
    missing = _native.missing_nextn_symbols(lib)
    if missing:
        raise LibraryError(
            f"{lib} lacks the nextn API that MTP drafting needs ({', '.join(missing)}); "
            "install llama-cpp-python==0.3.36"
        )


class Session:
    """A model with a target context and an MTP draft context, ready to generate.

    Open with :meth:`Session.open`; use as a context manager or call :meth:`close`.
    """

    def __init__(self, engine: "_native.Engine", info: ModelInfo, *, seed: int) -> None:
        self._engine = engine
        self.info = info
        self.seed = seed
        self._busy = threading.Lock()
        self._closed = False
        self.last_trace: Trace | None = None
        self.open_kwargs: dict = {}
        """The keyword arguments :meth:`open` was given (a Dask worker re-opens the model with them)."""

    # -- life cycle ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike | None = None,
        *,
        n_ctx: int = 4096,
        threads: int | None = None,
        seed: int = 0,
        n_rs_seq: int = DEFAULT_N_RS_SEQ,
        topk: int = 5,
        telemetry: bool = True,
        clock: str = "wall",
    ) -> "Session":
        """Load a GGUF model (``None``: the bundled demo model).

        ``n_rs_seq`` is the number of recurrent snapshot slots, which is also the largest ``n_max``
        the session accepts; ``topk`` is how many draft alternatives are recorded per depth.
        ``clock="cpu"`` times the phases with the calling thread's CPU time instead of the wall
        clock (needs ``threads=1``, where llama.cpp computes on that thread): the work, without the
        time a busy machine kept the thread waiting. Tokens/s are then work-rate figures.
        """
        if path is None:
            from .models import default_model_path

            path = default_model_path()
        path = Path(path)
        info = model_info(path)
        _check_int("n_ctx", n_ctx, 8, None)
        n_ctx = -(-n_ctx // 256) * 256  # llama.cpp pads the context to a multiple of 256: size the batch alike
        _check_int("n_rs_seq", n_rs_seq, 1, 64)
        _check_int("topk", topk, 1, MAX_TOPK)
        if threads is not None:
            _check_int("threads", threads, 1, None)
        if clock not in ("wall", "cpu"):
            raise ParameterError(f"clock must be 'wall' or 'cpu', got {clock!r}")
        if clock == "cpu" and threads != 1:
            raise ParameterError("clock='cpu' needs threads=1 (llama.cpp then computes on the calling thread)")
        check_nextn_api(_libllama_path())
        _native.take_log()
        try:
            engine = _native.Engine(str(path), n_ctx, threads or 0, n_rs_seq, topk, telemetry, clock == "cpu")
        except RuntimeError as exc:
            log = [line for line in _native.take_log() if line.strip()]
            detail = ("\nllama.cpp said:\n  " + "\n  ".join(log[-8:])) if log else ""
            raise ModelLoadError(f"cannot load {path}: {exc}{detail}") from exc
        session = cls(engine, info, seed=seed)
        session.open_kwargs = {"n_ctx": n_ctx, "threads": threads, "seed": seed, "n_rs_seq": n_rs_seq, "topk": topk,
                               "telemetry": telemetry, "clock": clock}
        return session

    def close(self) -> None:
        """Free the model and contexts. A running generation is cancelled first."""
        if not self._closed:
            self._closed = True
            self._engine.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"n_ctx={self.n_ctx}, capacity={self.capacity}"
        return f"<Session {self.info.name!r} ({self.info.arch}) {state}>"

    # -- facts -----------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self.info.path

    @property
    def n_ctx(self) -> int:
        return self._live().n_ctx

    @property
    def capacity(self) -> int:
        """Largest ``n_max`` this session accepts (its ``n_rs_seq`` snapshot slots)."""
        return self._live().capacity

    @property
    def threads(self) -> int:
        return self._live().n_threads

    @property
    def telemetry(self) -> bool:
        return self._live().telemetry

    @property
    def clock(self) -> str:
        """``wall`` or ``cpu``: the clock of the per-phase timings."""
        return "cpu" if self._live().cpu_clock else "wall"

    @telemetry.setter
    def telemetry(self, on: bool) -> None:
        self._live().telemetry = bool(on)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._live().tokenize(text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._live().detokenize(list(tokens))

    def piece(self, token: int) -> str:
        return self._live().piece(int(token))

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
        drafter: str = "mtp",
        ngram_n: int = DEFAULT_NGRAM_N,
        ngram_m: int = DEFAULT_NGRAM_M,
    ) -> Trace:
        """Run one generation to the end (or until :meth:`cancel`) and return its trace.

        ``drafter``: ``"mtp"`` (the model's MTP head), ``"ngram"`` (prompt look-up with llama.cpp's
        ngram-simple semantics: the last ``ngram_n`` tokens matched earlier in the context, the
        ``ngram_m`` tokens that followed proposed, cut to ``n_max``; ``p_min`` does not apply, it has
        no confidence) or ``"chain"`` (both asked every step, the draft with the highest expected
        accepted length verified; the ``drafter`` column says whose).
        """
        with self._run():
            prompt_tokens = self._begin(prompt, max_tokens, n_max, p_min, n_min, temperature, seed,
                                        drafter, ngram_n, ngram_m)
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
        drafter: str = "mtp",
        ngram_n: int = DEFAULT_NGRAM_N,
        ngram_m: int = DEFAULT_NGRAM_M,
    ) -> Iterator[Step]:
        """Generate step by step, yielding a :class:`Step` after each verification.

        When the iteration ends, :attr:`last_trace` holds the whole trace.
        """
        with self._run():
            prompt_tokens = self._begin(prompt, max_tokens, n_max, p_min, n_min, temperature, seed,
                                        drafter, ngram_n, ngram_m)
            engine = self._engine
            while engine.step():
                yield Step.from_columns(engine.columns(engine.n_rows - 1), 0)
            if engine.n_rows and FINISH_REASONS[engine.finish] != "cancelled":
                yield Step.from_columns(engine.columns(engine.n_rows - 1), 0)
            self._finish(prompt, prompt_tokens)

    def record_oracle(
        self,
        prompt: Prompt,
        max_tokens: int = 128,
        depth: int | None = None,
        *,
        ngram_n: int = DEFAULT_NGRAM_N,
        ngram_m: int = DEFAULT_NGRAM_M,
        probe: bool = True,
    ) -> "OracleTrace":
        """Record an oracle trace: the greedy generation decoded once, one token per step, with the
        MTP draft chain of length ``depth`` (default: the session's capacity) and the n-gram draft
        the engine would propose at every position, and this machine's measured cost model
        (``probe=False`` skips the verify-batch probes; batch costs are then extrapolated from
        single-token steps). Replay any policy with ``n_max <= depth`` with :func:`mtp_explorer.simulate`.
        See :mod:`mtp_explorer.oracle`.
        """
        import time

        from .oracle import OracleTrace

        engine = self._live()
        depth = self.capacity if depth is None else depth
        _check_int("depth", depth, 1, self.capacity)
        _check_int("max_tokens", max_tokens, 1, None)
        _check_int("ngram_n", ngram_n, 1, 1024)
        _check_int("ngram_m", ngram_m, 1, 1024)
        with self._run():
            tokens = self._prompt_tokens(prompt)
            self._drafter = "chain" if self.info.has_mtp else "ngram"
            t0 = time.perf_counter()
            done, cols = engine.record_oracle(tokens, max_tokens, depth, ngram_n, ngram_m, bool(probe))
            wall = time.perf_counter() - t0
            if not done:
                from .errors import MtpExplorerError

                raise MtpExplorerError("the oracle recording was cancelled")
            generated = engine.generated()
            cols = dict(cols)
            cols["token_eog"] = np.array([engine.is_eog(t) for t in generated], dtype=bool)
            pieces = [engine.piece(t) for t in generated]
            oracle = OracleTrace(
                prompt=prompt if isinstance(prompt, str) else self.detokenize(tokens),
                prompt_tokens=tokens,
                tokens=generated,
                pieces=pieces,
                text=engine.detokenize(generated),
                columns=cols,
                finish_reason=FINISH_REASONS[engine.finish],
                settings={
                    "max_tokens": max_tokens, "depth": depth, "n_ctx": self.n_ctx, "capacity": self.capacity,
                    "threads": self.threads, "telemetry": self.telemetry, "clock": self.clock, "ngram_n": ngram_n,
                    "ngram_m": ngram_m, "probe": bool(probe), "has_mtp": bool(self.info.has_mtp),
                    "is_recurrent": bool(engine.is_recurrent), "n_prompt": len(tokens),
                },
                model=self.info.to_dict(),
                wall_seconds=wall,
            )
        return oracle

    def set_params(self, n_max: int | None = None, p_min: float | None = None, n_min: int | None = None) -> None:
        """Change drafting parameters; a running generation uses them from its next step."""
        cur_n_max, cur_p_min, cur_n_min = self._live().params()
        n_max = cur_n_max if n_max is None else n_max
        p_min = cur_p_min if p_min is None else p_min
        n_min = min(cur_n_min, n_max) if n_min is None else n_min
        self._validate_params(n_max, p_min, n_min, getattr(self, "_drafter", "mtp"))
        self._engine.set_params(n_max, float(p_min), n_min)

    @property
    def params(self) -> dict:
        n_max, p_min, n_min = self._live().params()
        return {"n_max": n_max, "p_min": p_min, "n_min": n_min}

    def cancel(self) -> None:
        """Stop the running generation within one step; the session stays usable."""
        if not self._closed:
            self._engine.cancel()

    # -- internals -------------------------------------------------------------------------------
    def _live(self) -> "_native.Engine":
        if self._closed:
            raise SessionClosedError("the session is closed")
        return self._engine

    def _run(self):
        self._live()
        session = self

        class _Guard:
            def __enter__(self_inner):
                if not session._busy.acquire(blocking=False):
                    raise SessionBusyError("a generation is already running on this session")

            def __exit__(self_inner, *exc):
                session._busy.release()

        return _Guard()

    def _validate_params(self, n_max, p_min, n_min, drafter: str = "mtp") -> None:
        capacity = self.capacity
        if not isinstance(n_max, int) or isinstance(n_max, bool) or n_max < 0:
            raise ParameterError(f"n_max must be a non-negative integer, got {n_max!r}")
        if n_max > capacity:
            what = ("its n_rs_seq recurrent snapshot slots" if self._engine.is_recurrent
                    else "the draft depth its telemetry holds, set by n_rs_seq")
            raise ParameterError(
                f"n_max={n_max} exceeds this session's capacity of {capacity} "
                f"({what}); open the session with n_rs_seq={n_max} or more"
            )
        if n_max > 0 and not self.info.has_mtp and drafter != "ngram":
            raise MtpUnavailableError(
                f"{self.info.name} ({self.info.path}) has no MTP layers, so it cannot draft with "
                f"drafter={drafter!r}; use n_max=0 for plain decoding or drafter='ngram'"
            )
        if isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or math.isnan(p_min) or not 0.0 <= p_min <= 1.0:
            raise ParameterError(f"p_min must be a number in [0, 1], got {p_min!r}")
        if not isinstance(n_min, int) or isinstance(n_min, bool) or n_min < 0:
            raise ParameterError(f"n_min must be a non-negative integer, got {n_min!r}")
        if n_min > n_max:
            raise ParameterError(f"n_min={n_min} is larger than n_max={n_max}")

    def _begin(self, prompt, max_tokens, n_max, p_min, n_min, temperature, seed, drafter="mtp",
               ngram_n=DEFAULT_NGRAM_N, ngram_m=DEFAULT_NGRAM_M) -> list[int]:
        if drafter not in DRAFTER_MODES:
            raise ParameterError(f"drafter must be one of {DRAFTER_MODES}, got {drafter!r}")
        _check_int("ngram_n", ngram_n, 1, 1024)
        _check_int("ngram_m", ngram_m, 1, 1024)
        self._validate_params(n_max, p_min, n_min, drafter)
        _check_int("max_tokens", max_tokens, 1, None)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
            raise ParameterError(f"temperature must be a finite number >= 0, got {temperature!r}")
        seed = self.seed if seed is None else seed
        _check_int("seed", seed, 0, 2**32 - 1)
        tokens = self._prompt_tokens(prompt)
        self._drafter = drafter
        self._settings = {
            "max_tokens": max_tokens, "n_max": n_max, "p_min": float(p_min), "n_min": n_min,
            "temperature": float(temperature), "seed": seed, "n_ctx": self.n_ctx,
            "capacity": self.capacity, "threads": self.threads, "telemetry": self.telemetry,
            "clock": self.clock, "drafter": drafter, "ngram_n": ngram_n, "ngram_m": ngram_m,
        }
        self._engine.begin(tokens, max_tokens, float(temperature), seed, n_max, float(p_min), n_min,
                           DRAFTER_MODES.index(drafter), ngram_n, ngram_m)
        return tokens

    def _prompt_tokens(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ParameterError("the prompt is empty")
            tokens = self.tokenize(prompt)
        else:
            tokens = [int(t) for t in prompt]
            n_vocab = self._engine.n_vocab
            bad = [t for t in tokens if not 0 <= t < n_vocab]
            if bad:
                raise ParameterError(f"prompt token ids out of range [0, {n_vocab}): {bad[:5]}")
        if not tokens:
            raise ParameterError("the prompt is empty (it tokenizes to no tokens)")
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(tokens)} tokens but the context holds {self.n_ctx}; "
                "shorten it or open the session with a larger n_ctx"
            )
        return tokens

    def _finish(self, prompt: Prompt, prompt_tokens: list[int]) -> Trace:
        engine = self._engine
        tokens = engine.generated()
        trace = Trace(
            prompt=prompt if isinstance(prompt, str) else self.detokenize(prompt_tokens),
            prompt_tokens=prompt_tokens,
            tokens=tokens,
            text=engine.detokenize(tokens),
            pieces=[engine.piece(t) for t in tokens],
            columns=dict(engine.columns(0)),
            finish_reason=FINISH_REASONS[engine.finish],
            settings=self._settings,
            model=self.info.to_dict(),
            t_prefill_ns=engine.t_prefill_ns,
        )
        self.last_trace = trace
        return trace


def _check_int(name: str, value, lo: int, hi: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ParameterError(f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ParameterError(f"{name} must be {bound}, got {value}")
