#!/usr/bin/env bash
# The main job: the seed's SimpleMLP trained with DDP on every local GPU (2 CPU ranks where there
# is none), tracked in MLflow's embedded sqlite store (./mlflow.db). Extra arguments go to the
# example (e.g. --epochs 5 --fsdp).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  echo "${0##*/}: creating .venv with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
source scripts/_install.sh
# Install only when what the install depends on changed since the last one (pip takes ~10 s
# even when there is nothing to do).
stamp=.venv/.run-example-installed
want="$(cat pyproject.toml .ci/constraints-ci.txt | sha256sum | cut -d' ' -f1) ${SKIP_TORCH_PIN:-0}"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing serverless-gpu[tracking] and torch into .venv: a few minutes the first time" \
    "(pip's whole output: $PIP_LOG)"
  pip_install --upgrade pip
  # On a GPU machine that already has a CUDA torch in this venv, pass SKIP_TORCH_PIN=1.
  if [ "${SKIP_TORCH_PIN:-0}" = 1 ]; then
    pip_install -e '.[tracking]'
  else
    install_torch
    pip_install -c .ci/constraints-ci.txt -e '.[tracking]'
  fi
  say_torch
  echo "$want" > "$stamp"
fi
say "running python -m serverless_gpu.examples.mlp $*"
exec .venv/bin/python -m serverless_gpu.examples.mlp "$@"
