"""Train the tiny draft model for llama.cpp's ``draft-simple`` speculative type, and export it.

    python -m training.draft                       # train (resumes from training/checkpoints-draft/), then export
    python -m training.draft --max-minutes 10      # stop with a checkpoint after 10 minutes; run again to go on
    python -m training.draft --export              # only export the finished checkpoint
    python -m training.draft --measure             # draft-simple acceptance with llama-speculative-simple (JSON)
    python -m training.draft --measure --target T  # ... against another target GGUF T
    python -m training.draft --steps 20 --out /tmp/d --gguf /tmp/d/draft.gguf   # a smoke run
    python -m training.draft --init DRAFT.gguf --continuations C.npz --target T --steps 600 --lr 1e-3 --out /tmp/d2
                                                   # fine-tune a draft model on target T's own greedy text

``llama-speculative-simple -m pystdlib-qwen35-mtp.gguf -md pystdlib-draft.gguf --spec-type draft-simple``
drafts with a second, small model whose vocabulary must be the target's
(``common_speculative_are_compatible`` in llama.cpp's common/speculative.cpp: same vocabulary type, same
add-BOS/add-EOS flags and ids, sizes within 128 tokens, equal token texts from id 5 on).  So the draft model
uses the bundled model's own tokenizer, read from its GGUF, and the bundled model's training split
(:mod:`training.corpus`), with :mod:`training.train`'s batches, learning-rate schedule, held-out windows and
checkpoint format: the batch of step ``s`` comes from ``numpy.random.default_rng([seed, s])`` and the weights
from ``torch.manual_seed(seed)``, so a run is reproducible and resumable.

The model is a plain ``transformers`` ``Qwen3ForCausalLM`` (llama.cpp architecture ``qwen3``: a KV-cache
transformer, no recurrent state): 2 layers, hidden 128, 4 query / 2 KV heads of 32, SwiGLU FFN 384, tied
embeddings.  The export saves it as a Hugging Face checkpoint (``save_pretrained`` plus ``tokenizer.json`` /
``tokenizer_config.json`` written from the bundled GGUF by :func:`mtp_explorer.devtools.hf_export.tokenizer_files`)
and converts that with llama.cpp's own ``convert_hf_to_gguf.py``
(:func:`mtp_explorer.devtools.hf_export.convert_with_llama_cpp`) to ``mtp_explorer/models/pystdlib-draft.gguf``
(F16), then checks with llama.cpp that the two vocabularies are compatible (:func:`compatibility_problems`).
:func:`model_from_gguf` rebuilds the PyTorch model from the GGUF (the tests' twin; no checkpoint is committed).
The converter needs ``sentencepiece`` even for this BPE tokenizer (its Qwen2/Qwen3 vocabulary step imports it
before it looks for a ``tokenizer.model``).

**Against a target.**  The corpus alone does not know the target: greedy acceptance counts how often the draft's
top-1 is the target's greedy token.  With ``--continuations`` (the target's greedy continuations, written by
``python -m training.trunk --make-continuations``: 64 prompt tokens from the training stream, 128 new) each step also
trains on ``CONTINUATION_BATCH`` of them, the loss taken on the new tokens only (the target's greedy choices) and
weighted ``CONTINUATION_WEIGHT`` against the corpus batch; the last ``CONTINUATION_HELDOUT`` rows are never trained on,
and the evaluation reports the draft's top-1 agreement with them (``continuation_top1``: teacher-forced acceptance at
``n_max`` 1).  ``--init`` starts from a draft GGUF's weights (:func:`model_from_gguf`) instead of a fresh model.

:func:`measure` runs the reference ``llama-speculative-simple`` and counts draft rounds from its debug log
(:func:`draft_rounds`: the binary's own ``accept`` figure is 100% by construction for this recurrent target) and
checks them against :func:`simulate_draft_simple`; the model card's table comes from it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from training.corpus import describe, load_corpus, split_corpus
from training.jsonlog import JsonLog
from training.tokenizer import encode_files, tokenizer_from_vocab, vocab_from_gguf
from training.train import TrainConfig, batch_at, heldout_batches, lr_at, save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "mtp_explorer" / "models"
TARGET = MODELS / "pystdlib-qwen35-mtp.gguf"
DRAFT_NAME = "pystdlib-draft"
DEFAULT_GGUF = MODELS / f"{DRAFT_NAME}.gguf"
DEFAULT_OUT = Path(__file__).resolve().parent
CHECKPOINT_DIR = "checkpoints-draft"  # under --out; not committed (.gitignore)
LOG_NAME = "draft.jsonl"
REFERENCE = ROOT / "build" / "reference" / "bin" / "llama-speculative-simple"
#: llama.cpp's common/speculative.cpp
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5
LICENSE = "PSF-2.0 (training data); model weights released with the mtp-explorer project"  # the bundled model's
CONTINUATION_BATCH = 8  #: the target's continuations per step, where --continuations are given
CONTINUATION_WEIGHT = 1.0  #: their loss's weight against the corpus batch's
CONTINUATION_HELDOUT = 32  #: the last rows of --continuations, kept for the evaluation


@dataclass
class DraftConfig:
    """Architecture of the draft model (a ``Qwen3ForCausalLM``)."""

    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02
    eos_token_id: int = 4095

    def to_dict(self) -> dict:
        return asdict(self)

    def hf_config(self):
        from transformers import Qwen3Config

        d = self.to_dict()
        rope_theta = d.pop("rope_theta")
        return Qwen3Config(
            **d,
            bos_token_id=self.eos_token_id,
            tie_word_embeddings=True,
            attention_bias=False,
            hidden_act="silu",
            use_cache=True,
            rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        )


def draft_train_config() -> TrainConfig:
    """:class:`training.train.TrainConfig` with the draft model, its own step count and learning rate, no MTP loss
    and F32 throughout: on one CPU thread bf16 autocast makes this model's dense steps ~6x slower (measured
    1.2 s vs 7 s per step), the opposite of the bundled model's gated-delta-net steps."""
    return TrainConfig(steps=1000, lr=3e-3, mtp_loss_weight=0.0, bf16_autocast=False, model=DraftConfig())


