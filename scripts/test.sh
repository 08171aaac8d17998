#!/usr/bin/env bash
# Install everything the tests need into .venv, then lint, type-check and run the whole suite.
# Works on a fresh machine with only Python (and apt for the browser test's Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
source scripts/_install.sh
say "installing serverless-gpu[dev] and torch into .venv (pip's whole output: $PIP_LOG)"
pip_install --upgrade pip
# .ci/constraints-ci.txt pins the torch version the tests run with; the build: scripts/_install.sh.
install_torch
pip_install -c .ci/constraints-ci.txt -e '.[dev]'
# DeepSpeed builds against the installed torch (its setup imports it), hence no build isolation;
# its CPU communication op is compiled on first use and kept under .venv/torch_extensions.
if ! .venv/bin/python -m pip show -q deepspeed >/dev/null 2>&1; then
  pip_install setuptools wheel
  pip_install --no-build-isolation -c .ci/constraints-ci.txt deepspeed==0.19.8
fi
say_torch
say "installed in ${SECONDS} s"
stage=$SECONDS

# DeepSpeed's CPU communication op, compiled now (beside the checks below, which leave a core
# free: one compile job) rather than inside the first test that starts DeepSpeed; kept under
# .venv/torch_extensions.
export TORCH_EXTENSIONS_DIR=$PWD/.venv/torch_extensions
op_log=$(mktemp)
MAX_JOBS=1 .venv/bin/python -c "from deepspeed.accelerator import get_accelerator as a
a().create_op_builder('ShareMemCommBuilder').load()" >"$op_log" 2>&1 &
op_pid=$!

if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
fi

# The type checks run beside the other checks (two cores; each check uses one).
types() {
  .venv/bin/mypy
  # The other test folders each have a conftest.py (one module name), so each is checked alone
  # (pyproject's [tool.mypy] files has the rest).
  for dir in tests/conftest.py tests/cli tests/data tests/jupyter tests/tracking tests/trainers \
    tests/ray tests/sessions; do
    .venv/bin/mypy "$dir"
  done
}
types_log=$(mktemp)
types >"$types_log" 2>&1 &
types_pid=$!
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Notebooks are stored without outputs or execution counts (tests/notebooks executes them).
.venv/bin/nbstripout --verify notebooks/*.ipynb
# The documentation site, strict: a broken link or a missing API reference fails the build.
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
types_status=0
wait "$types_pid" || types_status=$?
cat "$types_log"
rm -f "$types_log"
[ "$types_status" = 0 ] || exit "$types_status"

op_status=0
wait "$op_pid" || op_status=$?
if [ "$op_status" != 0 ]; then  # the DeepSpeed tests then say what failed
  say "DeepSpeed's CPU op did not build here (its output follows); the tests will try again"
  tail -n 20 "$op_log"
fi
rm -f "$op_log"

say "lint, types, notebooks, docs checked and DeepSpeed's op built in $((SECONDS - stage)) s"
stage=$SECONDS

# Tests write only to temporary folders: the suite must leave every tracked file as it found it
# (a screenshot is refreshed by its own command, never by the tests).
tracked_state() { git diff HEAD --binary 2>/dev/null | sha256sum; }
before=$(tracked_state)
status=0
# Two workers (pytest-xdist), a test module to each at a time (tests/conftest.py groups them):
# most tests wait on processes they start, so two share two cores well.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile --durations=30 "$@" \
  || status=$?
say "tests ran in $((SECONDS - stage)) s (the whole script: ${SECONDS} s)"
if [ "$(tracked_state)" != "$before" ]; then
  echo "scripts/test.sh: the test suite changed tracked files:" >&2
  git status --short --untracked-files=no >&2
  # Elsewhere other work may be editing the same tree at the same time; in CI it is the suite.
  if [ "${CI:-}" = true ] && [ "$status" = 0 ]; then status=1; fi
fi
exit "$status"
