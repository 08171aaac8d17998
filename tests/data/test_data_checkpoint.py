"""VolumeWriter / VolumeReader with dcp.save, dcp.async_save and dcp.load; checkpoint
discovery; the single-process training-state round trip; partial checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
import torch.distributed.checkpoint as dcp
from data_rank_main import NotingReader
from data_support import Launch, Storage
from torch.distributed.checkpoint.api import CheckpointException

from serverless_gpu.data import (
    IncompleteCheckpointError,
    VolumeDataset,
    VolumeReader,
    VolumeReadError,
    VolumeWriter,
    checkpoint_path,
    is_complete,
    latest_checkpoint,
    load_training_state,
    save_training_state,
)


def state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 8, generator=generator), "b": torch.randn(8, generator=generator)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("use_async", [False, True])
def test_save_load_roundtrip_and_layout(storage: Storage, tmp_path: Path, use_async: bool) -> None:
    path = storage.url("ckpt", "step_000000001")
    staging = tmp_path / "staging"
    writer = VolumeWriter(path, storage_options=storage.storage_options, staging_dir=staging)
    if use_async:
        upload = dcp.async_save(state(1), storage_writer=writer)
        # VolumeWriter stages in the calling thread, so torch hands back the upload's future
        # (save_training_state returns it as such).
        assert isinstance(upload, Future)
        upload.result()
    else:
        dcp.save(state(1), storage_writer=writer)
    assert storage.ls_names("ckpt/step_000000001") == {".metadata", "__0_0.distcp"}
    assert not staging.exists() or list(staging.iterdir()) == []  # staged files are cleaned up

    loaded = {k: torch.zeros_like(v) for k, v in state(0).items()}
    dcp.load(loaded, storage_reader=VolumeReader(path, storage_options=storage.storage_options))
    assert all(torch.equal(loaded[k], v) for k, v in state(1).items())

    # Overwriting a complete checkpoint keeps it loadable and holds the new values.
    dcp.save(state(2), storage_writer=VolumeWriter(path, storage_options=storage.storage_options))
    dcp.load(loaded, storage_reader=VolumeReader(path, storage_options=storage.storage_options))
    assert all(torch.equal(loaded[k], v) for k, v in state(2).items())


def test_latest_checkpoint_skips_partial_and_orders_by_step(storage: Storage) -> None:
    root, opts = storage.url("run"), storage.storage_options
    assert latest_checkpoint(root, opts) is None  # no root yet: nothing to resume
    for step in (2, 10, 9):
        dcp.save(
            state(step),
            storage_writer=VolumeWriter(checkpoint_path(root, step), storage_options=opts),
        )
    storage.write("run/step_000000011/__0_0.distcp", b"shard of an interrupted save")
    storage.write("run/manual/.metadata", b"an unnumbered name ranks below numbered ones")
    assert not is_complete(checkpoint_path(root, 11), opts)
    assert latest_checkpoint(root, opts) == checkpoint_path(root, 10)

    with pytest.raises(IncompleteCheckpointError):
        VolumeReader(checkpoint_path(root, 11), storage_options=opts).read_metadata()
    model = torch.nn.Linear(2, 2)
    with pytest.raises(IncompleteCheckpointError):
        load_training_state(checkpoint_path(root, 11), model=model, storage_options=opts)


def test_unnumbered_checkpoints_order_by_metadata_mtime(storage: Storage) -> None:
    root, opts = storage.url("runs"), storage.storage_options
    dcp.save(state(0), storage_writer=VolumeWriter(f"{root}/zeta", storage_options=opts))
    time.sleep(1.1 if storage.kind == "s3" else 0.05)  # S3 LastModified: 1 s resolution
    dcp.save(state(0), storage_writer=VolumeWriter(f"{root}/alpha", storage_options=opts))
    assert latest_checkpoint(root, opts) == f"{root}/alpha"


@pytest.mark.timeout(60)
def test_training_state_roundtrip_single_process(storage: Storage, tmp_path: Path) -> None:
    for i in range(6):
        storage.write(f"vol/{i}.bin", bytes([i]) * 4)
    opts = storage.storage_options

    def setup() -> tuple[torch.nn.Module, torch.optim.Optimizer, VolumeDataset[str]]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        dataset: VolumeDataset[str] = VolumeDataset(
            storage.url("vol"), tmp_path / "cache", shuffle=True, storage_options=opts
        )
        return model, optim, dataset

    model, optim, dataset = setup()
    model(torch.randn(3, 4)).sum().backward()
    optim.step()
    iterator = iter(dataset.loader(batch_size=2))
    next(iterator)
    path = checkpoint_path(storage.url("ckpt"), 7)
    save_training_state(
        path,
        model=model,
        optimizer=optim,
        dataset=dataset,
        step=7,
        extra={"note": "hi"},
        storage_options=opts,
    )
    expected_rand = torch.rand(3)
    expected_rest = [p for batch in iterator for p in batch]

    model2, optim2, dataset2 = setup()
    restored = load_training_state(
        path, model=model2, optimizer=optim2, dataset=dataset2, storage_options=opts
    )
    assert (restored.step, restored.extra) == (7, {"note": "hi"})
    assert torch.equal(torch.rand(3), expected_rand)  # RNG restored
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True)
    )
    momentum = [optim2.state[p]["momentum_buffer"] for p in model2.parameters()]
    assert all(
        torch.equal(a, optim.state[p]["momentum_buffer"])
        for a, p in zip(momentum, model.parameters(), strict=True)
    )
    assert [p for batch in dataset2.loader(batch_size=2) for p in batch] == expected_rest


def test_a_fork_during_an_upload_leaves_the_child_a_working_tempfile(s3_endpoint: str) -> None:
    """The async-save hang CI hit: a DataLoader forked its workers while the upload thread made
    the rank's first tempfile.gettempdir() call, which holds tempfile's module lock; the child
    inherited it locked, and a worker's queue thread waited on it forever (via
    multiprocessing's resource sharer, which names its socket with tempfile.mktemp). The writer
    now finds the staging directory when it is made, in the caller's thread."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True, endpoint_url=s3_endpoint)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    script = Path(__file__).with_name("fork_during_upload.py")
    run = subprocess.run(
        [sys.executable, str(script), f"s3://{bucket}/ckpt/step_000000001", s3_endpoint],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report == {
        "child_used_tempfile": True,
        "upload_thread_found_the_tempdir": False,
        "saved": True,
    }, run.stderr[-3000:]
    assert fs.exists(f"{bucket}/ckpt/step_000000001/.metadata")


_KILLED_SAVE = """
import json, os, signal, sys, threading, time
import torch
import torch.distributed.checkpoint as dcp
from serverless_gpu.data import VolumeWriter

path, options, staging, watch = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
big = {"w": torch.ones(32 << 20)}  # 128 MB: writing its shard takes long enough to be caught
writer = VolumeWriter(path, storage_options=options, staging_dir=staging)
threading.Thread(target=dcp.save, args=(big,), kwargs={"storage_writer": writer}).start()
deadline = time.monotonic() + 60
while not any(n.endswith(".part") for n in (os.listdir(watch) if os.path.isdir(watch) else [])):
    if time.monotonic() > deadline:
        sys.exit("no shard file was ever being written")
    time.sleep(0.001)
os.kill(os.getpid(), signal.SIGKILL)  # mid-write, as an out-of-memory kill or a preemption
"""


def _parts(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".part")) if folder.is_dir() else []


