"""What a :class:`~mtp_explorer.Session` measures of its model outside a generation (mixed into it): how far its
logits move with the batch shape (:meth:`Probes.batch_shift`) and the hidden states its trunk layers take in
(:meth:`Probes.layer_inputs`), the features llama.cpp's draft-eagle3 and draft-dflash read from a target."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import hooks, native
from .errors import InputTypeError, ParameterError

if TYPE_CHECKING:
    from .handle import EngineHandle, Prompt

    _Mixin = EngineHandle  # for the type checker: the session's parts this uses
else:
    _Mixin = object

#: The model architectures whose layer inputs llama.cpp 0.3.36 can give (:meth:`Probes.layer_inputs`).
LAYER_INPUT_ARCHS: tuple[str, ...] = tuple(native.LAYER_INPUT_ARCHS)


class Probes(_Mixin):
    """Measurements of the session's model that decode outside a generation."""

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
        with self._run():
            return self._live().probe_batch_shift(list(tokens), list(ks))

    def layer_inputs(self, prompt: Prompt, layers: Sequence[int]) -> np.ndarray:
        """The hidden state entering each of the target's trunk ``layers`` (the residual stream before the layer's
        norm, Hugging Face's ``hidden_states[il]``) at every token of ``prompt``, decoded from an empty memory: a
        float32 array ``[tokens, len(layers), n_embd]``, the layers in the order given. These are the features
        llama.cpp's draft-eagle3 and draft-dflash read (``llama_get_embeddings_layer_inp``); only the architectures
        of :data:`LAYER_INPUT_ARCHS` give them, and a layer is ``0 .. n_layer - 1`` (a :class:`ParameterError`
        otherwise, raised before anything runs)."""
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
            raise InputTypeError(f"layers must be a sequence of layer indices, got {type(layers).__name__}")
        ids = []
        for il in layers:
            if isinstance(il, bool) or not isinstance(il, (int, np.integer)):
                raise InputTypeError(f"a layer is an int, got {il!r}")
            ids.append(int(il))
        if not ids or len(set(ids)) != len(ids):
            raise ParameterError(f"layers must be distinct layer indices, at least one, got {ids}")
        with self._run():
            tokens = self.prompt_tokens(prompt)
            return self._live().probe_layer_inputs(tokens, ids)
