"""What the GPU check scripts share: PASS/FAIL lines, the exit code, and ``--cpu`` / ``--gpus``."""

from __future__ import annotations

import argparse

from serverless_gpu.common.gpus import visible_gpu_names

FAILURES: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    """Print one PASS/FAIL line with its measured figure; remember failures for the exit code."""
    print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILURES.append(name)


def summary() -> int:
    print(f"{len(FAILURES)} failed: {FAILURES}" if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


def rank_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="CPU ranks (gloo) instead of GPUs")
    parser.add_argument("--gpus", type=int, default=None, help="ranks (default: every GPU, or 2)")
    return parser


def ranks(args: argparse.Namespace) -> tuple[int, str | None]:
    """(number of ranks, gpu_type) from ``--cpu`` / ``--gpus``."""
    gpu_type = "cpu" if args.cpu else None
    return args.gpus or (2 if args.cpu else len(visible_gpu_names())), gpu_type
