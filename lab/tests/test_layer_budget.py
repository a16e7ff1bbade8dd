"""lab/bench/layer_budget.py: the layer targets against the per-GEMM table, on the recorded
H200 layer run (lab/results/layer_h200_elem_all.json) and table fixture."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

from kimictl.kernels.toolchain.dispatch import DispatchTable

ROOT = Path(__file__).parents[2]


def _module():
    spec = importlib.util.spec_from_file_location(
        "layer_budget", ROOT / "lab" / "bench" / "layer_budget.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["layer_budget"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_budget_rows_follow_the_recorded_run_and_table():
    lb = _module()
    run = json.loads(lb.RUN.read_text())
    rows = lb.budget(run, DispatchTable.load(lb.TABLE))
    assert {(r["kind"], r["m"]) for r in rows} == {
        (kind, row["m"]) for kind, layer in run["layers"].items() for row in layer["rows"]
    }
    for r in rows:
        # the fastest kernel per projection can never cost more than elem_all's own picks
        if not math.isnan(r["elem_all_gemms"]):
            assert r["gemms_best"] <= r["elem_all_gemms"] + 1e-9
            assert math.isclose(
                r["elem_all_rest"] + r["standins"] + r["elem_all_gemms"], r["elem_all"]
            )
        factor = 0.6 if r["m"] <= 8 else 0.75
        assert math.isclose(min(r["targets"].values()), min(
            [r["stock"] * factor, *([r["vllm"] / 1.3] if r["m"] <= 8 else []),
             *(v for k, v in r["targets"].items() if "ceiling" in k)]))  # fmt: skip
        # the cat layers: latent_up's fastest time scaled to K = 3584 + 768 replaces both GEMMs
        table = DispatchTable.load(lb.TABLE)
        lu = lb.gemm_us(table, "latent_up", 7168, 3584, r["m"], None)
        sd = lb.gemm_us(table, "shared_down", 7168, 768, r["m"], None)
        assert math.isclose(r["gemms_cat"], r["gemms_best"] - lu - sd + lu * 4352 / 3584)
    # the layer's own GEMMs: the fused front GEMM in place of its three, no f_b (no table point)
    assert set(lb.layer_gemms("kda")) == {"kda_in", "o_proj", "front", "shared_down", "latent_up"}
    assert lb.layer_gemms("mla")["front"] == (896 + 3584 + 1536, 7168)
