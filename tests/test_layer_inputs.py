"""Session.layer_inputs: the hidden state entering each trunk layer, as llama.cpp hands it to draft-eagle3 and
draft-dflash (llama_get_embeddings_layer_inp), through the engine's one feature extraction (FeatureNeeds.layer_inp).

Layer 0's input is the token embedding row, exactly; every layer's input is the PyTorch model's
``hidden_states[il]`` (the bundled model's weights, F16 in the file, widened exactly) within the F16 KV cache's
rounding. An architecture whose llama.cpp graph does not mark its layer inputs (glm4moe) is refused with a
ParameterError where llama.cpp would abort the process."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

import mtp_explorer as mx
from mtp_explorer.core.probes import LAYER_INPUT_ARCHS
from training.export import model_from_gguf

pytestmark = pytest.mark.train

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


@pytest.fixture(scope="module")
def session(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=1024, threads=2) as s:
        yield s


def _token_embd(path) -> np.ndarray:
    reader = gguf.GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return np.asarray(t.data, dtype=np.float32).reshape(-1, int(t.shape[0]))


def test_layer_zero_is_the_token_embedding(session, bundled_model):
    tokens = session.tokenize(PROMPT)
    rows = session.layer_inputs(PROMPT, [0, 2])
    assert rows.shape == (len(tokens), 2, mx.model_info(bundled_model).n_embd) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows[:, 0], _token_embd(bundled_model)[tokens])
    assert not np.allclose(rows[:, 1], rows[:, 0])  # two layers on, the residual stream has moved


def test_every_layer_input_is_the_pytorch_models(session, bundled_model):
    n_layer = mx.model_info(bundled_model).n_layer
    tokens = session.tokenize(PROMPT)
    ours = session.layer_inputs(tokens, list(range(n_layer)))
    torch.set_num_threads(2)
    model = model_from_gguf(bundled_model)
    with torch.no_grad():
        hs = model.trunk.model(input_ids=torch.tensor([tokens]), use_cache=False, output_hidden_states=True)
    for il in range(n_layer):
        ref = hs.hidden_states[il][0].numpy()
        scale = float(np.abs(ref).max())
        assert float(np.abs(ours[:, il] - ref).max()) <= 1e-2 * scale, il
    # the order of the layers asked for is the order of the rows; a second call gives the same rows
    again = session.layer_inputs(tokens, [3, 1])
    np.testing.assert_array_equal(again[:, 0], ours[:, 3])
    np.testing.assert_array_equal(again[:, 1], ours[:, 1])


def test_generation_after_layer_inputs_is_unchanged(session):
    before = session.generate(PROMPT, max_tokens=24, n_max=3)
    session.layer_inputs(PROMPT, [1])
    after = session.generate(PROMPT, max_tokens=24, n_max=3)
    assert after.tokens == before.tokens and after.n_accepted.tolist() == before.n_accepted.tolist()


def test_bad_layers_are_parameter_errors(session, bundled_model):
    n_layer = mx.model_info(bundled_model).n_layer
    for bad in ([n_layer], [-1], [], [1, 1]):  # n_layer is llama.cpp's nextn row, not a layer input
        with pytest.raises(mx.ParameterError):
            session.layer_inputs(PROMPT, bad)
    with pytest.raises(mx.InputTypeError):
        session.layer_inputs(PROMPT, "12")
    assert session.generate(PROMPT, max_tokens=4, n_max=1).tokens  # the session still works


def test_an_architecture_without_layer_inputs_is_refused_not_aborted(model_synthetic_draft):
    assert "qwen35" in LAYER_INPUT_ARCHS and "glm4moe" not in LAYER_INPUT_ARCHS
    with mx.Session.open(model_synthetic_draft, n_ctx=512, threads=1) as s:
        assert mx.model_info(model_synthetic_draft).arch == "glm4moe"
        with pytest.raises(mx.ParameterError, match="glm4moe graph does not give its layers' inputs"):
            s.layer_inputs("def f(x):", [0])
        assert s.generate("def f(x):", max_tokens=4, n_max=0).tokens
