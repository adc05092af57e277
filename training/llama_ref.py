"""A reference driver of a qwen35+MTP GGUF through llama-cpp-python's low-level API.

Used by the tests and by ``training/evaluate.py`` (no torch needed).  It opens one model
with ``load_mtp = True``, a target context (recurrent-state snapshots on, ``h_nextn`` rows
output for every batch row) and an MTP context (``ctx_type = LLAMA_CONTEXT_TYPE_MTP``) on
the same model, and feeds the MTP context exactly as llama.cpp's draft-mtp driver
(``common/speculative.cpp``) does: row ``k`` carries token ``x_k`` plus the target's
``h_nextn`` row of position ``k - 1`` (zeros for ``k = 0``), at position ``k``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

_BACKEND_READY = False


def _backend_init() -> None:
    global _BACKEND_READY
    if not _BACKEND_READY:
        llama_cpp.llama_backend_init()
        llama_cpp.llama_log_set(_silent_log, ctypes.c_void_p(0))
        _BACKEND_READY = True


@llama_cpp.llama_log_callback
def _silent_log(level, text, user_data):  # pragma: no cover - C callback
    return None


@dataclass
class SpecStats:
    """Outcome of a simulated greedy speculative decode (see :meth:`LlamaMTP.speculative_greedy`)."""

    n_max: int
    drafts: int = 0  #: draft rounds
    drafted: int = 0  #: draft tokens proposed
    accepted: int = 0  #: draft tokens accepted
    by_depth_drafted: list[int] = field(default_factory=list)  #: rounds that drafted at least d+1 tokens
    by_depth_tried: list[int] = field(default_factory=list)  #: rounds whose draft d+1 was reached (1..d accepted)
    by_depth_accepted: list[int] = field(default_factory=list)  #: rounds whose drafts 1..d+1 were all accepted

    @property
    def acceptance(self) -> float:
        """Accepted / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def merge(self, other: SpecStats) -> None:
        """Add another run's counts to this one."""
        self.drafts += other.drafts
        self.drafted += other.drafted
        self.accepted += other.accepted
        for i, (d, t, a) in enumerate(zip(other.by_depth_drafted, other.by_depth_tried, other.by_depth_accepted)):
            self.by_depth_drafted[i] += d
            self.by_depth_tried[i] += t
            self.by_depth_accepted[i] += a

    def conditional_by_depth(self) -> list[float | None]:
        """P(draft d accepted | drafts 1..d-1 accepted), d = 1..n_max."""
        return [a / t if t else None for a, t in zip(self.by_depth_accepted, self.by_depth_tried)]

    def cumulative_by_depth(self) -> list[float | None]:
        """P(drafts 1..d all accepted | at least d drafted), d = 1..n_max."""
        return [a / d if d else None for a, d in zip(self.by_depth_accepted, self.by_depth_drafted)]


