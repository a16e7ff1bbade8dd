#!/usr/bin/env bash
# Issue 35 on the H200, one device call, from the checkout root; results under $OUT.
# 1. `kimictl kernels verify --json` as shipped: the GEMM build and the layer build
#    (kimictl/kernels/toolchain/_build/{sm_90a,layer/sm_90a}, `kimictl kernels build --arch sm_90a`).
# 2. The dense part of a K3 decode layer per M in one run (lab/bench/layer_h200.py; its build with
#    `--make-build` on the CPU box): torch.compile stock, `kimictl` (kimictl's kernel at every
#    projection the table routes, stock elementwise: what the plugin's GEMM routes serve) and
#    `kimictl_chain_pdlsi` (the shipped fused layer, M = 1, 2), kernel nodes counted.
# Wheels of kimictl's pure-Python deps in .whl/ are installed first when present (the image lacks
# tomlkit, pydantic and this typer).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 KIMICTL_CACHE_DIR=/tmp/kimictl-cache  # nothing installed: tree builds
OUT=${OUT:-out}
mkdir -p "$OUT"
PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
date -u +%FT%TZ
timeout 240 python3 -m kimictl kernels verify --json >"$OUT/verify.json"
echo "verify rc=$?"
python3 - "$OUT/verify.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
layer = [c for c in v["results"] if c["name"].startswith("chain_")]
print(f"verify ok={v['ok']} checks={v['checks']} failed={len(v['failed'])} "
      f"worst={v['worst_rel_err']:.2e}; layer segments {len(layer)}: "
      f"ok={all(c['ok'] for c in layer)} worst={max((c['rel_err'] for c in layer), default=0):.2e}")
EOF
timeout 330 python3 lab/bench/layer_h200.py --build lab/_build_layer --out "$OUT" --ms 1,2,4,8 \
    --rounds 5 --variants stock_pdlsi,kimictl,kimictl_chain_pdlsi --chain-shipped
echo "layer rc=$?"
date -u +%FT%TZ