def build_model(mc: DraftConfig):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM(mc.hf_config())
    model.config.dtype = "float32"
    return model


def n_params(model) -> int:
    """Parameters counted once (the tied LM head is the embedding)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def target_tokenizer(target: Path = TARGET):
    """The bundled model's tokenizer (``tokenizers.Tokenizer``), rebuilt from its GGUF."""
    return tokenizer_from_vocab(vocab_from_gguf(target))


def prepare_tokens(target: Path = TARGET) -> tuple[np.ndarray, np.ndarray, dict]:
    """(training stream, held-out stream, corpus record): the bundled model's split and tokenizer."""
    files = load_corpus()
    info = describe(files)
    train_files, held_files = split_corpus(files)
    tok = target_tokenizer(target)
    train = np.asarray(encode_files(tok, [f.text for f in train_files]), dtype=np.int32)
    held = np.asarray(encode_files(tok, [f.text for f in held_files]), dtype=np.int32)
    info.update({"train_tokens": int(len(train)), "heldout_tokens": int(len(held))})
    return train, held, info


def next_token_ce(model, x: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))


def continuation_ce(model, x: torch.Tensor, start: int) -> torch.Tensor:
    """Cross-entropy of the new tokens of continuation rows ``x`` (from column ``start``: the target's greedy
    choices), each predicted from the row before it."""
    logits = model(input_ids=x).logits[:, start - 1 : -1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, start:].reshape(-1))


