#!/usr/bin/env bash
# One call on a lent 2 x H200 machine: doctor with and without the multicast
# switches, a real snapshot, the all-reduce benchmark with kimictl monitor's GPU telemetry (and
# nvidia-smi beside it, to cross-check) running headless under that load.
#
# Run from the kimictl checkout; OUT is the folder for results (at most 8 files come back).
# Wheels for kimictl's pure-Python deps in $WHEELS (the machine has no network).
#
# Multicast: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 stay set
# in every process here except the doctor runs marked "without": doctor only queries the
# multicast attribute (cuDeviceGetAttribute) and never creates a multicast object.
set -u
OUT=${OUT:-/tmp/kimictl-x2}
WHEELS=${WHEELS:-../whl}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
LOG="$OUT/log.txt"
exec > >(tee -a "$LOG") 2>&1

echo "== setup $(date -u +%FT%TZ)"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || echo "wheel install failed"
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
$PY -c 'import kimictl, sys; print("kimictl from", kimictl.__file__, sys.version.split()[0])'

{
    echo "== date"; date -u +%FT%TZ
    echo "== uname"; uname -a
    echo "== nvidia-smi"; nvidia-smi
    echo "== topo -m"; nvidia-smi topo -m
    echo "== topo -p2p n"; nvidia-smi topo -p2p n
    echo "== nvlink --status"; nvidia-smi nvlink --status
    echo "== nvlink -c"; nvidia-smi nvlink -c
    echo "== -q"; nvidia-smi -q
    echo "== torch"; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.nccl.version())'
    echo "== env"; env | grep -E "NCCL|TORCH|NVSHMEM|CUDA|VLLM" | sort
} > "$OUT/info.txt" 2>&1

DOC="$OUT/doctor.txt"
: > "$DOC"
doctor() {  # title, then the command's arguments
    local title=$1; shift
    {
        echo "### $title"
        echo '$' "$@"
        timeout 120 "$@"
        echo "[exit $?]"
        echo
    } >> "$DOC" 2>&1
}
K="$PY -m kimictl"
doctor "with the machine's env (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1), snapshot saved" \
    $K doctor --save-snapshot "$OUT/h200x2-real.json" --force
doctor "without the three variables (doctor only: it creates no multicast object)" \
    env -u NCCL_NVLS_ENABLE -u TORCH_SYMM_MEM_DISABLE_MULTICAST -u NVSHMEM_DISABLE_NVLS $K doctor
doctor "with the machine's env, a TP2 deployment that overrides the torch switch" \
    $K doctor --vllm-args "TORCH_SYMM_MEM_DISABLE_MULTICAST=0 vllm serve moonshotai/Kimi-K3 -tp 2"
doctor "CUDA_VISIBLE_DEVICES=1 and a TP2 deployment" \
    env CUDA_VISIBLE_DEVICES=1 $K doctor --vllm-args "vllm serve moonshotai/Kimi-K3 -tp 2"
doctor "CUDA_VISIBLE_DEVICES by UUID prefix of GPU 1 (from nvidia-smi -L)" \
    env CUDA_VISIBLE_DEVICES="$(nvidia-smi -L | sed -n '2s/.*UUID: \(GPU-[0-9a-f]*\)-.*/\1/p')" $K doctor --json
cp "$OUT/h200x2-real.json" /tmp/snap.json 2>/dev/null

echo "== monitor idle + under the all-reduce load $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,memory.used,power.draw,clocks.sm,temperature.gpu \
    --format=csv -lms 500 > "$OUT/smi.csv" 2>&1 &
SMI=$!
$K monitor http://127.0.0.1:9 --no-tui --interval 0.5 --duration 150 --record "$OUT/monitor.jsonl" \
    > "$OUT/monitor.txt" 2>&1 &
MON=$!
sleep 4
echo "== allreduce $(date -u +%FT%TZ)"
timeout 420 $PY lab/bench/allreduce.py --out "$OUT/allreduce_h200x2.json" || echo "allreduce failed: $?"
echo "== allreduce done $(date -u +%FT%TZ)"
sleep 3
kill "$MON" "$SMI" 2>/dev/null
wait "$MON" "$SMI" 2>/dev/null
echo "== end $(date -u +%FT%TZ)"
ls -la "$OUT"
