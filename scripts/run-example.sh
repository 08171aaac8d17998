#!/usr/bin/env bash
# The main job: the seed's SimpleMLP trained with DDP on every local GPU (2 CPU ranks where there
# is none), tracked in MLflow's embedded sqlite store (./mlflow.db). Extra arguments go to the
# example (e.g. --epochs 5 --fsdp).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# On a GPU machine that already has a CUDA torch in this venv, pass SKIP_TORCH_PIN=1.
if [ "${SKIP_TORCH_PIN:-0}" = 1 ]; then
  .venv/bin/python -m pip install -q -e '.[tracking]'
else
  .venv/bin/python -m pip install -q -c constraints-ci.txt -e '.[tracking]'
fi
exec .venv/bin/python -m serverless_gpu.examples.mlp "$@"