def continuation_rows(path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(trained rows, held-out rows, the column the new tokens start at) of a continuations file."""
    data = np.load(path)
    rows, start = data["rows"].astype(np.int64), int(data["start"])
    if len(rows) <= CONTINUATION_HELDOUT:
        raise SystemExit(f"{path}: {len(rows)} continuations, more than {CONTINUATION_HELDOUT} needed")
    return rows[:-CONTINUATION_HELDOUT], rows[-CONTINUATION_HELDOUT:], start


def continuations_at(rows: np.ndarray, step: int, seed: int) -> torch.Tensor:
    """Step ``step``'s continuations (``CONTINUATION_BATCH`` rows, drawn from ``default_rng([seed, step, 3])``)."""
    rng = np.random.default_rng([seed, step, 3])
    return torch.from_numpy(rows[rng.integers(0, len(rows), size=CONTINUATION_BATCH)])


@torch.no_grad()
def continuation_top1(model, rows: np.ndarray, start: int) -> float:
    """How often the draft's top-1 is the target's greedy token on held-out continuation rows (teacher forced)."""
    model.eval()
    x = torch.from_numpy(rows)
    logits = model(input_ids=x).logits[:, start - 1 : -1]
    agree = (logits.argmax(-1) == x[:, start:]).float().mean().item()
    model.train()
    return round(agree, 4)


@torch.no_grad()
def heldout_metrics(model, batches: list[torch.Tensor]) -> dict[str, float]:
    """Held-out next-token cross-entropy and top-1 accuracy (teacher forced)."""
    model.eval()
    ce = acc = 0.0
    for x in batches:
        logits = model(input_ids=x).logits[:, :-1].float()
        ce += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()
        acc += (logits.argmax(-1) == x[:, 1:]).float().mean().item()
    model.train()
    return {"heldout_ce": round(ce / len(batches), 4), "heldout_top1": round(acc / len(batches), 4)}


def train(
    out: Path,
    *,
    steps: int | None,
    max_minutes: float | None,
    fresh: bool,
    threads: int,
    checkpoint_minutes: float = 5.0,
    lr: float | None = None,
    init: Path | None = None,
    continuations: Path | None = None,
) -> bool:
    """Train (or resume) into ``out/checkpoints-draft/last.pt``; True when the run has reached its last step. A new
    run starts from ``init``'s weights where given (a draft GGUF), and trains on a target's ``continuations`` beside
    the corpus where given (see the module docstring)."""
    torch.set_num_threads(threads)
    cfg = draft_train_config()
    if steps is not None:
        cfg.steps = steps
    if lr is not None:
        cfg.lr = lr
    ck_path = out / CHECKPOINT_DIR / "last.pt"
    if fresh:
        ck_path.unlink(missing_ok=True)
    ck = torch.load(ck_path, map_location="cpu", weights_only=False) if ck_path.exists() else None
    log = JsonLog(out / "logs" / LOG_NAME, append=ck is not None)
    train_tokens, held_tokens, info = prepare_tokens()
    cont = held_cont = None
    if continuations is not None:
        cont, held_cont, start = continuation_rows(continuations)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    if init is not None and ck is None:
        model.load_state_dict(model_from_gguf(init).state_dict())
        model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=1e-8,
    )
    step, elapsed_before = 0, 0.0
    if ck is not None:
        if ck["model_config"] != cfg.model.to_dict():
            raise SystemExit(f"{ck_path} has another model config; use --fresh")
        cfg.steps = ck["train_config"]["steps"] if steps is None else cfg.steps
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        step, elapsed_before = ck["step"], ck["elapsed_seconds"]
        log({"event": "resumed", "step": step, "elapsed_seconds": round(elapsed_before, 1)})
    else:
        log(
            {
                "event": "start",
                "train_config": asdict(cfg),
                "corpus": info,
                "params": n_params(model),
                "tokenizer": str(TARGET.relative_to(ROOT)),
                "torch": torch.__version__,
                "threads": threads,
                "init": None if init is None else str(init),
                "continuations": None if cont is None else {"path": str(continuations), "rows": len(cont)},
            }
        )
    held = heldout_batches(held_tokens, cfg)

    def metrics() -> dict:
        found = heldout_metrics(model, held)
        if held_cont is not None:
            found["continuation_top1"] = continuation_top1(model, held_cont, start)
        return found

    if ck is None:
        log({"step": 0, "eval": metrics()})
    t0 = t_ck = t_log = time.time()
    n_tok = 0
    model.train()
    while step < cfg.steps:
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_at(train_tokens, step, cfg)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
            loss = next_token_ce(model, x)
            if cont is not None:
                loss_c = continuation_ce(model, continuations_at(cont, step, cfg.seed), start)
                loss = (loss + CONTINUATION_WEIGHT * loss_c) / (1 + CONTINUATION_WEIGHT)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        n_tok += x.numel()
        now = time.time()
        if step % cfg.log_every == 0 or step == cfg.steps:
            log(
                {
                    "step": step,
                    "ce": round(loss.item(), 4),
                    "lr": round(lr, 6),
                    "grad_norm": round(float(gnorm), 3),
                    "tok_per_s": round(n_tok / max(1e-9, now - t_log)),
                    "elapsed_seconds": round(elapsed_before + now - t0, 1),
                }
            )
            t_log, n_tok = now, 0
        if step % cfg.eval_every == 0 or step == cfg.steps:
            log({"step": step, "eval": metrics()})
        paused = max_minutes is not None and (now - t0) / 60 >= max_minutes and step < cfg.steps
        if step == cfg.steps or paused or (now - t_ck) / 60 >= checkpoint_minutes:
            save_checkpoint(ck_path, model, opt, step, cfg, elapsed_before + time.time() - t0, info)
            t_ck = time.time()
        if paused:
            log({"event": "paused", "step": step, "reason": "max-minutes"})
            return False
    log({"event": "finished", "step": step, "elapsed_seconds": round(elapsed_before + time.time() - t0, 1)})
    return True


