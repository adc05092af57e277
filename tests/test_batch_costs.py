"""The what-if for N sequences: the batch cost model, the schedule of simulated requests, the recommendation."""

from __future__ import annotations

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.analysis.batch import (
    BatchCostModel,
    StepShape,
    batch_shapes,
    predict_parallel,
    profile_batch_costs,
    recommend_parallel,
    step_features,
    ubatch_rows,
)

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

PROMPTS = [
    "class Stack:\n    def push(self, x):",
    "while True:\n",
    "It was a dark and stormy night;",
    "import numpy as np\n",
]


@pytest.fixture(scope="module")
def session(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=4096, threads=1, n_parallel=4, clock="cpu") as s:
        yield s


@pytest.fixture(scope="module")
def costs(session):
    return profile_batch_costs(session)


@pytest.fixture(scope="module")
def oracles(session):
    return [session.record_oracle(p, max_tokens=48, depth=4, probe=False) for p in PROMPTS]


def test_ubatches_follow_llamas_equal_split():
    assert ubatch_rows([1, 1, 1]) == [3]  # plain decoding: one row each, one ubatch
    assert ubatch_rows([4, 1]) == [2, 3]  # a row of each, then the 3 rows left of the first
    assert ubatch_rows([4, 2, 2, 1]) == [4, 3, 2]
    assert ubatch_rows([3]) == [3] and ubatch_rows([]) == []
    f = step_features(
        StepShape(rows=[4, 1], pos=[10, 20], drafting=[True, False], mtp=[True, False], draft_rows=[2, 1, 1])
    )
    assert (f["rows"], f["ubatch_single"], f["ubatch_multi"], f["catchup_rows"]) == (5, 0, 2, 4)
    assert (f["catchup_single"], f["catchup_multi"], f["decode_single"], f["decode_multi"], f["decode_rows"]) == (
        0,
        1,
        2,
        1,
        4,
    )
    assert f["attention"] == pytest.approx((4 * 10 + 1 * 20) / 1000)


def test_steps_of_a_run_are_read_back_with_their_times(session):
    result = session.generate_parallel(PROMPTS[:3], max_tokens=24, n_max=3)
    shapes = batch_shapes(result)
    steps = result.batch_steps()
    assert len(shapes) == len(steps)
    for (shape, times), (_, row) in zip(shapes, steps.iterrows()):
        assert sum(shape.rows) == row["verify_rows"] and len(shape.rows) == row["n_active"]
        assert times["verify"] == row["t_verify_ns"]
    assert shapes[0][0].fresh and not all(s.fresh for s, _ in shapes)


def test_profile_fits_every_phase_and_round_trips(costs, tmp_path):
    assert set(costs.coef) == set(mx.core.schema.PHASES)
    m = costs.measured
    assert m["steps"] > 100 and m["max_active"] == 4 and m["n_parallel"] == 4 and m["sizes"] == [1, 2, 4]
    assert BatchCostModel.load(costs.save(tmp_path / "batch.json")).coef == costs.coef
    (tmp_path / "other.json").write_text('{"format": "mtp-explorer-costs/1"}')
    with pytest.raises(mx.ParameterError, match="not a batch cost model"):
        BatchCostModel.load(tmp_path / "other.json")
    plain = costs.step_ns(StepShape(rows=[1], pos=[10], drafting=[False], mtp=[False], draft_rows=[], fresh=False))
    assert plain["draft"] == pytest.approx(0, abs=1e5) and plain["verify"] > 0


