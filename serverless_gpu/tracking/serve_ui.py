"""``python -m serverless_gpu.tracking.serve_ui STORE [RUN_ID]``: serve a store's MLflow UI to
you alone, from a terminal, until Ctrl-C.

What :func:`serverless_gpu.tracking.ui` does in a notebook: the store's stable port (the one its
run links name), reachable by your own user only. With RUN_ID, prints that run's page.
"""

from __future__ import annotations

import os
import sys

from serverless_gpu.tracking import store
from serverless_gpu.tracking.ui import stop_ui, ui, wait_served


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[1].startswith("-"):
        print(__doc__.splitlines()[0].strip("`: "), file=sys.stderr)
        return 2
    uri = argv[1]
    os.environ["MLFLOW_TRACKING_URI"] = uri
    address = ui()
    print(f"MLflow UI of {uri}: {address} (Ctrl-C stops it)", flush=True)
    if len(argv) == 3:
        from mlflow import MlflowClient

        run = MlflowClient(uri).get_run(argv[2])
        print(store.run_link(uri, run.info.experiment_id, run.info.run_id), flush=True)
    try:
        wait_served()
    except KeyboardInterrupt:
        pass
    finally:
        stop_ui()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
