"""The ``serverless-gpu`` command (``pip install serverless-gpu[cli]``); see ``docs/cli.md``."""

from __future__ import annotations

import sys


def main() -> None:
    """The console script's entry point: says which extra to install when click is missing."""
    try:
        from serverless_gpu.cli.app import main as app
    except ImportError as exc:
        sys.exit(
            f"serverless-gpu: the command line needs {exc.name or 'its dependencies'}; "
            "install it with: pip install 'serverless-gpu[cli]'"
        )
    app(prog_name="serverless-gpu")
