# Sourced by scripts/run-example.sh and scripts/test.sh (from the repository root, after .venv
# exists): installing into .venv with progress shown, and which torch build to take.

# Where the CPU-only torch comes from on a machine without an NVIDIA GPU; TORCH_INDEX=default
# takes whatever the default index (pip's configuration, else PyPI) offers for the pin.
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
# How long PyTorch's index may take to answer before the default index is used instead.
TORCH_INDEX_PROBE_S=${TORCH_INDEX_PROBE_S:-5}
PIP_LOG=.venv/pip-install.log
: >"$PIP_LOG"

say() { echo "${0##*/}: $*"; }

# pip install "$@", one line per package as it is collected (the size of large downloads too),
# its whole output kept in $PIP_LOG; on failure the end of that output is shown.
pip_install() {
  if ! PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install \
    --progress-bar off "$@" 2>&1 | tee -a "$PIP_LOG" | _pip_progress; then
    say "pip install failed; the last lines of its output (all of it: $PIP_LOG):" >&2
    tail -n 25 "$PIP_LOG" >&2
    return 1
  fi
}

_pip_progress() {
  awk '
    /^Collecting / { print "  collecting " $2; fflush() }
    /^Processing / { n = split($2, path, "/"); print "  collecting " path[n]; fflush() }
    /^ *Downloading .*\([0-9.]+ [MG]B\)$/ { print "  downloading " $2 " " $3 " " $4; fflush() }
    /^Installing collected packages: / { print "  installing " NF - 3 " packages"; fflush() }
    /^Successfully installed / { print "  installed " NF - 2 " packages"; fflush() }
  '
}

has_nvidia_gpu() {
  [ -e /dev/nvidia0 ] || { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
}

# Whether $1 answers an HTTP request for its torch page within $TORCH_INDEX_PROBE_S seconds
# (name lookup included).
index_reachable() {
  local bound=()
  command -v timeout >/dev/null && bound=(timeout "$((TORCH_INDEX_PROBE_S + 1))")
  ${bound[@]+"${bound[@]}"} .venv/bin/python - "$1/torch/" "$TORCH_INDEX_PROBE_S" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read(1)
PY
}

# Sets TORCH_ARGS (pip arguments for the torch install, empty: the default index) and says
# which build is taken and why.
choose_torch() {
  TORCH_ARGS=()
  if has_nvidia_gpu; then
    say "torch: an NVIDIA GPU is here, so the default index's build (CUDA on Linux)"
  elif [ "$TORCH_INDEX" = default ]; then
    say "torch: the default index's build (TORCH_INDEX=default)"
  elif index_reachable "$TORCH_INDEX"; then
    TORCH_ARGS=(--index-url "$TORCH_INDEX")
    say "torch: no NVIDIA GPU here, so the CPU-only build from $TORCH_INDEX"
  else
    say "torch: no NVIDIA GPU here, but $TORCH_INDEX could not be reached within" \
      "${TORCH_INDEX_PROBE_S} s: the default index's build (on PyPI for Linux, the ~2.5 GB CUDA" \
      "build, which runs on the CPU too)"
  fi
}

# Install torch at the pinned version from where choose_torch said (a CPU index that fails
# falls back to the default index: the editable install then brings torch).
install_torch() {
  choose_torch
  if [ ${#TORCH_ARGS[@]} -gt 0 ] && ! pip_install -c .ci/constraints-ci.txt torch "${TORCH_ARGS[@]}"; then
    say "torch: the install from $TORCH_INDEX failed; the default index's build instead"
  fi
}

# What was installed, in one line.
say_torch() {
  .venv/bin/python -c 'import torch; print("'"${0##*/}"': torch", torch.__version__,
    "(CUDA " + torch.version.cuda + " build)" if torch.version.cuda else "(CPU-only build)")'
}
