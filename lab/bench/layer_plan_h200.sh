#!/usr/bin/env bash
# Issue 35 on the H200, one device call, from the checkout root; results under $OUT.
# The dense part of a K3 decode layer per M (lab/bench/layer_h200.py, M = 1, 2, 4, 8) with vLLM
# 0.33.0's own SM90 plan as a column beside torch.compile stock, kimictl's GEMM routes and the
# shipped fused layer, all in one run (ratios from one run). Needs, git-ignored:
# - lab/_build_layer: `python3 lab/bench/layer_h200.py --make-build` (CPU machine);
# - .kbench/vllm_art: vLLM 0.33.0's CuteSkinnyGemm units AOT-compiled from the wheel for the
#   configs KIMI_K3_PROJECTIONS_SM90 names, its dsv3_fused_a sm_90a cubin and the plan per
#   (N, K, M); .kbench/drv_shim.cpp launches that cubin. Both come from a harness outside this
#   repository (load_vllm_plan in layer_h200.py says what it links).
# LAYER_ARGS: more layer_h200.py options (a repeat: LAYER_ARGS="--rounds 7 --profile").
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 KIMICTL_CACHE_DIR=/tmp/kimictl-cache
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
for need in lab/_build_layer/sm_90a/manifest.json .kbench/vllm_art/manifest.json .kbench/drv_shim.cpp; do
    [ -f "$need" ] || { echo "error: $need is missing (see this script's header)"; exit 1; }
done
cp .kbench/vllm_art/manifest.json "$OUT/vllm_plan_manifest.json"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
date -u +%FT%TZ
timeout 270 python3 lab/bench/layer_h200.py --build lab/_build_layer --out "$OUT" --ms 1,2,4,8 \
    --rounds 5 --chain-shipped \
    --variants stock_pdlsi,vllm_plan,vllm_plan_pdlsi,kimictl,kimictl_chain_pdlsi ${LAYER_ARGS:-}
echo "layer rc=$?"
date -u +%FT%TZ