def write_hf_checkpoint(model, hf_dir: Path, target: Path = TARGET) -> Path:
    """``model`` as a Hugging Face checkpoint with the target's tokenizer files."""
    from mtp_explorer.devtools.hf_export import tokenizer_files
    from mtp_explorer.models.gguf_qwen35 import read_qwen35_metadata

    vocab = vocab_from_gguf(target)
    meta = read_qwen35_metadata(target)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    tokenizer, tok_config = tokenizer_files(
        vocab.tokens,
        vocab.token_types,
        vocab.merges,
        pre=vocab.pre,
        eos_id=vocab.eos_id,
        bos_id=None if bos is None else int(bos),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        n_ctx=model.config.max_position_embeddings,
    )
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(hf_dir)
    for name, obj in (("tokenizer.json", tokenizer), ("tokenizer_config.json", tok_config)):
        (hf_dir / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return hf_dir


def export(checkpoint: Path, out_gguf: Path, hf_dir: Path) -> Path:
    """Checkpoint -> Hugging Face checkpoint -> llama.cpp's converter -> ``out_gguf`` (F16), checked compatible."""
    import importlib.util

    from mtp_explorer.devtools.hf_export import convert_with_llama_cpp

    if importlib.util.find_spec("sentencepiece") is None:  # imported by the converter's Qwen3 set_vocab
        raise SystemExit(
            "llama.cpp's convert_hf_to_gguf.py needs sentencepiece for a Qwen3 checkpoint: pip install sentencepiece"
        )
    ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model = build_model(DraftConfig(**ck["model_config"]))
    model.load_state_dict(ck["model"])
    write_hf_checkpoint(model.eval(), hf_dir)
    elapsed = ck["elapsed_seconds"] / 60
    # the converter's --metadata override (gguf-py's Metadata.load) names general.* keys in full; the licence
    # has no override key and is read from the checkpoint's model card front matter instead
    meta = {
        "general.name": DRAFT_NAME,
        "general.description": (
            f"mtp-explorer draft model for draft-simple speculative decoding with pystdlib-qwen35-mtp: a "
            f"{n_params(model) / 1e6:.2f} M-parameter qwen3 trained {ck['step']} steps ({elapsed:.0f} min) on the "
            f"Python standard library with the bundled model's tokenizer"
        ),
    }
    meta_path = hf_dir / "gguf-metadata.json"
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (hf_dir / "README.md").write_text(
        f'---\nlicense: "{LICENSE}"\n---\n\n# {DRAFT_NAME}\n\nSee mtp_explorer/models/MODEL.md.\n', encoding="utf-8"
    )
    convert_with_llama_cpp(hf_dir, out_gguf, outtype="f16", extra_args=["--metadata", str(meta_path)])
    problems = compatibility_problems(TARGET, out_gguf)
    if problems:
        raise RuntimeError(f"{out_gguf} is not a compatible draft for {TARGET.name}:\n" + "\n".join(problems))
    return out_gguf


def compatibility_problems(target: Path, draft: Path) -> list[str]:
    """Why llama.cpp's ``common_speculative_are_compatible`` would refuse ``draft`` for ``target`` (empty: it
    accepts), asked of llama.cpp itself through llama-cpp-python (both loaded vocabulary-only)."""
    import llama_cpp as lc

    from training.llama_ref import _backend_init

    _backend_init()  # quiet llama.cpp's log
    models, vocabs = [], []
    try:
        for path in (target, draft):
            params = lc.llama_model_default_params()
            params.vocab_only = True
            m = lc.llama_model_load_from_file(str(path).encode(), params)
            if not m:
                return [f"llama.cpp cannot load {path}"]
            models.append(m)
            vocabs.append(lc.llama_model_get_vocab(m))
        vt, vd = vocabs
        problems = []
        if lc.llama_vocab_type(vt) != lc.llama_vocab_type(vd):
            problems.append(f"vocab type {lc.llama_vocab_type(vd)} != {lc.llama_vocab_type(vt)}")
        for what, add, tok in (
            ("bos", lc.llama_vocab_get_add_bos, lc.llama_vocab_bos),
            ("eos", lc.llama_vocab_get_add_eos, lc.llama_vocab_eos),
        ):
            if add(vt) != add(vd) or (add(vt) and tok(vt) != tok(vd)):
                problems.append(f"{what}: add {add(vd)} id {tok(vd)} != add {add(vt)} id {tok(vt)}")
        nt, nd = lc.llama_vocab_n_tokens(vt), lc.llama_vocab_n_tokens(vd)
        if abs(nt - nd) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
            problems.append(f"vocabulary sizes {nd} and {nt} differ by more than {SPEC_VOCAB_MAX_SIZE_DIFFERENCE}")
        for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(nt, nd)):
            if lc.llama_vocab_get_text(vt, i) != lc.llama_vocab_get_text(vd, i):
                problems.append(f"token {i}: {lc.llama_vocab_get_text(vd, i)!r} != {lc.llama_vocab_get_text(vt, i)!r}")
                break
        return problems
    finally:
        for m in models:
            lc.llama_model_free(m)


