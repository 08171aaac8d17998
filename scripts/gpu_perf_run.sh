#!/usr/bin/env bash
# The speed figures of a machine with GPUs, tracked (MLflow) and untracked side by side, in two
# calls of under 10 minutes each:
#
#   bash scripts/gpu_perf_run.sh WHEELS OUTDIR launch     # launch.py, warm_parts.py
#   bash scripts/gpu_perf_run.sh WHEELS OUTDIR transfer   # results, sessions, first tracked call
#   bash scripts/gpu_perf_run.sh WHEELS OUTDIR floor      # the parts: tmpfs writes, torch, CUDA
#
# WHEELS: a folder of wheels for this machine's python3 with what the image lacks (mlflow-skinny
# with SQLAlchemy and alembic, psutil, setproctitle, nvidia-ml-py); installed with --no-index.
# Each step has its own time limit and writes OUTDIR/<step>.txt (tables also as .md);
# OUTDIR/rc.txt holds every step's exit code and OUTDIR/machine.txt the machine and the install.
# EXTRA_ARGS is passed to every benchmark ("--cpu --gpus 2" tries the run on a CPU machine).
set -u
wheels=${1:?a folder of wheels}
out=${2:?an output folder}
part=${3:?launch, transfer or floor}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MLFLOW_DISABLE_TELEMETRY=true
read -r -a extra <<< "${EXTRA_ARGS:-}"

python3 -m pip install -q --no-index --find-links "$wheels" "mlflow-skinny<3.18" sqlalchemy \
    alembic psutil setproctitle nvidia-ml-py cloudpickle >> "$out/machine.txt" 2>&1
echo "install rc=$?" | tee -a "$out/rc.txt"
{ nvidia-smi -L; nproc; free -g; df -h /dev/shm
  python3 -c 'import sys, torch, mlflow; print(sys.version.split()[0], torch.__version__, mlflow.__version__)'
} >> "$out/machine.txt" 2>&1

step() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@" "${extra[@]}" > "$out/$name.txt" 2>&1
    echo "$name rc=$?" | tee -a "$out/rc.txt"
}

case $part in
    launch)
        step launch 420 python3 benchmarks/launch.py --reps 3 --out "$out/launch.md"
        step parts 150 python3 benchmarks/warm_parts.py --reps 3 --out "$out/parts.md"
        ;;
    transfer)
        step transfer 200 python3 benchmarks/overheads.py --reps 3 --only transfer \
            --out "$out/transfer.md"
        step first_tracked 200 python3 benchmarks/first_tracked.py --reps 3 \
            --out "$out/first_tracked.md"
        step sessions 150 python3 scripts/sessions_gpu_check.py
        ;;
    floor)
        step tmpfs_write 200 python3 benchmarks/tmpfs_write.py --reps 3
        # A fresh interpreter's import of torch, and of torch with a CUDA context, 3 times each:
        # what a first call's launcher (or a spawned child) pays before any user code runs.
        for code in "import torch" "import torch; torch.zeros(1, device='cuda')"; do
            for _ in 1 2 3; do
                TIMEFORMAT="%R s: python3 -c \"$code\""
                { time python3 -c "$code"; } >> "$out/floor.txt" 2>&1
            done
        done
        echo "floor rc=$?" | tee -a "$out/rc.txt"
        ;;
    *)
        echo "unknown part: $part (launch, transfer or floor)" >&2
        exit 2
        ;;
esac
