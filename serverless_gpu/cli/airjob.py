"""Job files in the ``air`` CLI's format, run here as they are.

A job file is in air's format when its mapping (after merging its ``_bases_``) has a
``compute`` block: air requires one, and this library's own format has none (it says
``gpus:``/``gpu_type:`` at the top level). Everything else about the file follows air's
documented schema: ``command`` is a bash script run once per node (here: one node) with
``NUM_NODES``, ``NODE_RANK``, ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set; it usually calls ``torchrun``, which starts the ranks.

Keys that only mean something on the vendor's platform are accepted and named, once, as
ignored here (:data:`PLATFORM_KEYS`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serverless_gpu.cli.jobtypes import DEFAULT_TIMEOUT_S, EnvName, EnvValue
from serverless_gpu.common.errors import ConfigurationError
from serverless_gpu.common.gpus import cpu_mode_requested, resolve_placement
from serverless_gpu.wire.accelerators import node_shape

PLATFORM_KEYS = (
    "environment",
    "secrets",
    "permissions",
    "priority",
    "idempotency_token",
    "usage_policy_name",
    "usage_policy_id",
    "mlflow_experiment_directory",
    "mlflow_artifact_location",
    "job_type",
    "udp",
)
"""Top-level keys of air's format that configure the vendor's platform (images, secret scopes,
workspace permissions, schedulers): accepted, reported as ignored."""
PLATFORM_COMPUTE_KEYS = ("node_pool_id", "pool_name", "provisioned_capacity_id", "priority_class")
PLATFORM_SNAPSHOT_KEYS = ("remote_volume", "git", "include_paths")

OURS_IN_AIR = {
    "gpus": "compute.num_accelerators",
    "gpu_type": "compute.accelerator_type",
    "env": "env_variables",
    "run_name": "mlflow_run_name",
    "script": "command",
    "module": "command",
    "args": "command",
    "remote": "(this library's key; a file of air's format runs on this machine)",
}
"""Keys of this library's format met in a file of air's format: where they go there."""
AIR_IN_OURS = {
    "env_variables": "env",
    "mlflow_run_name": "run_name",
    "compute": "gpus / gpu_type",
    "compute.num_accelerators": "gpus",
    "compute.accelerator_type": "gpu_type",
    "num_accelerators": "gpus",
    "accelerator_type": "gpu_type",
    **{
        key: "(air's key; a file of air's format has a compute block)"
        for key in ("parameters", "code_source", *PLATFORM_KEYS)
    },
}
"""Keys of air's format met in a file of this library's format: what they are here."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AirCompute(_Strict):
    num_accelerators: int = Field(gt=0)
    accelerator_type: str
    node_pool_id: str | None = None
    pool_name: str | None = None
    provisioned_capacity_id: str | None = None
    priority_class: str | None = None

    @field_validator("accelerator_type")
    @classmethod
    def _known_shape(cls, value: str) -> str:
        node_shape(value)  # GPUConfigError (a ValueError) names the known shapes
        return value

    def ranks(self) -> int:
        """Ranks of the one node a local run has, checked against this machine's GPUs as a
        decorated call's are; more than one node of the shape is refused (a job file runs
        on this machine). CPU mode ignores the shape, as the decorator does."""
        per_node, family, _ = node_shape(self.accelerator_type)
        cpu = cpu_mode_requested(family)
        if not cpu and per_node is not None and self.num_accelerators > per_node:
            raise ConfigurationError(
                f"compute.num_accelerators={self.num_accelerators} of {self.accelerator_type} "
                f"is {self.num_accelerators // per_node} nodes; a job file runs on one node "
                f"here: give at most {per_node} (--override compute.num_accelerators={per_node})"
            )
        return resolve_placement(self.num_accelerators, family, per_node).world_size


class AirSnapshot(_Strict):
    root_path: str
    remote_volume: str | None = None
    git: dict[str, Any] | None = None
    include_paths: list[str] | None = None


class AirCodeSource(_Strict):
    type: Literal["snapshot"] = "snapshot"
    snapshot: AirSnapshot


class AirJob(_Strict):
    """A job file of air's format (its documented keys and defaults)."""

    experiment_name: str | None = None
    compute: AirCompute
    command: str = Field(min_length=1)
    env_variables: dict[EnvName, EnvValue] = Field(default_factory=dict)
    parameters: dict[str, Any] | None = None
    code_source: AirCodeSource | None = None
    max_retries: int = Field(default=3, ge=0)
    """air's default: a failed run is started again three times."""
    timeout_minutes: float | None = Field(default=DEFAULT_TIMEOUT_S / 60, gt=0)
    """air's own default is no limit; here a job stops after 3 h unless ``null`` is given,
    as this library's own job files do."""
    mlflow_run_name: str | None = None
    environment: Any = None
    secrets: dict[str, str] | None = None
    permissions: Any = None
    priority: int | None = None
    idempotency_token: str | None = None
    usage_policy_name: str | None = None
    usage_policy_id: str | None = None
    mlflow_experiment_directory: str | None = None
    mlflow_artifact_location: str | None = None
    job_type: str | None = None
    udp: Any = None

    def ignored(self) -> list[str]:
        """The platform-only keys the file sets, as dotted names."""
        found = [k for k in PLATFORM_KEYS if getattr(self, k) is not None]
        found += [f"compute.{k}" for k in PLATFORM_COMPUTE_KEYS if getattr(self.compute, k)]
        snapshot = self.code_source.snapshot if self.code_source else None
        found += [
            f"code_source.snapshot.{k}"
            for k in PLATFORM_SNAPSHOT_KEYS
            if snapshot and getattr(snapshot, k)
        ]
        return found

    def code_source_path(self, job_dir: Path) -> Path | None:
        """``code_source.snapshot.root_path``, relative to the job file's folder; it must be a
        folder (here the code is used where it is, not copied)."""
        if self.code_source is None:
            return None
        path = (job_dir / Path(self.code_source.snapshot.root_path).expanduser()).resolve()
        if not path.is_dir():
            raise ConfigurationError(
                f"code_source.snapshot.root_path {self.code_source.snapshot.root_path!r} is not a "
                f"folder (resolved against the job file's folder: {path})"
            )
        return path


def is_air_format(data: dict[Any, Any]) -> bool:
    """air's format has a ``compute`` block; this library's never does."""
    return "compute" in data


def mapping_hint(key: str, air: bool) -> str | None:
    """Where a key of the other format goes in this one (``key`` dotted), if it is one."""
    table = OURS_IN_AIR if air else AIR_IN_OURS
    where = table.get(key) or table.get(key.rpartition(".")[2])
    if where is None:
        return None
    if where.startswith("("):
        return f"{key!r}: {where.strip('()')}"
    if air:
        return f"{key!r} is this library's key; in air's format it is {where!r}"
    return f"{key!r} is air's key; here it is {where!r}"