def test_the_schedule_is_the_engines(session, costs, oracles):
    """Predicted steps, admissions and finishes are exactly the engine's (the times are the model's)."""
    for kwargs in (
        {"n_parallel": 4, "n_max": 3},
        {"n_parallel": 2, "n_max": 2, "arrivals": [0, 0, 5, 1]},
        {"n_parallel": 4, "n_max": 3, "params": [{"n_max": 0}, None, {"p_min": 0.5}, {"max_tokens": 7}]},
    ):
        n = kwargs.pop("n_parallel")
        pred = predict_parallel(oracles, costs, n_parallel=n, max_tokens=48, **kwargs)
        with mx.Session.open(session.path, n_ctx=4096, threads=1, n_parallel=n) as s:
            real = s.generate_parallel(PROMPTS, max_tokens=48, **kwargs)
        assert pred["n_steps"] == len(real.batch_steps()), kwargs
        assert pred["n_tokens"] == real.summary()["n_tokens"]
        for p, r in zip(pred["requests"], real.requests):
            assert (p["admitted_step"], p["finished_step"]) == (r.admitted_step, r.finished_step), kwargs
        assert pred["mean_verify_rows"] == pytest.approx(real.summary()["mean_verify_rows"])


def test_the_prediction_prices_the_engines_own_steps(session, costs, oracles):
    """Predicted aggregate decode tokens/s against the real batch's own steps (their shapes read back by batch_shapes)
    priced by the same cost model, at N = 1, 2, 4 and n_max 0 and 3: equal, so a schedule or step shape unlike the
    engine's (rows, ubatches, draft decodes, graph reuse) shows at once. Both sides are priced by one model; no
    measured time is compared (how near the model comes to this machine's measured runs, which vary by a quarter to a
    half from one run to the next here, is benchmarks/parallel.py's)."""
    for n in (1, 2, 4):
        for k in (0, 3):
            pred = predict_parallel(oracles[:n], costs, n_parallel=n, n_max=k, max_tokens=48)
            real = session.generate_parallel(PROMPTS[:n], max_tokens=48, n_max=k)
            shapes = [shape for shape, _ in batch_shapes(real)]
            assert pred["n_steps"] == len(shapes) and pred["n_tokens"] == real.summary()["n_tokens"], (n, k)
            seconds = sum(sum(costs.step_ns(shape).values()) for shape in shapes) / 1e9
            assert pred["decode_tokens_per_second"] == pytest.approx(pred["n_tokens"] / seconds, rel=1e-9), (n, k)
            if n == 4 and k == 3:  # the steps batch several rows and sequences: a model of one row a step differs
                assert max(sum(shape.rows) for shape in shapes) > 4


def test_recommendation_per_batch_size(costs, oracles):
    df = recommend_parallel(oracles, costs, n_parallel=(1, 2, 4), n_max=(1, 2, 3), p_min=(0.0, 0.5))
    assert list(df["n_parallel"]) == [1, 2, 4]
    assert set(df["n_max"]) <= {1, 2, 3} and set(df["p_min"]) <= {0.0, 0.5}
    assert np.allclose(df["speedup"], df["goodput"] / df["plain_tokens_per_second"])
    for _, row in df.iterrows():  # the best setting: none of the grid predicts more
        for k in (1, 2, 3):
            batch = [oracles[j % len(oracles)] for j in range(int(row["n_parallel"]))]
            other = predict_parallel(batch, costs, n_parallel=int(row["n_parallel"]), n_max=k)
            assert other["decode_tokens_per_second"] <= row["goodput"] + 1e-6
    crossover = df.attrs["crossover"]
    assert crossover is None or crossover == int(df[df["speedup"] < 1]["n_parallel"].iloc[0])


def test_bad_input(costs, oracles):
    with pytest.raises(mx.ParameterError, match="one oracle per request"):
        predict_parallel(oracles, costs, n_parallel=2, n_max=3, arrivals=[0])
    with pytest.raises(mx.ParameterError, match="draft-simple"):
        predict_parallel(oracles, costs, n_parallel=2, n_max=3, drafter="draft-simple")
    with pytest.raises(mx.ParameterError, match="n_parallel"):
        predict_parallel(oracles, costs, n_parallel=0, n_max=3)
    with pytest.raises(mx.ParameterError, match="4 requests at once on n_parallel=2"):
        predict_parallel(oracles, costs, n_parallel=2, n_max=3)
