"""The demo model in PyTorch: a Hugging Face ``Qwen3_5ForCausalLM`` trunk plus our MTP block.

The MTP block mirrors llama.cpp's ``llama_model_qwen35::graph_mtp`` (src/models/qwen35.cpp)
and the ``mtp.*`` tensors of Qwen3.5 checkpoints:

    e   = embed_tokens(x_k)                       (shared with the trunk)
    h   = trunk hidden state of position k-1 *after* the final RMS norm (zeros for k = 0);
          this is llama.cpp's ``h_nextn`` / ``llama_get_embeddings_nextn`` row
    u   = fc(concat(pre_fc_norm_embedding(e), pre_fc_norm_hidden(h)))     -> nextn.eh_proj
    u   = one full-attention Qwen3.5 decoder layer over the MTP rows, causal, at position k
    out = lm_head(norm(u))                        (lm_head shared with the trunk)

Row ``k`` predicts ``x_{k+1}``: given the trunk's state at ``k-1`` and the next token
``x_k``, it drafts the token after that, i.e. "token t+2 from the hidden state at t and
the embedding of t+1" with ``t = k - 1``.  llama.cpp's draft-mtp driver pairs rows the
same way (``common/speculative.cpp``: ``(h_p, x_{p+1})`` at position ``p + 1``; the very
first row gets a zero hidden state).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm, apply_rotary_pos_emb


@dataclass
class ModelConfig:
    """Architecture of the demo model (trunk + one MTP block, tied embeddings)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    full_attention_interval: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10_000.0
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_num_key_heads: int = 4
    linear_num_value_heads: int = 4
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02
    eos_token_id: int = 4095
    layer_types: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.layer_types:
            self.layer_types = [
                "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)
            ]
        if self.linear_key_head_dim != self.linear_value_head_dim:
            raise ValueError("llama.cpp's qwen35 needs linear key and value head dims to be equal")

    @property
    def rope_dim(self) -> int:
        """Rotary dimensions per attention head."""
        return int(self.head_dim * self.partial_rotary_factor)

    def mrope_section(self) -> list[int]:
        """Interleaved M-RoPE sections covering every rotary pair (text positions only)."""
        pairs = self.rope_dim // 2
        return [-(-pairs // 3), -(-(pairs - 1) // 3), -(-(pairs - 2) // 3)]

    def hf_config(self) -> Qwen3_5TextConfig:
        """The equivalent ``transformers`` configuration of the trunk."""
        cfg = Qwen3_5TextConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            max_position_embeddings=self.max_position_embeddings,
            initializer_range=self.initializer_range,
            rms_norm_eps=self.rms_norm_eps,
            use_cache=False,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": self.mrope_section(),
                "mrope_interleaved": True,
            },
            attention_bias=False,
            attention_dropout=0.0,
            linear_conv_kernel_dim=self.linear_conv_kernel_dim,
            linear_key_head_dim=self.linear_key_head_dim,
            linear_value_head_dim=self.linear_value_head_dim,
            linear_num_key_heads=self.linear_num_key_heads,
            linear_num_value_heads=self.linear_num_value_heads,
            layer_types=list(self.layer_types),
            eos_token_id=self.eos_token_id,
            bos_token_id=self.eos_token_id,
        )
        cfg._attn_implementation = "sdpa"
        return cfg

    def gguf_config(self, n_ctx_train: int = 4096):
        """The matching GGUF hyper-parameters (a :class:`mtp_explorer.models.gguf_qwen35.Qwen35Config`)."""
        # imported here: training on a machine without the package's native extension needs only torch
        from mtp_explorer.models.gguf_qwen35 import Qwen35Config

        return Qwen35Config(
            n_vocab=self.vocab_size,
            n_embd=self.hidden_size,
            n_layer=self.num_hidden_layers,
            n_ff=self.intermediate_size,
            n_head=self.num_attention_heads,
            n_head_kv=self.num_key_value_heads,
            head_dim=self.head_dim,
            full_attention_interval=self.full_attention_interval,
            ssm_conv_kernel=self.linear_conv_kernel_dim,
            ssm_state_size=self.linear_key_head_dim,
            ssm_group_count=self.linear_num_key_heads,
            ssm_time_step_rank=self.linear_num_value_heads,
            rope_dim=self.rope_dim,
            rope_freq_base=self.rope_theta,
            rope_sections=tuple(self.mrope_section() + [0]),  # type: ignore[arg-type]
            rms_eps=self.rms_norm_eps,
            n_ctx_train=n_ctx_train,
            nextn_predict_layers=1,
        )

    def to_dict(self) -> dict:
        """Plain-data form (for checkpoints and logs)."""
        return asdict(self)


