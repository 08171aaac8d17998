"""The original API's ``ray`` module, for notebooks that import from it: ``ray_launch`` and
``ray_init`` are :func:`serverless_gpu.ray_launch` and :func:`serverless_gpu.ray_init`.
Importing this module does not import Ray; calling them does."""

from __future__ import annotations

from serverless_gpu.api.ray_launch import ray_init, ray_launch

__all__ = ["ray_init", "ray_launch"]
