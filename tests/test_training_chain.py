"""The chained-draft training pass equals llama.cpp's way of chaining the MTP block, row by row."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from training.model import DemoModel, ModelConfig  # noqa: E402

pytestmark = pytest.mark.train

TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    full_attention_interval=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=2,
    eos_token_id=63,
)


@pytest.fixture(scope="module")
def model() -> DemoModel:
    torch.manual_seed(0)
    m = DemoModel(ModelConfig(**TINY)).eval()
    with torch.no_grad():  # non-trivial norms, so a wrong row pairing shows
        for p in m.mtp.parameters():
            if p.ndim == 1:
                p.normal_(0, 0.3)
    return m


def _stepwise_chain(m: DemoModel, ids: torch.Tensor, h: torch.Tensor, q: int, depth: int) -> list[torch.Tensor]:
    """Chain ``q`` the way llama.cpp's MTP context sees it: real rows 0..q, then one appended row per depth."""
    e = m.trunk.model.embed_tokens(ids)
    h_prev = m.shift_hidden(h)
    toks, hs = [e[:, : q + 1]], [h_prev[:, : q + 1]]
    outs = []
    for d in range(1, depth + 1):
        te, th = torch.cat(toks, 1), torch.cat(hs, 1)
        pe = m.trunk.model.rotary_emb(te, m.positions(1, te.shape[1], ids.device))
        last = m.mtp(te, th, pe)[:, -1:]
        outs.append(last[0, 0])
        toks.append(e[:, q + d : q + d + 1])
        hs.append(last)
    return outs


def test_first_depth_equals_the_plain_mtp_pass(model):
    ids = torch.randint(0, 63, (2, 20))
    with torch.no_grad():
        h = model.trunk_hidden(ids)
        _, mtp_logits = model(ids)
        chain, _ = model.mtp_chain(ids, h, 1)
    torch.testing.assert_close(model.logits(chain[0]), mtp_logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("q", [1, 5, 12])
def test_each_depth_equals_the_stepwise_chain(model, q):
    ids = torch.randint(0, 63, (1, 18))
    depth = 4
    with torch.no_grad():
        h = model.trunk_hidden(ids)
        batched, starts = model.mtp_chain(ids, h, depth)
        picked, picked_starts = model.mtp_chain(ids, h, depth, starts=torch.tensor([q, 2]))
        stepwise = _stepwise_chain(model, ids, h, q, depth)
    assert starts.tolist() == list(range(1, 18 - depth))
    torch.testing.assert_close(batched[0][0, q], stepwise[0], rtol=1e-4, atol=1e-5)
    for d in range(1, depth):
        row = starts.tolist().index(q)
        torch.testing.assert_close(batched[d][0, row], stepwise[d], rtol=1e-4, atol=1e-5, msg=f"depth {d + 1}")
        torch.testing.assert_close(picked[d][0, 0], stepwise[d], rtol=1e-4, atol=1e-5, msg=f"depth {d + 1}")


def test_losses_pair_each_depth_with_its_token(model):
    """A depth-d loss is the CE of token q+d for the chain starting at q; distillation targets the trunk."""
    ids = torch.randint(0, 63, (2, 16))
    with torch.no_grad():
        _, losses, ces = model.losses(ids, depth=3)
        h = model.trunk_hidden(ids)
        chain, starts = model.mtp_chain(ids, h, 3)
        want1 = torch.nn.functional.cross_entropy(
            model.logits(chain[0][:, 1:15]).reshape(-1, 64), ids[:, 2:].reshape(-1)
        )
        torch.testing.assert_close(losses[0], want1)
        for d in (2, 3):
            logits = model.logits(chain[d - 1])
            want = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids[:, starts + d].reshape(-1))
            torch.testing.assert_close(losses[d - 1], want)
            torch.testing.assert_close(ces[d - 1], want)
        _, soft, hard = model.losses(ids, depth=3, distill=True)
        teacher = torch.softmax(model.logits(h)[:, starts + 1], -1)
        logp = torch.log_softmax(model.logits(chain[1]), -1)
        torch.testing.assert_close(soft[1], -(teacher * logp).sum(-1).mean())
        torch.testing.assert_close(torch.stack(hard), torch.stack(ces))
