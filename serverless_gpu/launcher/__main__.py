"""``python -m serverless_gpu.launcher FD``: the launcher process the caller starts."""

import contextlib
import os
import sys

from serverless_gpu.launcher.loop import main

if __name__ == "__main__":
    exit_code = main(sys.argv)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    # Everything is cleaned up: skip the interpreter's teardown (torch, mlflow), which takes
    # seconds during which the launcher would still look alive.
    os._exit(exit_code)
