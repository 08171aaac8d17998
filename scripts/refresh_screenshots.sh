#!/usr/bin/env bash
# Refresh the screenshots in docs/ (run widget, record, error, stacks, after a restart; records of a
# cancelled run and of the stacks, in the dark theme; a sweep's runs table; session cells, quick,
# failed, cancelled and restarted, in JupyterLab and Notebook 7) by running the browser
# tests with their screenshots written there. The test suite itself writes them only to
# temporary folders. Needs the venv (scripts/test.sh makes it) and /usr/bin/chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
SERVERLESS_GPU_SCREENSHOTS="$PWD/docs" exec .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/jupyter/test_browser.py tests/jupyter/test_browser_records.py \
  tests/jupyter/test_browser_runs_table.py tests/jupyter/test_browser_sessions.py "$@"
