"""Execute notebooks top to bottom with nbclient and keep the executed copies.

    python scripts/run_notebooks.py --out DIR [--timeout S] [NAME ...]

NAME is a notebook's stem (``03_deepspeed``); none means every notebook in notebooks/, in
order. The environment is passed to the kernels as it is: ``SERVERLESS_GPU_TYPE=auto`` runs
them on the GPUs at full size, ``cpu`` on 2 CPU ranks. Each executed copy is written to
DIR/NAME.ipynb, failed or not, and a line per notebook (status, seconds) to DIR/summary.txt.
Exits 1 when any notebook failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def run(path: Path, out: Path, timeout: float) -> str:
    nb = nbformat.read(path, as_version=4)
    work = out / f"{path.stem}.work"
    work.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    )
    try:
        client.execute()
        status = "ok"
    except (CellExecutionError, CellTimeoutError) as error:
        status = f"failed: {str(error).strip().splitlines()[-1][:200]}"
    finally:
        nbformat.write(nb, out / path.name)
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per cell")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [NOTEBOOKS / f"{n}.ipynb" for n in args.names] or sorted(NOTEBOOKS.glob("*.ipynb"))
    failed = False
    for path in paths:
        start = time.monotonic()
        status = run(path, args.out, args.timeout)
        line = f"{path.stem}: {status} ({time.monotonic() - start:.0f} s)"
        print(line, flush=True)
        with (args.out / "summary.txt").open("a") as summary:
            summary.write(line + "\n")
        failed |= status != "ok"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
