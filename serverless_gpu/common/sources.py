"""Source lines of functions that travel by value, so that a rank's traceback quotes them.

cloudpickle renames the file of every code object it pickles to ``<dynamic-code>`` (to make
pickles deterministic); the payload pickler keeps the real name instead. A function from a
script then reads ``File "train.py", line 48`` in the rank, which finds the script on disk. A
notebook cell has no file: its lines live in the caller's ``linecache`` only, so they travel
with the payload, together with IPython's name for the cell (``Cell In[3]``), and the rank
registers them in its own ``linecache`` and names the cell as IPython would.
"""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Iterable

MAX_SOURCE_BYTES = 4 << 20
"""Cells are small; this only keeps a pathological in-memory source from bloating the payload."""

Sources = dict[str, tuple[str | None, list[str]]]
"""file name -> (label such as ``"Cell In[3]"`` or None, source lines)."""

_labels: dict[str, str] = {}


def collect(filenames: Iterable[str]) -> Sources:
    """In the caller: lines and labels of the in-memory sources (cells) among ``filenames``."""
    sources: Sources = {}
    budget = MAX_SOURCE_BYTES
    for name in sorted(set(filenames)):
        if os.path.exists(name):
            continue  # a file on disk: the rank's linecache reads it itself
        lines = linecache.getlines(name)
        size = sum(len(line) for line in lines)
        if not lines or size > budget:
            continue
        budget -= size
        sources[name] = (_ipython_label(name), lines)
    return sources


def _ipython_label(filename: str) -> str | None:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    compiler = getattr(shell, "compile", None)
    try:
        named = compiler.format_code_name(filename) if compiler is not None else None
    except Exception:  # an IPython without this method: plain file names will do
        return None
    return " ".join(named) if named else None


def install(sources: Sources) -> None:
    """In a rank: make the caller's in-memory sources readable by ``linecache``."""
    for name, (label, lines) in sources.items():
        # mtime None: linecache.checkcache never drops the entry (IPython does the same).
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)
        if label:
            _labels[name] = label


def relabel(traceback_text: str) -> str:
    """``File "/tmp/ipykernel_1/123.py", line 4`` -> ``Cell In[3], line 4``, as IPython says."""
    for name, label in _labels.items():
        traceback_text = traceback_text.replace(f'File "{name}", line ', f"{label}, line ")
    return traceback_text