def model_from_gguf(path: str | Path = DEFAULT_GGUF):
    """The PyTorch ``Qwen3ForCausalLM`` with the weights of a ``qwen3`` GGUF written by :func:`export`
    (F16 widened to F32 exactly), in eval mode: the inverse of llama.cpp's Qwen3 conversion (no transforms,
    only names; the LM head is tied to ``token_embd``)."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(key: str):
        return reader.fields[key].contents()

    if field("general.architecture") != "qwen3":
        raise ValueError(f"{path}: not a qwen3 file")
    n_head = int(field("qwen3.attention.head_count"))
    mc = DraftConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=int(field("qwen3.embedding_length")),
        intermediate_size=int(field("qwen3.feed_forward_length")),
        num_hidden_layers=int(field("qwen3.block_count")),
        num_attention_heads=n_head,
        num_key_value_heads=int(field("qwen3.attention.head_count_kv")),
        head_dim=int(field("qwen3.attention.key_length")),
        rope_theta=float(field("qwen3.rope.freq_base")),
        rms_norm_eps=float(field("qwen3.attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(field("qwen3.context_length")),
        eos_token_id=int(field("tokenizer.ggml.eos_token_id")),
    )
    names = {
        "token_embd": "model.embed_tokens",
        "output_norm": "model.norm",
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    sd = {}
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] == "output":
            raise ValueError(f"{path}: an untied output tensor; the draft model ties its LM head to token_embd")
        if parts[0] == "blk":
            key = f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
        else:
            key = f"{names[parts[0]]}.{parts[1]}"
        shape = [int(s) for s in reversed(t.shape)]
        sd[key] = torch.from_numpy(np.asarray(t.data, dtype=np.float32).reshape(shape).copy())
    model = build_model(mc)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"{path}: tensors do not match Qwen3ForCausalLM: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.eval()


def reference_binary() -> Path:
    """llama.cpp's ``llama-speculative-simple`` (``make reference``), or ``$LLAMA_SPECULATIVE_SIMPLE``."""
    return Path(os.environ.get("LLAMA_SPECULATIVE_SIMPLE") or REFERENCE)


