#!/usr/bin/env bash
# The multi-rank checks at world sizes 8 and 16 on CPU ranks (gloo), a stand-in for 8 or 16 GPUs
# on a machine with 16 cores and no such GPUs, in one call of under 10 minutes:
#
#   bash scripts/cpu_world_run.sh OUTDIR
#
# Writes OUTDIR/world-8.txt and world-16.txt (gpu_validation, fsdp2_check, warm_group_check,
# lifetime_check, each with its exit code), OUTDIR/world_size.md (benchmarks/world_size.py at
# 2, 8 and 16 ranks) and OUTDIR/launch-16.md (benchmarks/launch.py --cpu --gpus 16).
set -u
out=${1:?an output folder}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=. SERVERLESS_GPU_CPU_SLOTS=${SERVERLESS_GPU_CPU_SLOTS:-16}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

step() {  # step FILE LIMIT COMMAND...: append the command's output and exit code to FILE
    local file=$1 limit=$2
    shift 2
    { echo "\$ $*"; timeout "$limit" "$@" 2>&1; echo "rc=$?"; echo; } >> "$file"
}

{ nproc; free -g | head -2; python3 -c 'import torch; print("torch", torch.__version__)'; } \
    > "$out/world-8.txt" 2>&1
cp "$out/world-8.txt" "$out/world-16.txt"
for n in 8 16; do
    f="$out/world-$n.txt"
    step "$f" 120 python3 scripts/gpu_validation.py --cpu --gpus "$n"
    step "$f" 120 python3 scripts/fsdp2_check.py --cpu --gpus "$n"
    step "$f" 150 python3 scripts/warm_group_check.py --cpu --gpus "$n"
    step "$f" 150 python3 scripts/lifetime_check.py --cpu --gpus "$n"
done
step "$out/world_size.txt" 240 python3 benchmarks/world_size.py --sizes 2 8 16 --out "$out/world_size.md"
step "$out/launch.txt" 200 python3 benchmarks/launch.py --cpu --gpus 16 --reps 2 --out "$out/launch-16.md"
