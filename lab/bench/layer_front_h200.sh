#!/usr/bin/env bash
# Issue 35 on the H200, one device call, from the checkout root; results under $OUT.
# 0. `kimictl kernels install --no-bench --from lab/_build --json` into an empty KIMICTL_CACHE_DIR:
#    the GEMM build and the layer build (lab/_build/{sm_90a,layer/sm_90a}: `kimictl kernels build
#    --arch sm_90a --out lab/_build` on the CPU box) verified and copied, so every later step finds
#    them where a node keeps them (SKIP_INSTALL=1 skips it, for a KIMICTL_CACHE_DIR installed before).
# 1. `kimictl kernels verify --json`: the installed GEMM build and layer build, segment f included.
# 2. lab/bench/layer_front_h200.py: segment f routed by the plugin inside vLLM 0.33.0's own K3
#    attention code, beside vLLM's SM90 plan and kimictl's GEMM routes, M = 1, 2, 4.
# 3. issue 35's decode-step table, lab/bench/layer_h200.py --chain-shipped: torch.compile stock,
#    vLLM 0.33.0's SM90 plan (with and without PDL stand-ins), kimictl's GEMM routes and the whole
#    fused layer per M, every shipped segment checked against fp64 first: the layer fixture
#    (SKIP_PLAN=1 skips it; LAYER_ARGS: more layer_h200.py options, e.g. "--rounds 7 --profile").
# Needs, git-ignored: .kbench/vllm_art and .kbench/drv_shim.cpp (vLLM 0.33.0's CuteSkinnyGemm
# units AOT-compiled from the wheel for the configs KIMI_K3_PROJECTIONS_SM90 names, its
# dsv3_fused_a sm_90a cubin, the plan per (N, K, M) and the shim that launches the cubin, from a
# harness outside this repository; load_vllm_plan in layer_h200.py says what it links), .kbench/vllm_src (mla.py, kda.py and utils/multi_stream_utils.py from the
# wheel), lab/_build_layer (`python3 lab/bench/layer_h200.py --make-build`), and wheels of
# kimictl's pure-Python CLI deps and einops in .devdeps/whl (the image lacks them).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 KIMICTL_CACHE_DIR=${KIMICTL_CACHE_DIR:-/tmp/kimictl-cache}
OUT=${OUT:-out}
mkdir -p "$OUT"
PYTHONPATH=$PWD
if ls .devdeps/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .devdeps/whl/*.whl && PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
date -u +%FT%TZ
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    rm -rf "$KIMICTL_CACHE_DIR"
    timeout 150 python3 -m kimictl kernels install --no-bench --from lab/_build --json >"$OUT/install.json"
    echo "install rc=$? layer: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layer"])' "$OUT/install.json")"
    python3 -c 'from kimictl.kernels.toolchain.build import find_layer_build as f; print("layer build used:", f("sm_90a"))'
fi
timeout 150 python3 -m kimictl kernels verify --json >"$OUT/verify.json"
echo "verify rc=$?"
python3 - "$OUT/verify.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
seg = [c for c in v["results"] if c["name"].startswith("chain_")]
f = [c for c in seg if "_f_" in c["name"]]
print(f"verify ok={v['ok']} checks={v['checks']} failed={len(v['failed'])} "
      f"worst={v['worst_rel_err']:.2e}; layer segments {len(seg)} (f: {len(f)}): "
      f"ok={all(c['ok'] for c in seg)} worst={max((c['rel_err'] for c in seg), default=0):.2e}")
PY
date -u +%FT%TZ
# vLLM's table runs dsv3_fused_a for f_b (1536x128) at M <= 8: manifest_plus_fb adds those rows;
# if that launch fails, the run repeats with f_b on cuBLAS (the plain manifest)
# SKIP_FRONT=1 skips this step
rc=0
[ "${SKIP_FRONT:-0}" = 1 ] || {
    timeout 150 python3 lab/bench/layer_front_h200.py --out "$OUT" --vllm-manifest manifest_plus_fb.json
    rc=$?
    echo "front rc=$rc"
}
if [ $rc -ne 0 ]; then
    timeout 120 python3 lab/bench/layer_front_h200.py --out "$OUT" --vllm-manifest manifest.json
    echo "front (plain manifest) rc=$?"
fi
date -u +%FT%TZ
[ "${SKIP_PLAN:-0}" = 1 ] && exit 0
cp .kbench/vllm_art/manifest.json "$OUT/vllm_plan_manifest.json"
timeout 250 python3 lab/bench/layer_h200.py --build lab/_build_layer --out "$OUT" --ms 1,2,4,8 \
    --rounds 5 --chain-shipped \
    --variants stock_pdlsi,vllm_plan,vllm_plan_pdlsi,kimictl,kimictl_chain_pdlsi ${LAYER_ARGS:-}
echo "layer rc=$?"
date -u +%FT%TZ
