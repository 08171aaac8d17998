"""An FSDP2 checkpoint of a ~1 B-parameter model through ``VolumeWriter`` / ``VolumeReader``
(and torch's ``FileSystemWriter`` / ``FileSystemReader``), beside ``dd`` to the same disk.

    PYTHONPATH=. python scripts/checkpoint_gpu_check.py                  # every visible GPU
    PYTHONPATH=. python scripts/checkpoint_gpu_check.py --gpus 1 --dir /local_disk/ckpt
    PYTHONPATH=. python scripts/checkpoint_gpu_check.py --cpu --gpus 2   # a tiny model on CPU

The model: ``--layers`` Linear(``--width``, ``--width``) blocks (default 16 x 8192: 1.07 B fp32
parameters, 4.3 GB), sharded with ``fully_shard`` per layer and on the whole, initialised on
the GPU. Each rank saves its shards with ``dcp.save`` and loads them back into a zeroed copy
(the files dropped from the page cache first); ``benchmarks/checkpoint.py``'s ``save_load``
measures both writers the same way. Checks: every rank's shards come back equal, and the save
and load rates are printed beside ``dd``'s (write with ``conv=fsync``, read after the drop).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from _checks import check, rank_parser, ranks, summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from checkpoint import DD, GB, rates_text, round_ratio, rows_for, save_load

import serverless_gpu
from serverless_gpu import distributed, runtime
from serverless_gpu.common.gpus import visible_gpu_names


def fsdp_checkpoint(root: str, layers: int, width: int) -> dict[str, Any]:
    """Runs in every rank."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    runtime.init_process_group()
    device = runtime.device()
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device=device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            layer.reset_parameters()
    state: dict[str, Any] = dict(get_model_state_dict(model))
    nbytes = sum(v.to_local().numel() * v.element_size() for v in state.values())
    out = save_load(root, state, nbytes)
    out["rank"] = runtime.get_global_rank()
    return out


def main() -> int:
    parser = rank_parser()
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    a = parser.parse_args()
    gpus, gpu_type = ranks(a)
    layers = a.layers or (4 if a.cpu else 16)
    width = a.width or (256 if a.cpu else 8192)
    params = layers * (width * width + width)
    where = "CPU" if a.cpu else visible_gpu_names()[0]
    print(f"FSDP2 checkpoint on {gpus} x {where}: {params / 1e9:.2f} B parameters", flush=True)
    root = Path(tempfile.mkdtemp(prefix="sgpu-ckpt-check-", dir=a.dir))
    fn = distributed(gpus=gpus, gpu_type=gpu_type, tracking=False)(fsdp_checkpoint)
    try:
        out = list(fn.distributed(str(root), layers, width))
    finally:
        serverless_gpu.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    folded = rows_for([{k: v for k, v in r.items() if k != "rank"} for r in out])
    for name, f in folded.items():
        if name == DD:
            continue
        versus = [round_ratio(folded, what, name, DD) for what in ("save", "load")]
        print(
            f"{name}: {f['bytes'] / GB:.2f} GB; save {f['save']:.2f} GB/s, load "
            f"{f['load']:.2f} GB/s ({versus[0]:.2f}x and {versus[1]:.2f}x dd in the same rounds)"
        )
    for name, f in folded.items():
        rounds = f["rounds"]
        save, load = rates_text(rounds["save"]), rates_text(rounds["load"])
        print(f"  {name} by round: save {save}, load {load}")
    dd = folded[DD]
    print(
        f"dd on {root.parent}: write {dd['save']:.2f} GB/s (conv=fsync), read {dd['load']:.2f} GB/s"
    )
    check("every rank returned, in order", [r["rank"] for r in out] == list(range(gpus)))
    check("every shard loads back equal", all(f["same"] for n, f in folded.items() if n != DD))
    check(
        "the whole model was saved",
        all(abs(f["bytes"] - params * 4) <= gpus * width * 4 for n, f in folded.items() if n != DD),
    )
    return summary()


if __name__ == "__main__":
    sys.exit(main())
