"""What a rank's failure looks like in the caller: worded once, never lost to a broken stdout, a
bad ``__str__`` or a logging failure, always a ``DistributedError`` or the rank's own exception,
with the user's frames and source lines and none of ours."""

from __future__ import annotations

import errno
import os
import textwrap
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from procs import run_script

from serverless_gpu import DistributedError, RankFailedError, distributed, runtime
from serverless_gpu.common.errors import RemoteError, RemoteTraceback, SerializationError

"""The checkout under test, also for the scripts these tests start."""


def test_unpicklable_result_is_worded_once(capsys: pytest.CaptureFixture[str]) -> None:
    @distributed(gpus=2, tracking=False)
    def lock() -> object:
        return threading.Lock() if runtime.get_global_rank() == 1 else None

    with pytest.raises(SerializationError) as info:
        lock.distributed()
    out = capsys.readouterr().out
    assert "rank 1 returned a _thread.lock that cannot be pickled" in out
    assert "raised rank" not in out
    assert str(info.value).count("rank 1") == 1


def test_error_survives_closed_stdout_and_stderr() -> None:
    @distributed(gpus=2, tracking=False)
    def closes() -> int:
        if runtime.get_global_rank() == 0:
            os.close(1)
            os.close(2)
            raise ValueError("raised after closing stdout and stderr")
        time.sleep(30)
        return 1

    with pytest.raises(ValueError, match="raised after closing stdout and stderr") as info:
        closes.distributed()
    assert info.value.serverless_gpu_rank == 0  # type: ignore[attr-defined]


def test_result_survives_closed_stdout_and_stderr() -> None:
    @distributed(gpus=2, tracking=False)
    def closes() -> int:
        os.close(1)
        os.close(2)
        return runtime.get_global_rank()

    assert closes.distributed() == [0, 1]


def _failing_exit_callback() -> None:
    raise RuntimeError("an exit callback failed")


def test_result_survives_a_failing_exit_callback_with_stderr_closed() -> None:
    @distributed(gpus=2, tracking=False)
    def closes() -> int:
        runtime.on_rank_exit(_failing_exit_callback)
        os.close(2)
        return runtime.get_global_rank()

    assert closes.distributed() == [0, 1]


# A standby rank that formed a gloo group ahead of the call (the module's launcher keeps them)
# can die of SIGABRT in gloo's loop thread once its descriptors are closed: these run as the
# first call of a launcher of their own, as before the launcher was shared.
@pytest.mark.fresh_launcher
def test_error_survives_closing_every_inherited_descriptor() -> None:
    """The rank's connection to the launcher dies too; the error record in the run directory
    still carries the exception."""

    @distributed(gpus=2, tracking=False)
    def closes() -> int:
        if runtime.get_global_rank() == 0:
            os.closerange(3, 4096)
            raise ValueError("raised after closing every descriptor")
        time.sleep(30)
        return 1

    with pytest.raises(ValueError, match="raised after closing every descriptor"):
        closes.distributed()


# A standby rank that formed a gloo group ahead of the call (the module's launcher keeps them)
# can die of SIGABRT in gloo's loop thread once its descriptors are closed: these run as the
# first call of a launcher of their own, as before the launcher was shared.
@pytest.mark.fresh_launcher
def test_return_after_closing_every_inherited_descriptor_is_explained() -> None:
    @distributed(gpus=2, tracking=False)
    def closes() -> int:
        if runtime.get_global_rank() == 0:
            os.closerange(3, 4096)
        return 1

    with pytest.raises(RankFailedError, match="connection to the launcher") as info:
        closes.distributed()
    assert info.value.rank == 0


