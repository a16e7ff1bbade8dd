"""`kimictl kernels plan`: the CLI contract and the compile-time arithmetic (no vLLM needed).

The unit keys themselves are proved against vLLM 0.33.0's code in test_kernel_plan_vs_vllm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kimictl.deployment.profiles import load_profile
from kimictl.kernels.vllm.plan import K3Layout, compile_times, plan_units


def _kimictl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kimictl", *args],
        capture_output=True, text=True, check=False, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_plan_json_totals_add_up_and_duplicates_are_counted() -> None:
    done = _kimictl("kernels", "plan", "k3-tp8-latency", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    families = report["families"]
    assert report["specialized"] and report["tp"] == 8 and report["q"] == 8
    assert report["totals"]["units"] == sum(f["units"] for f in families)
    assert report["totals"]["distinct"] == sum(f["distinct"] for f in families)
    for f in families:
        assert f["duplicates"] == f["units"] - f["distinct"] >= 0
    # the o-projection producer's key holds the AttnRes block count it ignores
    producer = next(f for f in families if f["family"] == "oproj.producer")
    assert producer["duplicates"] > 0
    assert report["layout"]["assumed"] and report["not_derived"]


def test_plan_human_output_names_the_lower_bound() -> None:
    done = _kimictl("kernels", "plan", "k3-tp16-latency")
    assert done.returncode == 0, done.stderr
    assert "oproj.fused" in done.stdout and "lower bound" in done.stdout


def test_stock_profile_has_no_specialized_units() -> None:
    done = _kimictl("kernels", "plan", "k3-tp8-latency-stock")
    assert done.returncode == 0
    assert "builds none of the specialized decode" in done.stdout


def test_unknown_profile_is_bad_input() -> None:
    done = _kimictl("kernels", "plan", "no-such-profile")
    assert done.returncode == 2
    assert done.stderr.startswith("error: Unknown profile 'no-such-profile'")


def test_layout_changes_move_the_counts() -> None:
    spec = load_profile("k3-tp8-latency").spec
    base = plan_units(spec)
    # blocks of 24 layers: fewer distinct AttnRes block counts, fewer distinct consumers
    wide = plan_units(spec, K3Layout(attn_res_block_size=24))
    count = lambda p, fam: sum(u.family == fam for u in p.units)  # noqa: E731
    assert count(wide, "attn_res") < count(base, "attn_res")
    assert count(wide, "oproj.consumer") < count(base, "oproj.consumer")


def test_compile_times_measured_vs_estimated(tmp_path: Path) -> None:
    plan = plan_units(load_profile("k3-tp8-latency").spec)
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"cold_seconds": {"attn_res": [1.0, 3.0]}, "provenance": {}}))
    rows, _ = compile_times(plan, times)
    by = {r.family: r for r in rows}
    assert by["attn_res"].measured and by["attn_res"].seconds_per_kernel == 2.0
    assert not by["kda_core"].measured and by["kda_core"].seconds_per_kernel == 2.0
    mla = next(f for f in plan.families() if f.family == "mla_core")
    assert by["mla_core"].vllm_seconds == 2.0 * mla.kernels  # query + value per unit
    assert compile_times(plan, tmp_path / "absent.json") == ([], {})