class MTPBlock(nn.Module):
    """One NextN/MTP block: input norms, ``fc`` (eh_proj), a full-attention layer, head norm."""

    def __init__(self, hf_cfg: Qwen3_5TextConfig) -> None:
        super().__init__()
        h = hf_cfg.hidden_size
        layer_cfg = copy.deepcopy(hf_cfg)
        layer_cfg.num_hidden_layers = 1
        layer_cfg.layer_types = ["full_attention"]
        layer_cfg._attn_implementation = "sdpa"
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=hf_cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=hf_cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_cfg, 0)])
        self.norm = Qwen3_5RMSNorm(h, eps=hf_cfg.rms_norm_eps)

    def forward(
        self,
        tok_embeds: torch.Tensor,
        h_prev: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Post-``norm`` MTP hidden states (B, T, H) for rows (token embedding, previous h)."""
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(tok_embeds), self.pre_fc_norm_hidden(h_prev)], dim=-1))
        u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(u)

    def first(
        self, tok_embeds: torch.Tensor, h_prev: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, KV]:
        """:meth:`forward` on the real rows (causal), also returning their rotated keys and values."""
        u = self._input(tok_embeds, h_prev)
        return self._layer(u, position_embeddings, lambda q, k, v: _causal_attention(q, k, v))

    def chained(
        self,
        tok_embeds: torch.Tensor,
        h_prev: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        real: KV,
        chain: list[KV],
        starts: torch.Tensor,
    ) -> tuple[torch.Tensor, KV]:
        """One chained draft row per chain (B, n, H); chain ``i`` starts at real row ``starts[i]`` and
        attends to the real rows ``0..starts[i]`` (``real`` keys/values), to the earlier rows of its
        own chain (``chain``, one (k, v) per earlier depth) and to itself, as llama.cpp's MTP context
        does while it drafts that round (real rows kept, draft rows appended, then removed)."""
        u = self._input(tok_embeds, h_prev)
        return self._layer(u, position_embeddings, lambda q, k, v: _chain_attention(q, k, v, real, chain, starts))

    def _input(self, tok_embeds: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.pre_fc_norm_embedding(tok_embeds), self.pre_fc_norm_hidden(h_prev)], dim=-1))

    def _layer(self, u: torch.Tensor, pe: tuple[torch.Tensor, torch.Tensor], attend) -> tuple[torch.Tensor, KV]:
        """The decoder layer of :class:`Qwen3_5DecoderLayer` with the attention pattern ``attend``."""
        layer = self.layers[0]
        attn = layer.self_attn
        x = layer.input_layernorm(u)
        b, t, _ = x.shape
        d = attn.head_dim
        q, gate = torch.chunk(attn.q_proj(x).view(b, t, -1, 2 * d), 2, dim=-1)
        q = attn.q_norm(q).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(b, t, -1, d)).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, -1, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *pe)
        o = attend(q, k, v)  # (B, heads, T, D)
        o = o.transpose(1, 2).reshape(b, t, -1) * torch.sigmoid(gate.reshape(b, t, -1))
        u = u + attn.o_proj(o)
        u = u + layer.mlp(layer.post_attention_layernorm(u))
        return self.norm(u), (k, v)


KV = tuple[torch.Tensor, torch.Tensor]


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """GQA: key/value head ``i`` serves query heads ``i * g .. (i + 1) * g - 1``."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    h = q.shape[1]
    return F.scaled_dot_product_attention(q, _expand_kv(k, h).to(q.dtype), _expand_kv(v, h).to(q.dtype), is_causal=True)


def _chain_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, real: KV, chain: list[KV], starts: torch.Tensor
) -> torch.Tensor:
    """Row ``i`` of ``q`` attends to real rows ``0..starts[i]``, then row ``i`` of each earlier depth, then itself."""
    h, d = q.shape[1], q.shape[3]
    scale = d**-0.5
    rk, rv = (_expand_kv(x, h).to(q.dtype) for x in real)
    t = rk.shape[2]
    scores = [torch.matmul(q, rk.transpose(-1, -2)) * scale]  # (B, h, n, T)
    future = torch.arange(t, device=q.device)[None, :] > starts[:, None]
    scores[0] = scores[0].masked_fill(future, float("-inf"))
    own = [(_expand_kv(ck, h).to(q.dtype), _expand_kv(cv, h).to(q.dtype)) for ck, cv in chain]
    own.append((_expand_kv(k, h).to(q.dtype), _expand_kv(v, h).to(q.dtype)))
    scores += [(q * ok).sum(-1, keepdim=True) * scale for ok, _ in own]
    p = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(p[..., :t], rv)
    for j, (_, ov) in enumerate(own):
        out = out + p[..., t + j : t + j + 1] * ov
    return out