@pytest.mark.fresh_launcher
def test_a_bad_descriptor_after_closing_every_inherited_descriptor_is_explained(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The function closed the rank's connection, then sent on it: its OSError keeps its type,
    and says what closed the descriptor and what to do."""

    @distributed(gpus=2, tracking=False)
    def closes_then_sends() -> int:
        if runtime.get_global_rank() == 1:
            os.closerange(3, 4096)
            runtime.send_to_caller("progress", 1)
        return 1

    with pytest.raises(OSError, match="Bad file descriptor") as info:
        closes_then_sends.distributed()
    assert info.value.errno == errno.EBADF
    said = "the function closed file descriptors it did not open"
    assert any(said in note for note in getattr(info.value, "__notes__", [said]))
    out = capsys.readouterr().out
    assert f"rank 1 raised OSError: [Errno 9] Bad file descriptor ({said}" in out


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


def test_exception_whose_str_raises_arrives_with_its_type() -> None:
    @distributed(gpus=2, tracking=False)
    def boom() -> None:
        raise BrokenStr("x")

    with pytest.raises(BrokenStr) as info:
        boom.distributed()
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "BrokenStr: <exception str() failed>" in cause.traceback_text


def _call_surely(fn: Any) -> BaseException:
    """Run a call and return what it raised; a bare KeyboardInterrupt or SystemExit must not
    end the test session."""
    try:
        fn.distributed()
    except BaseException as exc:  # KeyboardInterrupt/SystemExit are the subject
        return exc
    pytest.fail("the call did not raise")


def test_keyboard_interrupt_in_a_rank_is_not_the_callers() -> None:
    @distributed(gpus=2, tracking=False)
    def interrupted() -> None:
        if runtime.get_global_rank() == 1:
            raise KeyboardInterrupt
        time.sleep(30)

    exc = _call_surely(interrupted)
    assert isinstance(exc, RemoteError), f"got {type(exc).__name__}: {exc}"
    assert "rank 1 raised KeyboardInterrupt" in str(exc)


def _exit_on_load() -> None:
    raise SystemExit(3)


def _interrupt_on_load() -> None:
    raise KeyboardInterrupt


class ExitsOnLoad:
    def __reduce__(self) -> Any:
        return (_exit_on_load, ())


class InterruptsOnLoad:
    def __reduce__(self) -> Any:
        return (_interrupt_on_load, ())


@pytest.mark.parametrize(
    ("result_type", "raised"),
    [(ExitsOnLoad, "SystemExit"), (InterruptsOnLoad, "KeyboardInterrupt")],
)
def test_result_whose_unpickling_exits_is_wrapped(result_type: type, raised: str) -> None:
    @distributed(gpus=2, tracking=False)
    def returns() -> object:
        return result_type()

    exc = _call_surely(returns)
    assert isinstance(exc, SerializationError), f"got {type(exc).__name__}: {exc}"
    assert raised in str(exc) and "rank 0" in str(exc)


def raises_here() -> None:
    raise ValueError("from a helper in the test module")


def test_rank_traceback_shows_user_frames_and_source_not_ours() -> None:
    @distributed(gpus=2, tracking=False)
    def failing() -> None:
        value = runtime.get_global_rank()
        if value >= 0:
            raise ValueError("from a nested function")

    with pytest.raises(ValueError) as info:
        failing.distributed()
    text = info.value.__cause__.traceback_text  # type: ignore[union-attr]
    assert "<dynamic-code>" not in text
    assert f'File "{__file__}"' in text
    assert 'raise ValueError("from a nested function")' in text
    assert "serverless_gpu" not in text, text
    caller_frames = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert not any(name.endswith("handle.py") for name in caller_frames), caller_frames


def test_notebook_cell_functions_show_their_cell_and_source(tmp_path: Path) -> None:
    script = textwrap.dedent(
        '''
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        cells = [
            "from serverless_gpu import distributed",
            "x = 1",
            """@distributed(gpus=2, tracking=False, standby=False)
        def flaky_step():
            y = 2
            raise ValueError('from a cell')
        """,
            """try:
            flaky_step.distributed()
        except ValueError as exc:
            print(exc.__cause__.traceback_text)
        """,
        ]
        for cell in cells:
            shell.run_cell(cell, store_history=True)
        '''
    )
    env = {**os.environ, "SERVERLESS_GPU_TYPE": "cpu", "SERVERLESS_GPU_WARMUP": "0"}
    out = run_script(script, env=env, cwd=tmp_path)
    assert "Cell In[3], line 4, in flaky_step" in out.stdout, out.stdout + out.stderr
    assert "raise ValueError('from a cell')" in out.stdout
    assert "<dynamic-code>" not in out.stdout


def test_rank_errors_are_distributed_errors_or_the_ranks_own() -> None:
    assert issubclass(RemoteError, DistributedError)
    assert issubclass(RankFailedError, DistributedError)


def _set_cuda_device() -> None:
    import torch

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # the vendor docs' SimpleMLP


def _init_nccl() -> None:
    import torch.distributed as dist

    dist.init_process_group("nccl")  # not the warm gloo group's backend: torch's own init


@pytest.mark.parametrize("gpu_code", [_set_cuda_device, _init_nccl], ids=["set_device", "nccl"])
def test_gpu_only_code_in_cpu_mode_says_what_to_use_instead(gpu_code: Any) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA: the GPU-only calls work")

    @distributed(gpus=2, gpu_type="cpu", tracking=False, output="none")
    def simple_mlp() -> None:
        gpu_code()

    with pytest.raises((AttributeError, RuntimeError)) as info:  # torch's own types
        simple_mlp.distributed()
    assert type(info.value) in (AttributeError, RuntimeError)
    notes = getattr(info.value, "__notes__", [])
    assert any(
        "CPU mode" in note and "runtime.device()" in note and "runtime.init_process_group()" in note
        for note in notes
    ), notes


def test_a_peer_exiting_with_a_code_after_a_survivors_lost_connection_is_the_root_cause(
    tmp_path: Path,
) -> None:
    """The crashed peer's exit is often reaped after the survivor's "connection reset by
    peer" has stopped the run. Here rank 1 exits with code 1 only once that stop reaches it
    (its own SIGTERM handler), so the launcher always sees the two in that order."""

    @distributed(gpus=2, tracking=False, standby=False, output="none", timeout=60)
    def lost_peer(ready: str) -> None:
        import os
        import signal
        import time

        from serverless_gpu import runtime

        if runtime.get_global_rank() == 1:
            signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
            Path(ready).touch()
            time.sleep(60)
        deadline = time.monotonic() + 30
        while not Path(ready).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("Read error [127.0.0.1]:15069: Connection reset by peer")

    with pytest.raises(RankFailedError, match="rank 1 exited with code 1") as info:
        lost_peer.distributed(str(tmp_path / "ready"))
    assert "other failures: rank 0 raised RuntimeError" in str(info.value)
