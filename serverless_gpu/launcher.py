"""The original API's ``launcher`` module, for notebooks that import the decorator from it:
``from serverless_gpu.launcher import distributed`` is ``from serverless_gpu import
distributed``. (The launcher process itself is :mod:`serverless_gpu.launcher_process`.)"""

from __future__ import annotations

from serverless_gpu.api.decorator import DistributedConfig, DistributedFunction, distributed

__all__ = ["DistributedConfig", "DistributedFunction", "distributed"]
