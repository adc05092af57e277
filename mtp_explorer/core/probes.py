"""What a :class:`~mtp_explorer.Session` measures of its model outside a generation, through its engine handle: how
far its logits move with the batch shape and the hidden states its trunk layers take in, the features llama.cpp's
draft-eagle3 and draft-dflash read from a target. The session's :meth:`~mtp_explorer.Session.batch_shift`,
:meth:`~mtp_explorer.Session.probe_batch_shift` and :meth:`~mtp_explorer.Session.layer_inputs` are these."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import native
from .errors import InputTypeError, ParameterError
from .handle import EngineHandle, Prompt

#: The model architectures whose layer inputs llama.cpp 0.3.36 can give (:meth:`Probes.layer_inputs`).
LAYER_INPUT_ARCHS: tuple[str, ...] = tuple(native.LAYER_INPUT_ARCHS)


class Probes:
    """Measurements of a handle's model that decode outside a generation, each holding the handle while it runs."""

    def __init__(self, handle: EngineHandle) -> None:
        self.handle = handle

    def batch_shift_rows(self, tokens: Sequence[int], ks: Sequence[int]) -> dict[str, np.ndarray]:
        """``tokens`` decoded one row at a time and in batches of each of ``ks`` rows: the engine's raw probe."""
        with self.handle.hold() as engine:
            return engine.probe_batch_shift(list(tokens), list(ks))

    def layer_inputs(self, prompt: Prompt, layers: Sequence[int]) -> np.ndarray:
        """The hidden state entering each of ``layers`` at every token of ``prompt``: ``[tokens, layers, n_embd]``."""
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
            raise InputTypeError(f"layers must be a sequence of layer indices, got {type(layers).__name__}")
        ids = []
        for il in layers:
            if isinstance(il, bool) or not isinstance(il, (int, np.integer)):
                raise InputTypeError(f"a layer is an int, got {il!r}")
            ids.append(int(il))
        if not ids or len(set(ids)) != len(ids):
            raise ParameterError(f"layers must be distinct layer indices, at least one, got {ids}")
        with self.handle.hold() as engine:
            tokens = self.handle.prompt_tokens(prompt)
            return engine.probe_layer_inputs(tokens, ids)
