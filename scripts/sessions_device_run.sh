#!/usr/bin/env bash
# The sessions' GPU checks on one machine with GPUs, Ray installed from carried wheels:
#
#   bash scripts/sessions_device_run.sh WHEELS OUTDIR [remote]
#
# With "remote" only the first step runs (a short lease).
#
# WHEELS: a folder of wheels for this machine's python3 (ray and what it needs that is not
# installed, setproctitle, psutil, nvidia-ml-py, cloudpickle). Ray may come instead as
# ray-min.tar.xz, its wheel unpacked without the parts no session uses (jars, rllib, serve,
# llm), to be unpacked into site-packages (for a machine that takes 64 MiB a call; no `ray`
# command then: `ray start` runs as ray.scripts.scripts). Each step has its own time limit
# and writes OUTDIR/<step>.txt; OUTDIR/rc.txt holds every step's exit code and
# OUTDIR/machine.txt the install's output and the machine.
#   remote  scripts/sessions_gpu_check.py --remote  (a session of Ray actors, ray.init here)
#   local   scripts/sessions_gpu_check.py           (the same on this machine's launcher)
#   nccl    scripts/session_nccl_check.py           (the fault matrix with NCCL)
#   rmatrix the fault matrix on a `ray start` cluster of this machine, NCCL, one rank per GPU
set -u
wheels=${1:?a folder of wheels}
out=${2:?an output folder}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ray=ray==2.60.0
if [ -f "$wheels/ray-min.tar.xz" ]; then
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    tar -C "$site" -xJf "$wheels/ray-min.tar.xz"
    ray="click filelock jsonschema msgpack packaging protobuf pyyaml requests"
fi
# shellcheck disable=SC2086  # $ray: several requirements
python3 -m pip install -q --no-index --find-links "$wheels" $ray setproctitle psutil \
    nvidia-ml-py cloudpickle > "$out/machine.txt" 2>&1
echo "install rc=$?" | tee -a "$out/rc.txt"
{ nvidia-smi -L; nproc; python3 -c 'import torch, ray; print(torch.__version__, ray.__version__)'; } \
    >> "$out/machine.txt" 2>&1

step() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1
    echo "$name rc=$?" | tee -a "$out/rc.txt"
}

# the most wanted first: a call cut short by its time limit keeps what ran
step remote 150 python3 scripts/sessions_gpu_check.py --remote
[ "${3:-}" = remote ] && exit 0
step nccl 110 python3 scripts/session_nccl_check.py

port=6391
ray_cli=(python3 -c 'import sys; from ray.scripts.scripts import main; sys.exit(main())')
setsid "${ray_cli[@]}" start --head --port "$port" --num-cpus 8 --include-dashboard false --block \
    > /tmp/ray-head.txt 2>&1 &
head=$!
export RAY_ADDRESS=127.0.0.1:$port SESSION_MATRIX_REMOTE=1
export SESSION_MATRIX_WORLD=$(nvidia-smi -L | wc -l)
until_up=$(printf '%q ' "${ray_cli[@]}")
timeout 60 bash -c "until $until_up status > /dev/null 2>&1; do sleep 1; done"
for run in "first user,no-warm" "after-call pre-formed"; do
    read -r situation origins <<< "$run"
    step "rmatrix-$situation" 100 python3 tests/sessions/session_matrix.py "$situation" \
        "$origins" --device cuda
done
step local 120 python3 scripts/sessions_gpu_check.py
kill -- -"$head" 2> /dev/null  # the head's process group: its gcs_server, raylet, workers
timeout 20 bash -c "while kill -0 -- -$head 2> /dev/null; do sleep 0.5; done" \
    || kill -9 -- -"$head" 2> /dev/null
