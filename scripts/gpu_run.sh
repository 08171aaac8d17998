#!/usr/bin/env bash
# The GPU runs of issues #5 and #7 on the device machine, in two calls of under 10 minutes:
#
#   bash scripts/gpu_run.sh checks "$OUT"   # gpu_validation, fsdp2_check, lifetime_check
#   bash scripts/gpu_run.sh bench  "$OUT"   # benchmarks/launch.py and overheads.py
#
# Every visible GPU is used (8 on the 8-GPU kind). Each step has its own time limit, writes
# its output to OUTDIR/<step>.txt and its exit code to OUTDIR/rc.txt. EXTRA_ARGS is passed to
# every step ("--cpu --gpus 2" smoke-tests the whole run on a machine without GPUs).
set -u
part=${1:?checks or bench}
out=${2:?an output folder}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
read -r -a extra <<< "${EXTRA_ARGS:-}"

step() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@" "${extra[@]}" > "$out/$name.txt" 2>&1
    echo "$name rc=$?" | tee -a "$out/rc.txt"
}

case $part in
    checks)
        { nvidia-smi -L; nproc; free -g; df -h /dev/shm; } > "$out/machine.txt" 2>&1
        step validation 180 python3 scripts/gpu_validation.py
        step fsdp2 150 python3 scripts/fsdp2_check.py
        step lifetime 200 python3 scripts/lifetime_check.py
        ;;
    bench)
        step launch 240 python3 benchmarks/launch.py --reps 2 --out "$out/launch.md"
        step overheads 300 python3 benchmarks/overheads.py --reps 2 --out "$out/overheads.md"
        ;;
    *)
        echo "unknown part: $part (checks or bench)" >&2
        exit 2
        ;;
esac
