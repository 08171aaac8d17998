"""``fn.map`` and ``serverless_gpu.sweep``: one run per item, results in item order."""

from __future__ import annotations

import pytest

import serverless_gpu
from serverless_gpu import RunResult, distributed
from serverless_gpu.api.trials import trial_params


@pytest.fixture(autouse=True)
def two_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_CPU_SLOTS", "2")


@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120)
def trial(lr: float, layers: int = 1) -> float:
    if lr < 0:
        raise ValueError(f"negative learning rate {lr}")
    return lr * layers


def test_map_returns_handles_in_item_order() -> None:
    handles = trial.map([{"lr": 0.5, "layers": 2}, (0.25,), 1.0])
    assert [h.result(60)[0] for h in handles] == [1.0, 0.25, 1.0]
    assert handles[0].context.metadata["params"] == {"lr": "0.5", "layers": "2"}
    # Positional arguments by the function's own parameter names (the table's and MLflow's).
    assert handles[1].context.metadata["params"] == {"lr": "0.25"}


def test_trial_params_name_positional_arguments_by_the_signature() -> None:
    def fit(lr: float, layers: int = 1, *rest: int) -> None: ...

    assert trial_params((0.5, 2), {}, fit) == {"lr": "0.5", "layers": "2"}
    assert trial_params((0.5, 2, 7, 8), {}, fit) == {"lr": "0.5", "layers": "2", "rest": "(7, 8)"}
    # Arguments the signature does not take (the run will say so) and no function: arg0 ...
    assert trial_params((1, 2), {"x": 3}, lambda: None) == {"arg0": "1", "arg1": "2", "x": "3"}
    assert trial_params(("a",), {}) == {"arg0": "a"}


def test_sweep_with_a_failing_trial_returns_the_others_and_its_exception() -> None:
    items = [{"lr": 0.1}, {"lr": -1.0}, {"lr": 0.3, "layers": 3}]
    outcomes = serverless_gpu.sweep(trial, items, max_concurrent=2, timeout=120)
    assert isinstance(outcomes[0], RunResult) and outcomes[0] == [0.1]
    assert isinstance(outcomes[1], ValueError) and "negative learning rate" in str(outcomes[1])
    assert isinstance(outcomes[2], RunResult) and outcomes[2] == [pytest.approx(0.9)]


def test_sweep_timeout_cancels_what_is_left() -> None:
    @distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120)
    def slow(seconds: float) -> float:
        import time

        time.sleep(seconds)
        return seconds

    outcomes = serverless_gpu.sweep(slow, [60.0, 0.0], max_concurrent=1, timeout=5)
    assert isinstance(outcomes[0], serverless_gpu.CancelledError)
    assert isinstance(outcomes[1], serverless_gpu.WaitTimeoutError)
