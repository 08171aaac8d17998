#!/usr/bin/env bash
# Launch latency of two revisions side by side: this tree and REV (a commit), each measured in
# turn by `benchmarks/launch.py` on the same machine in one run, local and Ray backends, so that
# a refactor can show it cost nothing.
#
#   bash benchmarks/compare_revisions.sh REV [--reps K] [OUT_DIR]
#
# Each revision runs from its own checkout (a `git worktree` of REV in a temporary folder, removed
# at the end) with this tree's Python environment; the tables go to OUT_DIR (default: a
# temporary folder) as REV-local.md, HEAD-local.md, REV-ray.md, HEAD-ray.md, and to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: compare_revisions.sh REV [--reps K] [OUT_DIR]}
shift
reps=3
if [ "${1:-}" = --reps ]; then reps=$2; shift 2; fi
out=${1:-$(mktemp -d)}
mkdir -p "$out"
python=${PYTHON:-$(command -v python3)}
[ -x .venv/bin/python ] && python=.venv/bin/python
old=$(mktemp -d)/tree
git worktree add -q --detach "$old" "$rev"
trap 'git worktree remove --force "$old"' EXIT
short=$(git rev-parse --short "$rev")
head=$(git rev-parse --short HEAD)

measure() {  # tree name backend
  local tree=$1 name=$2 backend=$3
  echo "== $name ($backend)"
  (cd "$tree" && PYTHONPATH="$tree" "$python" benchmarks/launch.py --backend "$backend" --cpu \
    --reps "$reps" --out "$out/$name-$backend.md") | tail -n +1
}

for backend in local ray; do
  measure "$old" "$short" "$backend"
  measure "$PWD" "$head" "$backend"
done
echo "tables in $out"