def greedy_pieces(m, prompt: str, n: int) -> str:
    """The target's plain greedy continuation (no drafting), as llama-speculative-simple prints it."""
    return b"".join(m.piece(t) for t in m.greedy(m.tokenize(prompt), n)).decode("utf-8", errors="replace")


_PARTIAL = re.compile(r"partial acceptance: (\d+) < (\d+), restoring checkpoint")
_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


@dataclass
class DraftRounds:
    """The draft rounds of one llama-speculative-simple run, read from its debug log (``-lv 5``)."""

    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    partial: int = 0  #: rounds with a partial acceptance
    reported_drafted: int = 0
    reported_accepted: int = 0
    generated: int = 0
    text: str = ""
    by_depth: list[int] = field(default_factory=list)  #: rounds whose draft j+1 was accepted
    drafted_at: list[int] = field(default_factory=list)  #: rounds that had a draft j+1

    def add_round(self, a: int, n: int) -> None:
        """A round that drafted ``n`` tokens and had ``a`` accepted."""
        self.drafted, self.accepted, self.rounds = self.drafted + n, self.accepted + a, self.rounds + 1
        while len(self.by_depth) < n:
            self.by_depth.append(0)
            self.drafted_at.append(0)
        for j in range(n):
            self.drafted_at[j] += 1
            self.by_depth[j] += j < a


def draft_rounds(log: str) -> DraftRounds:
    """Count the drafts as the target first verified them.

    With a target whose memory cannot drop the tail of a sequence (``qwen35``'s recurrent state),
    llama-speculative-simple keeps a checkpoint: on a partial acceptance it logs ``partial acceptance: A < N``,
    restores the checkpoint and verifies the ``A`` accepted tokens plus the target's correction again as the next
    "draft", which is then accepted whole and is the only round its ``n_drafted`` / ``n_accept`` totals count
    (``accept`` is therefore always 100% there).  Here a partial round counts ``N`` drafted and ``A`` accepted,
    the re-verification after it nothing, and every other ``accepted X/Y`` round ``Y`` drafted and ``X`` accepted."""
    r = DraftRounds()
    redo = False
    for line in log.splitlines():
        if m := _PARTIAL.search(line):
            r.add_round(int(m.group(1)), int(m.group(2)))
            r.partial += 1
            redo = True
        elif m := _ACCEPTED.search(line):
            if not redo and int(m.group(2)):
                r.add_round(int(m.group(1)), int(m.group(2)))
            redo = False
    return r


def run_reference_rounds(
    target: Path,
    prompt: str,
    spec_args: list[str],
    parse,
    *,
    max_tokens: int = 64,
    threads: int = 1,
    attempts: int = 8,
    binary: Path | None = None,
):
    """One greedy ``llama-speculative-simple`` run of ``target`` with ``spec_args`` (``-md``, ``--spec-type``, ...)
    and its debug log read by ``parse`` (a rounds record with ``reported_*``, ``generated`` and ``text`` fields,
    filled here from the binary's own summary); ``None`` when the log lost its tail ``attempts`` times (it writes
    ~160 kB of debug log per run from a worker thread that the process does not wait for at exit)."""
    from mtp_explorer.core.errors import ToolError
    from mtp_explorer.devtools.reference import parse_reference_output

    cmd = [
        str(binary or reference_binary()),
        "-m",
        str(target),
        *spec_args,
        "-p",
        prompt,
        "-n",
        str(max_tokens),
        "-c",
        "1024",
        "-t",
        str(threads),
        "--temp",
        "0",
        "--seed",
        "0",
        "-lv",
        "5",
    ]
    # the log thread sometimes loses the tail at exit, more often into pipes than files (see run_reference_spec)
    for _ in range(attempts):
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            with out.open("wb") as fo, err.open("wb") as fe:
                rc = subprocess.run(cmd, stdout=fo, stderr=fe, timeout=300).returncode
            stdout, stderr = (f.read_text(encoding="utf-8", errors="replace") for f in (out, err))
        if rc != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({rc}):\n{stderr[-3000:]}")
        try:
            ref = parse_reference_output(stdout, stderr, prompt)
        except ToolError:  # an incomplete log: run again
            continue
        r = parse(stderr)
        r.reported_drafted, r.reported_accepted, r.generated, r.text = (
            ref.n_drafted,
            ref.n_accept,
            ref.n_predict,
            ref.text,
        )
        return r
    return None


