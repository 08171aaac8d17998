"""max_retries: a crashed attempt is started again and resumes from the latest checkpoint; an
exception of the user's code is not retried."""

from __future__ import annotations

from pathlib import Path

import pytest
from recovery_fns import crash_once_after_step_5, value_error

from serverless_gpu import ConfigurationError, RankFailedError, distributed
from serverless_gpu import DistributedConfig as distributed_config
from serverless_gpu.retries import retryable

pytestmark = pytest.mark.timeout(240)


def test_a_crash_is_retried_from_the_latest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fn = distributed(gpus=2, max_retries=2, tracking=False)(crash_once_after_step_5)
    result = fn.distributed(str(tmp_path / "ckpt"))
    assert list(result) == [{"attempt": 1, "start": 5, "step": 8}] * 2
    err = capsys.readouterr().err
    assert "attempt 0 failed (RankFailedError: rank 1 exited with code 1)" in err, err
    assert "starting attempt 1 of 2" in err


def test_a_plain_exception_is_not_retried(tmp_path: Path) -> None:
    fn = distributed(gpus=2, max_retries=2, tracking=False)(value_error)
    with pytest.raises(ValueError, match="bad labels"):
        fn.distributed(str(tmp_path))
    assert {p.name.split("_")[1] for p in tmp_path.iterdir()} == {"0"}  # one attempt only


def test_retry_on_retries_the_named_exception_and_lists_every_attempt(tmp_path: Path) -> None:
    fn = distributed(gpus=2, max_retries=1, retry_on=(ValueError,), tracking=False)(value_error)
    with pytest.raises(ValueError) as info:
        fn.distributed(str(tmp_path))
    assert {p.name.split("_")[1] for p in tmp_path.iterdir()} == {"0", "1"}
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "the call was attempted 2 times:" in notes
    assert "attempt 0: ValueError: bad labels (run directory: " in notes
    assert "attempt 1: ValueError: bad labels" in notes


def test_what_is_retried() -> None:
    from serverless_gpu.errors import RankFailure

    crash = RankFailedError(RankFailure(1, 0.0, 1, None, "exited with code 1"))
    assert retryable(crash)
    assert retryable(RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert not retryable(ValueError("x"))
    assert not retryable(RuntimeError("shapes do not match"))
    assert retryable(KeyError("k"), (KeyError,))
    assert retryable(KeyError("k"), (LookupError,))
    assert distributed_config(retry_on=(KeyError,)).retry_on == ("builtins.KeyError",)
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigurationError, match="max_retries"):
            distributed(max_retries=bad)
    with pytest.raises(ConfigurationError, match="retry_on"):
        distributed(retry_on=ValueError)