class DemoModel(nn.Module):
    """Trunk (``Qwen3_5ForCausalLM``) + MTP block, with the losses used for training."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hf_cfg = cfg.hf_config()
        self.trunk = Qwen3_5ForCausalLM(hf_cfg)
        self.mtp = MTPBlock(hf_cfg)
        self._init_mtp(hf_cfg.initializer_range)

    def _init_mtp(self, std: float) -> None:
        for module in self.mtp.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
        for name, p in self.mtp.named_parameters():
            if name.endswith("A_log"):
                continue
            if p.ndim == 1:
                nn.init.zeros_(p)  # zero-centred RMS norm weights (multiplier 1 + w)

    def positions(self, batch: int, seq: int, device: torch.device) -> torch.Tensor:
        """Text position ids (3, B, T) as Qwen3.5's rotary embedding takes them."""
        pos = torch.arange(seq, device=device).view(1, 1, -1)
        return pos.expand(3, batch, -1)

    def trunk_hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Trunk hidden states after the final RMS norm (llama.cpp's ``h_nextn``), (B, T, H)."""
        return self.trunk.model(input_ids=input_ids, use_cache=False).last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head (shared by trunk and MTP)."""
        return self.trunk.lm_head(hidden)

    def mtp_hidden(self, input_ids: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
        """MTP hidden states for rows (x_k, h_prev[k]); ``h_prev[k]`` is the trunk state at k-1."""
        b, t = input_ids.shape
        e = self.trunk.model.embed_tokens(input_ids)
        pe = self.trunk.model.rotary_emb(e, self.positions(b, t, input_ids.device))
        return self.mtp(e, h_prev, pe)

    @staticmethod
    def shift_hidden(h: torch.Tensor) -> torch.Tensor:
        """``h_prev``: the trunk states shifted right by one row, zeros in row 0."""
        return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(trunk logits, MTP logits), both (B, T, V); row k of each predicts x_{k+1}."""
        h = self.trunk_hidden(input_ids)
        m = self.mtp_hidden(input_ids, self.shift_hidden(h))
        return self.logits(h), self.logits(m)

    def mtp_chain(
        self, input_ids: torch.Tensor, h: torch.Tensor, depth: int, starts: torch.Tensor | None = None
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """MTP hidden states of draft depths ``1..depth`` on a teacher-forced sequence, and the chains' starts.

        Depth 1 is :meth:`forward`'s MTP rows, all ``T`` of them (row ``k``: ``x_k`` with the
        trunk's ``h_{k-1}``).  Depth ``d >= 2`` has one row per chain ``i`` starting at real row
        ``q = starts[i]`` (default: every ``q`` in ``1..T-depth-1``, whose ``depth`` drafts all have
        a target): token ``x_{q+d-1}`` with the MTP block's own output of depth ``d - 1``, at
        position ``q + d - 1``; it predicts ``x_{q+d}``.  This is llama.cpp's chained drafting
        after drafts ``1..d-1`` of round ``q`` were right (``common/speculative.cpp``, draft-mtp).
        """
        b, t = input_ids.shape
        if starts is None:
            starts = torch.arange(1, t - depth, device=input_ids.device)
        e = self.trunk.model.embed_tokens(input_ids)
        cos, sin = self.trunk.model.rotary_emb(e, self.positions(b, t, input_ids.device))
        m, real = self.mtp.first(e, self.shift_hidden(h), (cos, sin))
        outs, chain, prev = [m], [], m[:, starts]
        for d in range(2, depth + 1):
            at = starts + d - 1
            prev, kv = self.mtp.chained(e[:, at], prev, (cos[:, at], sin[:, at]), real, chain, starts)
            chain.append(kv)
            outs.append(prev)
        return outs, starts

    def losses(
        self, input_ids: torch.Tensor, depth: int = 1, distill: bool = False, starts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """(trunk CE, MTP loss per depth, MTP CE per depth), nats/token.

        Depth 1 is scored on every row with a real trunk state (``1..T-2``), deeper depths on the
        chains of :meth:`mtp_chain` (``starts``).  The MTP loss is the CE against the data
        (``distill=False``) or against the trunk's own (detached) next-token distribution at the
        same position (``distill=True``: what greedy acceptance rewards).
        """
        h = self.trunk_hidden(input_ids)
        trunk_logits = self.logits(h)
        v = trunk_logits.shape[-1]
        ce_trunk = F.cross_entropy(trunk_logits[:, :-1].reshape(-1, v).float(), input_ids[:, 1:].reshape(-1))
        ce, soft, _ = self.mtp_terms(input_ids, h, trunk_logits.detach(), depth, starts)
        return ce_trunk, soft if distill else ce, [c.detach() for c in ce]

    def mtp_terms(
        self,
        input_ids: torch.Tensor,
        h: torch.Tensor,
        teacher: torch.Tensor,
        depth: int,
        starts: torch.Tensor | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Per draft depth 1..``depth`` of :meth:`mtp_chain` on trunk states ``h``: (CE of the data's token, CE
        against the trunk's distribution ``softmax(teacher)`` at the same position, top-1 agreement with it).
        Depth 1 is scored on every row with a real trunk state (``1..T-2``), deeper depths on the chains."""
        t = input_ids.shape[1]
        v = teacher.shape[-1]
        outs, starts = self.mtp_chain(input_ids, h, depth, starts)
        rows = [torch.arange(1, t - 1, device=input_ids.device)] + [starts] * (depth - 1)
        ce, soft, agree = [], [], []
        for d, (m, q) in enumerate(zip(outs, rows), start=1):
            logits = self.logits(m[:, 1 : t - 1] if d == 1 else m).float().reshape(-1, v)
            logp = torch.log_softmax(logits, dim=-1)
            target = teacher[:, q + d - 1].float().reshape(-1, v)  # the trunk's distribution for token x_{q+d}
            ce.append(F.nll_loss(logp, input_ids[:, q + d].reshape(-1)))
            soft.append(-(torch.softmax(target, dim=-1) * logp).sum(-1).mean())
            agree.append((logits.argmax(-1) == target.argmax(-1)).float().mean().detach())
        return ce, soft, agree

    def n_params(self) -> dict[str, int]:
        """Parameter counts (embedding counted once: it is tied to the LM head)."""
        trunk = sum(p.numel() for p in self.trunk.parameters())
        mtp = sum(p.numel() for p in self.mtp.parameters())
        emb = self.trunk.model.embed_tokens.weight.numel()
        return {"total": trunk + mtp, "trunk": trunk, "mtp": mtp, "embedding": emb}
