"""IPython extension for serverless_gpu: ``%%distributed``, the live run widget, kernel lifetime.

    %load_ext jupyter_ext          # or: %load_ext serverless_gpu

It renders and wires; every process is started by ``serverless_gpu`` itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    from .lifecycle import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .lifecycle import unload

    unload(ipython)
