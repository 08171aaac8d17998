"""A deliberate desync: rank 1 skips one all_reduce; the timeout's error says where each rank is.

    PYTHONPATH=. python scripts/desync_check.py                 # 2 GPUs (NCCL)
    PYTHONPATH=. python scripts/desync_check.py --cpu --gpus 2  # CPU ranks (gloo)

Rank 0 makes five all_reduces, rank 1 four: rank 0's fifth waits for a partner that never comes.
With ``timeout=20`` the call ends in ``DistributedTimeoutError``; its message names each rank's
innermost frame and, on GPUs, the collective each rank entered last from NCCL's flight recorder
(rank 0: ``nccl:all_reduce #5``, rank 1: ``#4``). The whole message is printed.
"""

from __future__ import annotations

import sys
import time

from _checks import check, rank_parser, ranks, summary

from serverless_gpu import DistributedTimeoutError, distributed, runtime

TIMEOUT_S = 20
SKIPPED_STEP = 3


def desync(steps: int = 5) -> float:
    """Runs in every rank."""
    import torch
    import torch.distributed as dist

    runtime.init_process_group()
    t = torch.ones(1, device=runtime.device())
    for step in range(steps):
        if runtime.get_global_rank() == 1 and step == SKIPPED_STEP:
            continue  # the bug: one rank skips a collective
        dist.all_reduce(t)
    return float(t.item())  # rank 0 waits here for its fifth all_reduce


def main() -> int:
    args = rank_parser().parse_args()
    world, gpu_type = ranks(args)
    fn = distributed(gpus=world, gpu_type=gpu_type, timeout=TIMEOUT_S, tracking=False)(desync)
    started = time.monotonic()
    try:
        fn.distributed()
    except DistributedTimeoutError as exc:
        elapsed = time.monotonic() - started
        print(f"--- DistributedTimeoutError after {elapsed:.1f} s ---\n{exc}\n---", flush=True)
        text = str(exc)
        check("the timeout stopped the call", True, f"{elapsed:.1f} s")
        check("stacks of every rank", set(exc.stacks) == set(range(world)), str(sorted(exc.stacks)))
        check("rank 0's line names desync", "rank 0: " in text and "desync (" in text)
        if not args.cpu:
            check("rank 0's last collective: all_reduce #5", "all_reduce #5" in text)
            check("rank 1's last collective: all_reduce #4", "all_reduce #4" in text)
        return summary()
    check("the call timed out", False, "it returned")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
