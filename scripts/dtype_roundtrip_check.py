"""Every dtype torch can save, as a tensor on ``--device``, comes back from a rank's result file
bit for bit (on a GPU: a CUDA tensor is copied from the device straight into the file).

    python scripts/dtype_roundtrip_check.py --device cuda

Prints one PASS/FAIL line per dtype and writer; a dtype that torch.save itself cannot write, or
that cannot be made on the device, is listed as skipped. The dtypes are checked in a child process
that is started again after the dtype it died on (torch aborts the process for some dtypes on some
devices). Exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _checks import FAILURES, check, summary

_STARTED = "started "
_DONE = "every dtype checked"
_MADE = "made "

QUANTIZED_NAMES = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")


def _bytes_of(torch: Any, t: Any) -> Any:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _sample(torch: Any, dtype: Any, device: str) -> Any:
    """96 random elements on ``device``; their bytes are filled through a uint8 view, which
    works for every dtype (many have no random generator or no copy to CUDA of their own)."""
    gen = torch.Generator().manual_seed(0)
    if str(dtype).removeprefix("torch.") in QUANTIZED_NAMES:
        cpu = torch.quantize_per_tensor(torch.randn(96, generator=gen), 0.1, 3, dtype)
        return cpu.to(device)
    cpu = torch.empty(96, dtype=dtype)
    raw = _bytes_of(torch, cpu)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    out = torch.empty(96, dtype=dtype, device=device)
    _bytes_of(torch, out).copy_(raw)
    return out


def _same(torch: Any, loaded: Any, original: Any) -> str:
    """'' when bit-identical, else what differs."""
    if loaded.dtype != original.dtype:
        return f"dtype {loaded.dtype}"
    if (loaded.shape, loaded.stride(), loaded.storage_offset()) != (
        original.shape,
        original.stride(),
        original.storage_offset(),
    ):
        return f"layout {tuple(loaded.shape)} {loaded.stride()} {loaded.storage_offset()}"
    if not torch.equal(_bytes_of(torch, loaded).cpu(), _bytes_of(torch, original).cpu()):
        return "bytes differ"
    return ""


def _check_dtype(torch: Any, dtype: Any, device: str, folder: Path) -> None:
    from serverless_gpu.runfiles import tensor_file
    from serverless_gpu.runfiles.serialization import dump_result, load_result

    try:
        base = _sample(torch, dtype, device)
        torch.save(base.cpu(), io.BytesIO())
        view = base[3:80:2]  # a strided view with an offset into a shared storage
    except Exception as exc:  # no such tensor (or view) on this device, or torch.save cannot
        print(f"skip  {dtype}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
        return
    print(f"{_MADE}{dtype}", flush=True)
    writers = {
        "mapped": lambda obj, path: tensor_file.dump(obj, path, torch, mapped=True),
        "write": lambda obj, path: tensor_file.dump(obj, path, torch, mapped=False),
        "dump_result": dump_result,
    }
    for name, write in writers.items():
        path = folder / f"{dtype}-{name}"
        try:
            write([base, view], path)
            loaded = load_result(path)
            problem = _same(torch, loaded[0], base) or _same(torch, loaded[1], view)
        except Exception as exc:  # the failure is what this check reports
            problem = f"{type(exc).__name__}: {exc}"
        finally:
            path.unlink(missing_ok=True)
        check(f"{dtype} on {device} via {name}", not problem, problem)


def _in_children(names: list[str], device: str) -> None:
    """Check the dtypes in child processes, one child until it dies: torch itself aborts the
    process for some dtypes on some devices, and that must cost one line, not the rest."""
    script = str(Path(__file__).resolve())
    while names:
        child = subprocess.run(
            [sys.executable, script, "--device", device, "--child", *names],
            capture_output=True,
            text=True,
            timeout=600,
        )
        started = made = None
        for line in child.stdout.splitlines():
            if line.startswith(_STARTED):
                started = line.removeprefix(_STARTED)
            elif line.startswith(_MADE):
                made = line.removeprefix(_MADE)
            elif line.startswith(("PASS", "FAIL", "skip")):
                print(line, flush=True)
                if line.startswith("FAIL"):
                    FAILURES.append(line)
        # A child that did not print its last line died: the return code alone does not say so
        # where the interpreter is started through a wrapper (abort() then reads as 134).
        if _DONE in child.stdout.splitlines() or started is None:
            return
        tail = (child.stderr.strip().splitlines() or [""])[-1][:100]
        if made == started:
            check(f"{started} on {device}", False, f"the process died ({tail}) writing or reading")
        else:  # before any of our code ran: torch cannot make this tensor here
            print(f"skip  {started}: torch aborts making it on {device} ({tail})", flush=True)
        names = names[names.index(started) + 1 :]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    dtypes = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
    if args.child is None:
        _in_children([str(d) for d in dtypes], args.device)
        return summary()
    with tempfile.TemporaryDirectory() as folder:
        for dtype in dtypes:
            if str(dtype) in args.child:
                print(f"{_STARTED}{dtype}", flush=True)
                _check_dtype(torch, dtype, args.device, Path(folder))
    print(_DONE, flush=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