class LlamaMTP:
    """A loaded qwen35+MTP GGUF with a target and an MTP context (single sequence)."""

    def __init__(
        self, path: str | Path, *, n_ctx: int = 2048, n_threads: int = 2, n_rs_seq: int = 4, f32_cache: bool = False
    ) -> None:
        """Open ``path``; ``f32_cache`` stores the attention KV cache in F32 and disables flash
        attention (llama.cpp's default F16 cache rounds K and V), for exact-parity checks."""
        _backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.load_mtp = True
        mp.n_gpu_layers = 0
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_embd = llama_cpp.llama_model_n_embd(self.model)
        self.n_nextn = llama_cpp.llama_model_n_layer_nextn(self.model)

        def make_ctx(ctx_type: int):
            cp = llama_cpp.llama_context_default_params()
            cp.n_ctx = n_ctx
            cp.n_batch = n_ctx
            cp.n_ubatch = n_ctx
            cp.n_seq_max = 1
            cp.n_threads = n_threads
            cp.n_threads_batch = n_threads
            cp.n_rs_seq = n_rs_seq if ctx_type == llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT else 0
            cp.ctx_type = ctx_type
            if f32_cache:
                cp.type_k = 0  # GGML_TYPE_F32
                cp.type_v = 0
                cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            ctx = llama_cpp.llama_init_from_model(self.model, cp)
            if not ctx:
                raise RuntimeError("llama.cpp could not create a context")
            return ctx

        self.ctx = make_ctx(llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT)
        self.ctx_mtp = make_ctx(llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx, True, False)
        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx_mtp, True, True)
        self._batch = llama_cpp.llama_batch_ext_init(self.ctx)
        self._batch_mtp = llama_cpp.llama_batch_ext_init(self.ctx_mtp)

    def close(self) -> None:
        """Free the contexts and the model."""
        if getattr(self, "model", None):
            llama_cpp.llama_batch_ext_free(self._batch)
            llama_cpp.llama_batch_ext_free(self._batch_mtp)
            llama_cpp.llama_free(self.ctx)
            llama_cpp.llama_free(self.ctx_mtp)
            llama_cpp.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> LlamaMTP:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- tokenizer -----------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """llama.cpp's tokenization of ``text``."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError("tokenize buffer too small")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """Raw bytes of one token."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 256, 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Concatenated token pieces decoded as UTF-8 (no clean-up)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    # -- low-level evaluation ------------------------------------------------------
    def reset(self) -> None:
        """Clear both contexts' memory."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx_mtp), True)

    def target(self, tokens: Sequence[int], pos0: int) -> tuple[np.ndarray, np.ndarray]:
        """Decode ``tokens`` at positions ``pos0..``: (logits (n, V), h_nextn rows (n, E))."""
        b = self._batch
        llama_cpp.llama_batch_ext_clear(b)
        for i, t in enumerate(tokens):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(t))
            pos = llama_cpp.llama_pos(pos0 + i)
            llama_cpp.llama_batch_ext_set_pos(b, idx, ctypes.byref(pos))
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
        rc = llama_cpp.llama_process(self.ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            raise RuntimeError(f"target decode failed: {rc}")
        n = len(tokens)
        logits = np.empty((n, self.n_vocab), dtype=np.float32)
        for i in range(n):
            ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
            logits[i] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        hptr = llama_cpp_ext.llama_get_embeddings_nextn(self.ctx)
        h = np.ctypeslib.as_array(hptr, shape=(n, self.n_embd)).copy()
        return logits, h

    def mtp(
        self, tokens: Sequence[int], h_rows: np.ndarray, pos0: int, outputs: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decode MTP rows (token ``tokens[i]``, hidden ``h_rows[i]``) at ``pos0 + i``.

        Returns (logits, MTP h_nextn) for the rows in ``outputs`` (default: all rows).
        """
        n = len(tokens)
        outputs = list(range(n)) if outputs is None else list(outputs)
        h_rows = np.ascontiguousarray(h_rows, dtype=np.float32).reshape(n, self.n_embd)
        b = self._batch_mtp
        llama_cpp.llama_batch_ext_clear(b)
        keep = []
        for i, t in enumerate(tokens):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(t))
            pos = llama_cpp.llama_pos(pos0 + i)
            llama_cpp.llama_batch_ext_set_pos(b, idx, ctypes.byref(pos))
            row = h_rows[i]
            keep.append(row)
            emb = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
            if not llama_cpp.llama_batch_ext_set_embd_token(b, idx, emb):
                raise RuntimeError("could not set the MTP hidden-state row")
            if i in outputs:
                llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
        rc = llama_cpp.llama_process(self.ctx_mtp, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            raise RuntimeError(f"MTP decode failed: {rc}")
        logits = np.empty((len(outputs), self.n_vocab), dtype=np.float32)
        hs = np.empty((len(outputs), self.n_embd), dtype=np.float32)
        for j, i in enumerate(outputs):
            logits[j] = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx_mtp, i), shape=(self.n_vocab,))
            hs[j] = np.ctypeslib.as_array(
                llama_cpp_ext.llama_get_embeddings_nextn_ith(self.ctx_mtp, i), shape=(self.n_embd,)
            )
        del keep
        return logits, hs

    def mtp_seq_rm(self, p0: int) -> None:
        """Drop MTP-context rows at positions >= p0."""
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx_mtp), 0, p0, -1)

    # -- higher-level helpers ------------------------------------------------------
    def greedy(self, prompt: Sequence[int], n_new: int, *, stop_at_eos: bool = True) -> list[int]:
        """Plain greedy continuation of ``prompt`` with the target (resets the contexts)."""
        self.reset()
        logits, _ = self.target(prompt, 0)
        out: list[int] = []
        nxt = int(np.argmax(logits[-1]))
        eos = llama_cpp.llama_vocab_eos(self.vocab)
        pos = len(prompt)
        while len(out) < n_new:
            out.append(nxt)
            if stop_at_eos and nxt == eos:
                break
            logits, _ = self.target([nxt], pos)
            pos += 1
            nxt = int(np.argmax(logits[-1]))
        return out

    def sequence_states(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Target logits and h_nextn rows for a whole sequence in one batch (resets the contexts)."""
        self.reset()
        return self.target(tokens, 0)

    def speculative_greedy(self, prompt: Sequence[int], n_new: int, n_max: int) -> tuple[list[int], SpecStats]:
        """Simulate llama.cpp's greedy draft-mtp loop with ``n_max`` drafts per round.

        The target's greedy continuation is computed first (the speculative result is the
        same by construction); then, round by round, the MTP context is caught up with the
        real rows, the chain of ``n_max`` drafts is made (each further draft fed the MTP
        block's own ``h_nextn``), compared with the greedy tokens, and the draft rows are
        dropped again.  Returns (continuation, statistics).
        """
        gen = self.greedy(prompt, n_new, stop_at_eos=False)
        seq = list(prompt) + gen
        _, h = self.sequence_states(seq)
        stats = SpecStats(
            n_max=n_max, by_depth_drafted=[0] * n_max, by_depth_tried=[0] * n_max, by_depth_accepted=[0] * n_max
        )
        zero = np.zeros((1, self.n_embd), dtype=np.float32)
        # Catch-up of the prompt rows 0..P-1 (row k: x_k with h_{k-1}).
        p = len(prompt)
        rows_h = np.concatenate([zero, h[: p - 1]], axis=0)
        self.mtp(seq[:p], rows_h, 0, outputs=[p - 1])
        fed = p  # MTP rows 0..fed-1 hold real inputs
        q = p  # position of the token the next draft round starts from (x_q is known)
        end = len(seq) - 1
        while q < end:
            if fed < q:
                self.mtp(seq[fed:q], h[fed - 1 : q - 1], fed, outputs=[q - fed - 1])
                fed = q
            # first draft row: real (x_q, h_{q-1})
            logits, hq = self.mtp([seq[q]], h[q - 1 : q], q)
            fed = q + 1
            drafts = [int(np.argmax(logits[0]))]
            while len(drafts) < n_max and q + len(drafts) < end:
                logits, hq = self.mtp([drafts[-1]], hq, q + len(drafts))
                drafts.append(int(np.argmax(logits[0])))
            self.mtp_seq_rm(q + 1)
            for j in range(len(drafts)):
                stats.by_depth_drafted[j] += 1
            accepted = 0
            for j, d in enumerate(drafts):
                if q + 1 + j > end:
                    break
                stats.by_depth_tried[j] += 1
                if d != seq[q + 1 + j]:
                    break
                stats.by_depth_accepted[j] += 1
                accepted += 1
            stats.drafts += 1
            stats.drafted += len(drafts)
            stats.accepted += accepted
            q += accepted + 1
        return gen, stats