@pytest.mark.timeout(120)
def test_a_save_killed_mid_way_leaves_no_partial_shard_after_the_next_save(
    storage: Storage, tmp_path: Path
) -> None:
    path = storage.url("ckpt", "step_000000001")
    staging = tmp_path / "staging"
    # Where the killed save's partial shard lies: beside its final name on a local volume,
    # in the staging folder for an object store.
    watch = Path(path) if storage.kind == "local" else staging
    options = json.dumps(storage.storage_options)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_SAVE, path, options, str(staging), str(watch)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert _parts(watch), "the killed save left a partial shard"

    writer = VolumeWriter(path, storage_options=storage.storage_options, staging_dir=staging)
    dcp.save(state(3), storage_writer=writer)
    assert _parts(watch) == [] and _parts(staging) == []
    loaded = {k: torch.zeros_like(v) for k, v in state(0).items()}
    dcp.load(loaded, storage_reader=VolumeReader(path, storage_options=storage.storage_options))
    assert all(torch.equal(loaded[k], v) for k, v in state(3).items())


def cut_short(storage: Storage, checkpoint: str) -> None:
    shard = f"{checkpoint}/__0_0.distcp"
    data = storage.fs.cat_file(shard)
    storage.fs.pipe_file(shard, data[: len(data) // 2])  # a copy cut short


@pytest.mark.timeout(60)
def test_a_truncated_shard_is_an_error_naming_it(storage: Storage) -> None:
    opts = storage.storage_options
    plain = storage.url("ckpt", "plain")
    dcp.save(state(1), storage_writer=VolumeWriter(plain, storage_options=opts))
    cut_short(storage, plain)
    loaded = {k: torch.zeros_like(v) for k, v in state(0).items()}
    # dcp.load wraps every rank's error in its own CheckpointException; the message is ours.
    with pytest.raises(CheckpointException, match=r"__0_0\.distcp is \d+ bytes.*needs \d+"):
        dcp.load(loaded, storage_reader=VolumeReader(plain, storage_options=opts))

    trained = storage.url("ckpt", "step_000000001")
    save_training_state(trained, model=torch.nn.Linear(64, 64), step=1, storage_options=opts)
    cut_short(storage, trained)
    with pytest.raises(VolumeReadError, match=r"__0_0\.distcp is \d+ bytes.*needs \d+"):
        load_training_state(trained, model=torch.nn.Linear(64, 64), storage_options=opts)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("save_sharded", [False, True], ids=["saved-whole", "saved-sharded"])
def test_a_load_in_another_layout_reads_parts_of_chunks_directly(
    storage: Storage, tmp_path: Path, launch: Launch, save_sharded: bool
) -> None:
    """Two ranks save, then load each tensor sharded along another dim, into other dtypes and
    strided destinations: every value arrives; only the parts that are not contiguous in the
    saved chunk (columns of rows) and the non-tensor item take torch's path."""
    config = {
        "scenario": "reshard",
        "ckpt": storage.url("ckpt", "reshard"),
        "storage_options": storage.storage_options,
        "save_sharded": save_sharded,
    }
    run = launch(config, tmp_path / "ranks")
    for result in run.results:
        assert result is not None
        assert all(result["same"].values()), result["same"]
        assert result["left"] == ["cols", "step"]


@pytest.mark.timeout(60)
def test_a_strided_saved_tensor_takes_torchs_path_and_round_trips(storage: Storage) -> None:
    path, opts = storage.url("ckpt", "strided"), storage.storage_options
    saved = {"t": torch.randn(3, 5).t(), "view": torch.arange(10)[2:7], "w": torch.randn(4)}
    dcp.save(saved, storage_writer=VolumeWriter(path, storage_options=opts))
    loaded = {key: torch.zeros_like(value) for key, value in saved.items()}
    reader = NotingReader(path, storage_options=opts)
    dcp.load(loaded, storage_reader=reader)
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key
    assert reader.left == {"t"}  # torch.save keeps a transposed tensor's strides


@pytest.mark.timeout(60)
def test_a_cast_on_the_way_in_goes_a_buffer_at_a_time(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destination of another dtype (or device) is filled through the staging buffer, a
    chunk at a time; with a 96-byte buffer, 1,000 bf16 values take 21 chunks."""
    from serverless_gpu.data import dcp_read

    monkeypatch.setattr(dcp_read.Staging, "CHUNK", 96)
    path, opts = storage.url("ckpt", "cast"), storage.storage_options
    saved = {
        "half": torch.randn(40, 25).to(torch.bfloat16),
        "odd": torch.arange(7, dtype=torch.int16),
    }
    dcp.save(saved, storage_writer=VolumeWriter(path, storage_options=opts))
    loaded = {"half": torch.zeros(40, 25), "odd": torch.zeros(7, dtype=torch.float64)}
    reader = NotingReader(path, storage_options=opts)
    dcp.load(loaded, storage_reader=reader)
    assert torch.equal(loaded["half"], saved["half"].float())
    assert torch.equal(loaded["odd"], saved["odd"].double())
    assert reader.left == set()


def drop_from_memory(folder: Path) -> bool:
    """Write back, then drop from the page cache, every file in ``folder``; whether the
    kernel let them go (a file system that keeps files in memory, like tmpfs, does not)."""
    gone = True
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size = os.fstat(fd).st_size
            try:
                os.preadv(fd, [bytearray(1)], size // 2, os.RWF_NOWAIT)
                gone = gone and size < 2 * 4096
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
    return gone


@pytest.mark.timeout(60)
def test_large_items_on_disk_are_read_with_direct_io_and_the_rest_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items of at least ``DirectFile.MIN_BYTES`` whose bytes are not in memory come in
    through direct reads into page-aligned buffers, several in flight (here of 3 pages: an
    item starts mid-page, and takes many reads); a small item, a cast and the same checkpoint
    still in memory take the buffered stream. Every value arrives, a strided destination too."""
    from serverless_gpu.data import dcp_read

    monkeypatch.setattr(dcp_read.Staging, "DIRECT_CHUNK", 3 * dcp_read.DirectFile.ALIGN)
    monkeypatch.setattr(dcp_read.DirectFile, "MIN_BYTES", 40_000)
    direct_reads: list[tuple[int, int]] = []
    chunks = dcp_read.DirectFile.chunks

    def noted(self: Any, start: int, nbytes: int, ring: list[torch.Tensor], *seen: Any) -> Any:
        direct_reads.append((start, nbytes))
        return chunks(self, start, nbytes, ring, *seen)

    monkeypatch.setattr(dcp_read.DirectFile, "chunks", noted)
    generator = torch.Generator().manual_seed(3)
    saved = {
        "big": torch.randn(100, 103, generator=generator),  # 41,200 bytes
        "bytes": torch.randint(0, 255, (50_001,), dtype=torch.uint8, generator=generator),
        "strided": torch.randn(120, 90, generator=generator),
        "cast": torch.randn(20_000, generator=generator).to(torch.bfloat16),
        "small": torch.randn(10, generator=generator),
    }
    path = tmp_path / "ckpt"
    dcp.save(saved, storage_writer=VolumeWriter(str(path)))

    def load() -> dict[str, torch.Tensor]:
        loaded = {key: torch.zeros_like(value) for key, value in saved.items()}
        loaded["strided"] = torch.zeros(90, 120).t()
        loaded["cast"] = torch.zeros(20_000)
        reader = NotingReader(str(path))
        dcp.load(loaded, storage_reader=reader)
        assert reader.left == set()
        for key, value in saved.items():
            assert torch.equal(loaded[key], value.to(loaded[key].dtype)), key
        return loaded

    load()  # just written: in memory
    assert direct_reads == []
    # On a busy machine a drop now and then leaves an item's middle page in memory (the item
    # then rightly takes the buffered stream): a few drops, until all three were on disk.
    for _ in range(3):
        direct_reads.clear()
        if not drop_from_memory(path):
            pytest.skip(f"{path}'s file system keeps its files in memory")
        load()
        sizes = sorted(nbytes for _, nbytes in direct_reads)
        if sizes == [41_200, 43_200, 50_001]:
            break
    assert sizes == [41_200, 43_200, 50_001]
    assert any(start % dcp_read.DirectFile.ALIGN for start, _ in direct_reads)


@pytest.mark.timeout(60)
def test_a_refused_direct_read_falls_back_to_the_buffered_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system may open a file for direct I/O and then refuse the reads (EINVAL for an
    alignment it wants larger): the item is read again through the buffered stream, and so is
    the rest of the shard."""
    from serverless_gpu.data import dcp_read

    monkeypatch.setattr(dcp_read.DirectFile, "MIN_BYTES", 40_000)
    tried: list[int] = []

    def refused(self: Any, buffer: torch.Tensor, first: int, reach: int) -> None:
        tried.append(first)
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(dcp_read.DirectFile, "_read", refused)
    generator = torch.Generator().manual_seed(5)
    saved = {f"t{k}": torch.randn(100, 103, generator=generator) for k in range(3)}
    path = tmp_path / "ckpt"
    dcp.save(saved, storage_writer=VolumeWriter(str(path)))
    if not drop_from_memory(path):
        pytest.skip(f"{path}'s file system keeps its files in memory")
    loaded = {key: torch.zeros_like(value) for key, value in saved.items()}
    dcp.load(loaded, storage_reader=VolumeReader(str(path)))
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key
    assert len(tried) == 1  # the first item tried; the others went straight to the stream
