"""Tar shards: a volume of ``.tar`` files whose samples are groups of members.

An object store pays a round trip per object, so a dataset of many small files reads at a few
hundred objects a second however many threads ask. Packed into shards (tar files, as WebDataset
writes them), one request brings hundreds of samples. ``VolumeDataset(shards="tar")`` reads
such a volume: each shard is fetched whole into the node's cache (or read in place), and the
samples are read out of it by offset.

A sample is a run of consecutive members that share a key, WebDataset's rule: the key is the
member's path up to the first dot of its file name, the rest is the field name
(``train/000001.seg.png`` is key ``train/000001``, field ``seg.png``). The sample is a ``dict``
of field name to ``bytes``, with ``"__key__"``.

Sharding and resuming need every shard's samples before the first read. They come from the
volume's index file (:data:`INDEX_NAME`, written by :func:`write_tar_index`), and for a shard
the index does not cover (or no longer fits: its size changed), from reading the shard's
headers at construction, which for a remote volume is a download of the shard.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any, BinaryIO

import torch

from serverless_gpu.data._fs import join, resolve
from serverless_gpu.data.errors import VolumeReadError
from serverless_gpu.data.listing import VolumeFile, list_volume
from serverless_gpu.data.prefetch import prefetched
from serverless_gpu.data.sharding import epoch_seed

__all__ = [
    "INDEX_NAME",
    "Member",
    "OpenShard",
    "Sample",
    "index_shards",
    "read_samples",
    "shard_order",
    "write_tar_index",
]

INDEX_NAME = "tar-index.json"
"""The index file of a volume of tar shards, next to the shards."""

_INDEX_VERSION = 1
_INDEX_THREADS = 8
_SHARD_FETCHES = 1
"""Shards fetched at once by one reader (each in ranged requests at once, ``listing``): the
shard wanted next comes first. With all ``ahead`` shards fetched together each had a share of
the bandwidth, and the first, the one the loop waits for, arrived about last (cold S3 with 2
workers a rank on a moto server: first batch 540 -> 380 ms)."""


@dataclass(frozen=True)
class Member:
    """One regular file of a shard: its field name, and where its bytes lie in the shard."""

    field: str
    offset: int
    size: int


@dataclass(frozen=True)
class Sample:
    """One sample: the index of its shard in the listing, its key and its members."""

    shard: int
    key: str
    members: tuple[Member, ...]


def index_shards(
    url: str, shards: Sequence[VolumeFile], storage_options: dict[str, Any] | None = None
) -> list[Sample]:
    """Every sample of ``shards`` (the listing of ``url``), in shard then archive order."""
    known = _read_index(url, storage_options)
    missing = [s for s in shards if not _entry_fits(known.get(s.relpath), s)]
    if missing:
        with ThreadPoolExecutor(min(_INDEX_THREADS, len(missing))) as pool:
            found = pool.map(lambda s: _index_one(url, s, storage_options), missing)
            for shard, entry in zip(missing, found, strict=True):
                known[shard.relpath] = entry
    samples: list[Sample] = []
    for number, shard in enumerate(shards):
        for key, fields in known[shard.relpath]["samples"]:
            members = tuple(Member(field, offset, size) for field, offset, size in fields)
            samples.append(Sample(number, key, members))
    return samples


def write_tar_index(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """Index every ``*.tar`` file of the volume ``url`` and write :data:`INDEX_NAME` beside
    them (one read of every shard, once, instead of at every dataset's construction).
    Returns the index file's URL."""
    shards = list_volume(url, glob="*.tar", storage_options=storage_options)
    with ThreadPoolExecutor(min(_INDEX_THREADS, len(shards))) as pool:
        entries = dict(
            zip(
                (s.relpath for s in shards),
                pool.map(lambda s: _index_one(url, s, storage_options), shards),
                strict=True,
            )
        )
    fs, root = resolve(url, storage_options)
    target = join(root, INDEX_NAME)
    payload = json.dumps({"version": _INDEX_VERSION, "shards": entries}, separators=(",", ":"))
    fs.pipe_file(target, payload.encode())
    return str(fs.unstrip_protocol(target))


def read_sample(fd: int, sample: Sample, shard_name: str) -> dict[str, Any]:
    """The sample's fields read from the open shard ``fd``."""
    out: dict[str, Any] = {"__key__": sample.key}
    for member in sample.members:
        data = os.pread(fd, member.size, member.offset)
        if len(data) != member.size:
            raise VolumeReadError(
                f"{shard_name}: member {sample.key}.{member.field} ends past the shard's end "
                f"(got {len(data)} of {member.size} bytes); the shard is truncated or was "
                "rewritten after it was indexed"
            )
        out[member.field] = data
    return out


def _read_index(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    fs, root = resolve(url, storage_options)
    try:
        raw = fs.cat_file(join(root, INDEX_NAME))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise VolumeReadError(f"cannot read the shard index of {url!r}: {exc}") from exc
    try:
        index = json.loads(raw)
        if index.get("version") != _INDEX_VERSION:
            return {}
        return dict(index["shards"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise VolumeReadError(
            f"the shard index {url.rstrip('/')}/{INDEX_NAME} is damaged ({exc}); delete it or "
            "write it again with write_tar_index"
        ) from exc


def _entry_fits(entry: Any, shard: VolumeFile) -> bool:
    return isinstance(entry, dict) and entry.get("size") == shard.size


def _index_one(url: str, shard: VolumeFile, storage_options: dict[str, Any] | None) -> Any:
    fs, root = resolve(url, storage_options)
    source = join(root, shard.relpath)
    try:
        with fs.open(source, "rb") as f:
            samples = list(_samples_of(f))
    except (tarfile.TarError, EOFError) as exc:
        raise VolumeReadError(
            f"{fs.unstrip_protocol(source)} is not a readable tar shard: {exc}"
        ) from exc
    except OSError as exc:
        raise VolumeReadError(f"cannot read {fs.unstrip_protocol(source)}: {exc}") from exc
    return {"size": shard.size, "samples": samples}


def _samples_of(f: BinaryIO) -> Iterator[list[Any]]:
    """``[key, [[field, offset, size], ...]]`` for each sample of the tar file ``f``."""
    current: list[Any] | None = None
    size = _size_of(f)
    with tarfile.open(fileobj=f, mode="r:") as tar:
        for info in tar:
            if not info.isreg():
                continue
            if info.offset_data + info.size > size:
                end = info.offset_data + info.size
                raise tarfile.ReadError(f"member {info.name} ends at byte {end} of {size}")
            key, field = _split(info.name)
            if current is None or current[0] != key:
                if current is not None:
                    yield current
                current = [key, []]
            current[1].append([field, info.offset_data, info.size])
    if current is not None:
        yield current


def _size_of(f: BinaryIO) -> int:
    size = getattr(f, "size", None)
    if isinstance(size, int):
        return size
    here = f.tell()
    end = f.seek(0, os.SEEK_END)
    f.seek(here)
    return end


def _split(name: str) -> tuple[str, str]:
    """WebDataset's key rule: up to the first dot of the file name is the key."""
    folder, _, base = name.rpartition("/")
    stem, dot, field = base.partition(".")
    key = f"{folder}/{stem}" if folder else stem
    return key, field if dot else ""


@dataclass
class OpenShard:
    """A shard open for reading: its descriptor, a name for errors, and what closes it."""

    fd: int
    name: str
    close: Callable[[], None]


def read_samples(
    samples: Sequence[Sample],
    indices: Sequence[int],
    open_shard: Callable[[int], OpenShard],
    *,
    ahead: int,
) -> Iterator[dict[str, Any]]:
    """The samples at ``indices``, in order; each run of samples from one shard is read from
    one ``open_shard`` of it, and the next ``ahead`` shards are opened (fetched) meanwhile,
    one after the other."""
    runs: list[tuple[int, list[int]]] = []
    for i in indices:
        shard = samples[i].shard
        if runs and runs[-1][0] == shard:
            runs[-1][1].append(i)
        else:
            runs.append((shard, [i]))
    opened = prefetched([shard for shard, _ in runs], open_shard, depth=ahead,
                        release=lambda s: s.close(), threads=_SHARD_FETCHES)  # fmt: skip
    with closing(opened):
        for handle, (_, run) in zip(opened, runs, strict=False):
            try:
                for i in run:
                    yield read_sample(handle.fd, samples[i], handle.name)
            finally:
                handle.close()


def shard_order(samples: Sequence[Sample], *, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """The epoch's sample order, shard by shard: with ``shuffle``, the shards in a seeded
    permutation and each shard's samples in one too (a rank reads a contiguous part of this
    order, so it fetches only its own shards)."""
    if not shuffle:
        return list(range(len(samples)))
    starts = [i for i, s in enumerate(samples) if i == 0 or samples[i - 1].shard != s.shard]
    ends = [*starts[1:], len(samples)]
    generator = torch.Generator()
    generator.manual_seed(epoch_seed(seed, epoch))
    order: list[int] = []
    for k in torch.randperm(len(starts), generator=generator).tolist():
        count = ends[k] - starts[k]
        order.extend((torch.randperm(count, generator=generator) + starts[k]).tolist())
    return order
