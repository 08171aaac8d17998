#!/usr/bin/env bash
# The main job: the seed's SimpleMLP trained with DDP on every local GPU (2 CPU ranks where there
# is none), tracked in MLflow's embedded sqlite store (./mlflow.db). Extra arguments go to the
# example (e.g. --epochs 5 --fsdp).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# setuptools announces every editable install with a warning there is nothing to do about.
editable_install() { PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q "$@"; }
# Install only when what the install depends on changed since the last one (pip takes ~10 s
# even when there is nothing to do).
stamp=.venv/.run-example-installed
want="$(cat pyproject.toml .ci/constraints-ci.txt | sha256sum | cut -d' ' -f1) ${SKIP_TORCH_PIN:-0}"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # On a GPU machine that already has a CUDA torch in this venv, pass SKIP_TORCH_PIN=1.
  if [ "${SKIP_TORCH_PIN:-0}" = 1 ]; then
    editable_install -e '.[tracking]'
  else
    editable_install -c .ci/constraints-ci.txt -e '.[tracking]'
  fi
  echo "$want" > "$stamp"
fi
exec .venv/bin/python -m serverless_gpu.examples.mlp "$@"
