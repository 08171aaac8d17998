"""Reading faulthandler's stack text: where a rank's main thread is, in the user's words.

faulthandler writes, per thread, a header line and one line per frame, most recent call first::

    Main thread 0x00007f1202fbbb80 (most recent call first):
      File "/.../torch/distributed/distributed_c10d.py", line 3252 in all_reduce
      File "/home/me/train.py", line 23 in step
"""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from serverless_gpu.doctor.stacks import UNAVAILABLE

_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_LIBRARY_DIRS = tuple(
    {
        str(Path(p).resolve())
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
)
_OURS = str(Path(__file__).resolve().parents[1])  # serverless_gpu/


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def short(self) -> str:
        """``all_reduce (torch/distributed/distributed_c10d.py:3252)``."""
        return f"{self.func} ({_short_path(self.file)}:{self.line})"


def main_thread_frames(text: str) -> list[Frame]:
    """The main thread's frames, innermost first (empty when the text has no main thread)."""
    frames: list[Frame] = []
    inside = False
    for line in text.splitlines():
        if line.startswith(("Main thread", "Thread", "Current thread")):
            if inside:
                break
            inside = line.startswith("Main thread")
        elif inside and (m := _FRAME.match(line)):
            frames.append(Frame(m["file"], int(m["line"]), m["func"]))
    return frames


def is_user_file(path: str) -> bool:
    """Code of the user's (a script, a notebook cell), not of Python, a package or ours."""
    if path.startswith("<") and "distributed" not in path:
        return False  # <frozen ...>, <string>; a %%distributed cell is "<%%distributed In[3]>"
    try:
        resolved = str(Path(path).resolve())
    except (OSError, ValueError):
        return True
    if resolved.startswith(_OURS):
        return False
    return not any(resolved.startswith(d) for d in _LIBRARY_DIRS)


def where(text: str) -> str:
    """One line for a rank: its innermost frame and, when that is not the user's, the
    innermost frame of the user's code (``all_reduce (...) called from step (train.py:23)``);
    for a rank the launcher could not signal, why (``stacks unavailable: ...``)."""
    if text.startswith(UNAVAILABLE):
        return text.splitlines()[0]
    frames = main_thread_frames(text)
    if not frames:
        return "no Python frame of the main thread"
    innermost = frames[0]
    user = next((f for f in frames if is_user_file(f.file)), None)
    if user is None or user is innermost:
        return innermost.short()
    return f"{innermost.short()} called from {user.short()}"


def _short_path(path: str) -> str:
    """A package's file from its package on (``torch/distributed/c10d.py``); others by name."""
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    return Path(path).name if not path.startswith("<") else path
