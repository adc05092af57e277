"""Grow the demo model's trunk to more layers without changing what it computes.

The old layers keep their weights and their order, spread over the new stack at positions of their own
type (gated delta net or gated full attention, llama.cpp's ``full_attention_interval`` pattern).  Every
new layer starts with zero output projections (``linear_attn.out_proj`` / ``self_attn.o_proj`` and
``mlp.down_proj``), so it adds exactly zero to the residual stream: the grown model's logits, trunk
states and MTP rows equal the old model's bit for bit.  Its inner weights keep their fresh initialisation
and start to learn once the output projections move off zero.
"""

from __future__ import annotations

import dataclasses

import torch

from training.model import DemoModel, ModelConfig

#: the projections that write a layer's output into the residual stream (zeroed in new layers)
OUTPUT_PROJECTIONS = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight")


def placement(old_types: list[str], new_types: list[str]) -> list[int]:
    """New position of each old layer: spread evenly, order kept, each on a position of its own type."""
    n_old, n_new = len(old_types), len(new_types)
    if n_new < n_old:
        raise ValueError(f"cannot grow {n_old} layers to {n_new}")
    out: list[int] = []
    for j, kind in enumerate(old_types):
        lo = out[-1] + 1 if out else 0
        # leave room for the old layers still to place, each on a later position of its own type
        hi = n_new - 1
        for later in reversed(old_types[j + 1 :]):
            hi = max(p for p in range(hi + 1) if new_types[p] == later) - 1
        target = round((j + 1) * n_new / n_old) - 1
        candidates = [p for p in range(lo, hi + 1) if new_types[p] == kind]
        if not candidates:
            raise ValueError(f"no position of type {kind!r} for old layer {j} in {new_types}")
        out.append(min(candidates, key=lambda p: (abs(p - target), p)))
    return out


def grow(model: DemoModel, n_layers: int, seed: int = 0) -> tuple[DemoModel, list[int]]:
    """A :class:`DemoModel` of ``n_layers`` trunk layers computing exactly what ``model`` computes,
    and the new position of each old layer."""
    old_cfg = model.cfg
    cfg = dataclasses.replace(old_cfg, num_hidden_layers=n_layers, layer_types=[])
    if cfg.full_attention_interval != old_cfg.full_attention_interval:
        raise ValueError("growth keeps the full-attention interval")
    torch.manual_seed(seed)
    grown = DemoModel(ModelConfig(**cfg.to_dict()))
    where = placement(old_cfg.layer_types, grown.cfg.layer_types)
    old_sd = model.state_dict()
    new_sd = grown.state_dict()
    prefix = "trunk.model.layers."
    moved = {f"{prefix}{j}.": f"{prefix}{p}." for j, p in enumerate(where)}
    for key, value in old_sd.items():
        if key.startswith(prefix):
            head = prefix + key[len(prefix) :].split(".", 1)[0] + "."
            key = moved[head] + key[len(head) :]
        if new_sd[key].shape != value.shape:
            raise ValueError(f"{key}: {tuple(value.shape)} cannot go to {tuple(new_sd[key].shape)}")
        new_sd[key] = value.clone()
    fresh = set(range(n_layers)) - set(where)
    for key in new_sd:
        if key.startswith(prefix) and int(key[len(prefix) :].split(".", 1)[0]) in fresh:
            if key.split(".", 4)[-1] in OUTPUT_PROJECTIONS:
                new_sd[key] = torch.zeros_like(new_sd[key])
    grown.load_state_dict(new_sd)
    return grown.to(next(model.parameters()).dtype), where
