"""The original API's ``ray`` module, the home of ``ray_launch`` (``@distributed`` with a Ray
cluster over the ranks, the function as its driver) and ``ray_init`` (``ray.init`` that prints
the dashboard's address); both are in :mod:`serverless_gpu.compat` too. Importing this module
does not import Ray; calling them does."""

from __future__ import annotations

from serverless_gpu.api.ray_launch import ray_init, ray_launch

__all__ = ["ray_init", "ray_launch"]