def run_draft_simple(
    draft: Path, target: Path, prompt: str, n_max: int, *, max_tokens: int = 64, threads: int = 1, attempts: int = 8
) -> DraftRounds | None:
    """One greedy ``llama-speculative-simple -md DRAFT --spec-type draft-simple`` run with its debug log
    (:func:`run_reference_rounds`)."""
    return run_reference_rounds(
        target,
        prompt,
        ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(n_max)],
        draft_rounds,
        max_tokens=max_tokens,
        threads=threads,
        attempts=attempts,
    )


class DraftGreedy:
    """The draft GGUF's greedy continuations through llama-cpp-python (for :func:`simulate_draft_simple`)."""

    def __init__(self, path: Path, n_ctx: int = 1024, threads: int = 1) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads, logits_all=True, verbose=False
        )

    def __call__(self, context: list[int], k: int) -> list[int]:
        self.llm.reset()
        self.llm.eval(context)
        out: list[int] = []
        for _ in range(k):
            out.append(int(np.argmax(self.llm.scores[self.llm.n_tokens - 1])))
            self.llm.eval(out[-1:])
        return out

    def close(self) -> None:
        self.llm.close()


def simulate_draft_simple(
    draft_greedy, prompt: list[int], plain: list[int], n_max: int, max_tokens: int, eos: int | None = None
) -> DraftRounds:
    """What llama-speculative-simple does with a greedy target whose greedy continuation of ``prompt`` is ``plain``
    and a greedy draft (``draft_greedy(context, k)``), computed without it: each round drafts
    ``min(n_max, max_tokens - generated - 1)`` tokens (``n_max`` when that is not positive, as draft-simple reads a
    cap of 0 as none), the target accepts the longest agreeing prefix ``A`` and commits ``A + 1`` tokens, or
    ``A + 2`` after a partial acceptance (the checkpoint's re-verification samples one more); it stops after
    ``max_tokens`` or at EOS.  ``plain`` must be long enough (``max_tokens + 2 * n_max``)."""
    r = DraftRounds()
    gen = 0
    while gen <= max_tokens and not (eos is not None and eos in plain[:gen]):
        k = min(n_max, max_tokens - gen - 1)
        k = k if k > 0 else n_max
        d = draft_greedy(prompt + plain[:gen], k)
        a = 0
        while a < k and gen + a < len(plain) and d[a] == plain[gen + a]:
            a += 1
        r.drafted, r.accepted, r.rounds = r.drafted + k, r.accepted + a, r.rounds + 1
        gen += k + 1 if a == k else a + 2
    r.generated = gen
    return r


