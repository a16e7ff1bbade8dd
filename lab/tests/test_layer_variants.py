"""Every layer variant of lab/bench/layer_h200.py as an op sequence on CPU, against the fp64
reference layer: torch matmuls in place of the GEMM kernels, and each elementwise
kernel's fp64 reference (layer_elem.elem_ref, what the GPU preflight checks the kernels against)
in place of the kernel. A variant that reorders or fuses the layer wrongly (a weight concatenated
in the wrong order, an op on the wrong columns) is off by O(1), far past the bf16 tolerance."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import torch_python

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "bench" / "layer_h200.py"
TOL = 2e-2  # layer_h200.TOL: a bf16 layer vs fp64 through ~10 rounded stages
LABELS = {"plain", "vllm", "hfused", "norm", "elem", "elemnorm", "elem_all", "tuned_fold",
          "tuned_cat", "tuned_catfold", "tuned_cat_pdlsi", "chain"}  # fmt: skip


def test_every_variant_computes_the_fp64_layer():
    python = torch_python()
    if python is None:
        pytest.skip("no interpreter with torch (run `kimictl setup cpu-runtime`)")
    proc = subprocess.run(
        [python, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        # "<kind> <label> (M, 7168) rel err out <e> res <e>"
        kind, label, *_ = line.split()
        err_out, err_res = float(line.split(" out ")[1].split()[0]), float(line.split(" res ")[1])
        assert err_out <= TOL and err_res <= TOL, line
        seen.setdefault(kind, set()).add(label)
    assert seen == {"mla": LABELS, "kda": LABELS}