def measure(
    draft: Path = DEFAULT_GGUF,
    target: Path = TARGET,
    *,
    n_prompts: int = 50,
    n_maxes=(1, 2, 3, 4),
    max_tokens: int = 64,
    threads: int = 1,
) -> dict:
    """Acceptance of ``draft`` (``--spec-type draft-simple``) against ``target``, greedy, on
    :func:`training.evaluate.heldout_prompts` at each ``--spec-draft-n-max``: counted from the reference binary's
    debug log (:func:`draft_rounds`) over the prompts whose runs all printed a complete log, and, for all prompts,
    by :func:`simulate_draft_simple` (which must agree with the binary run by run).  Each binary run's text is
    compared with the target's greedy continuation without drafting (llama-cpp-python)."""
    from training.evaluate import heldout_prompts
    from training.llama_ref import LlamaMTP

    prompts = heldout_prompts(n_prompts)
    t0 = time.time()
    with LlamaMTP(target, n_ctx=1024, n_threads=threads) as m:
        ids = [m.tokenize(p) for p in prompts]
        plain = [m.greedy(x, max_tokens + 2 * max(n_maxes) + 2) for x in ids]
        plain_text = [greedy_pieces(m, p, max_tokens + 8) for p in prompts]
        eos = int(m.tokenize("<|endoftext|>", parse_special=True)[0])
    dg = DraftGreedy(draft, threads=threads)
    keys = ("drafted", "accepted", "rounds", "reported_drafted", "reported_accepted", "generated")
    binary = {n: DraftRounds() for n in n_maxes}
    sim = {n: DraftRounds() for n in n_maxes}
    complete = equal = mismatches = 0
    try:
        for i, prompt in enumerate(prompts):
            runs = {
                n: run_draft_simple(draft, target, prompt, n, max_tokens=max_tokens, threads=threads) for n in n_maxes
            }
            sims = {n: simulate_draft_simple(dg, ids[i], plain[i], n, max_tokens, eos) for n in n_maxes}
            for n in n_maxes:
                for k in ("drafted", "accepted", "rounds", "generated"):
                    setattr(sim[n], k, getattr(sim[n], k) + getattr(sims[n], k))
            if any(r is None for r in runs.values()):
                continue
            complete += 1
            for n, r in runs.items():
                for k in keys:
                    setattr(binary[n], k, getattr(binary[n], k) + getattr(r, k))
                equal += plain_text[i].startswith(r.text)
                mismatches += (r.drafted, r.accepted, r.rounds) != (sims[n].drafted, sims[n].accepted, sims[n].rounds)
    finally:
        dg.close()

    def row(n: int, t: DraftRounds) -> dict:
        return {
            "n_max": n,
            "drafted": t.drafted,
            "accepted": t.accepted,
            "rounds": t.rounds,
            "acceptance": round(t.accepted / max(1, t.drafted), 4),
            "accepted_per_round": round(t.accepted / max(1, t.rounds), 3),
            "generated": t.generated,
        }

    exe = reference_binary()
    return {
        "draft": draft.name,
        "target": target.name,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "prompts_with_complete_logs": complete,
        "texts_equal_to_plain_greedy": f"{equal}/{complete * len(n_maxes)}",
        "binary_vs_simulation_mismatches": mismatches,
        "binary": [
            dict(row(n, t), binary_totals={"n_drafted": t.reported_drafted, "n_accept": t.reported_accepted})
            for n, t in binary.items()
        ],
        "simulated_all_prompts": [row(n, t) for n, t in sim.items()],
        "command": (
            f"{exe.relative_to(ROOT) if exe.is_relative_to(ROOT) else exe} -m {target.name} "
            f"-md {draft.name} --spec-type draft-simple --spec-draft-n-max N -p PROMPT -n {max_tokens} "
            f"-c 1024 -t {threads} --temp 0 --seed 0 -lv 5"
        ),
        "seconds": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory holding checkpoints-draft/ and logs/")
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="where to write the draft GGUF")
    p.add_argument("--max-minutes", type=float, default=None, help="stop after this much wall time (checkpointed)")
    p.add_argument("--steps", type=int, default=None, help="override the number of optimiser steps")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint and start over")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the draft config's)")
    p.add_argument("--init", type=Path, default=None, help="a draft GGUF whose weights a new run starts from")
    p.add_argument(
        "--continuations",
        type=Path,
        default=None,
        help="the target's own greedy continuations trained on with the corpus",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: see training/README.md)")
    p.add_argument("--export", action="store_true", help="only export the checkpoint (no training)")
    p.add_argument(
        "--measure",
        action="store_true",
        help="only measure the GGUF's draft-simple acceptance with llama-speculative-simple (JSON)",
    )
    p.add_argument("--prompts", type=int, default=50, help="held-out prompts for --measure")
    p.add_argument("--target", type=Path, default=TARGET, help="the target model of --measure (default: the bundled)")
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.gguf, args.target, n_prompts=args.prompts), indent=2))
        return 0
    torch.set_flush_denormal(True)
    if not args.export:
        if not train(
            args.out,
            steps=args.steps,
            max_minutes=args.max_minutes,
            fresh=args.fresh,
            threads=args.threads,
            lr=args.lr,
            init=args.init,
            continuations=args.continuations,
        ):
            return 0
    ck = args.out / CHECKPOINT_DIR / "last.pt"
    if not ck.exists():
        print(f"no checkpoint at {ck}", file=sys.stderr)
        return 2
    out = export(ck, args.gguf, args.out / CHECKPOINT_DIR / "hf")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
