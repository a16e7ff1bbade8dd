"""Numerics. CPU: the references (fp32 and fp64 math) against an independent float64 dot product,
and the host wrapper's input checks (run where torch is: this interpreter or kimictl's CPU vLLM
runtime). GPU: the verify output recorded on the lent H200 by
lab/bench/kernels_h200.py, committed as a fixture: it must cover every built variant of the
current kernel source, every M, the odd sizes, and pass every check."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import torch_python

from kimictl.kernels.gemm.tcstream_gemm import TC_MS
from kimictl.kernels.toolchain.build import ALL_CONFIGS, source_hash
from kimictl.kernels.toolchain.verify import REL_TOL, VERIFY_SHAPES

FIXTURE = Path(__file__).parent / "fixtures" / "kernels" / "verify_h200.json"
ROOT = Path(__file__).resolve().parents[1]

# bf16 inputs are exact in fp32 and fp64; the references differ only by accumulation rounding.
TOLERANCES = {"fp32": 1e-5, "fp64": 1e-12}


def _in_torch(code: str) -> dict:
    """Run `code` (which sets `out`) where torch exists, with this checkout importable."""
    python = torch_python()
    if python is None:
        pytest.skip("no interpreter with torch (run `kimictl setup cpu-runtime`)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = "import json, math, random\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CASES = [(1, 3, 8), (8, 5, 1000), (3, 33, 24)]  # (M, N, K): one row, K past 8*125, odd N


@pytest.fixture(scope="module")
def reference_runs() -> dict:
    """Every case in one interpreter start (importing torch costs seconds)."""
    return _in_torch(
        f"""
        import torch
        from kimictl.kernels.gemm.wstream_gemm import wstream_gemm_ref
        out = {{}}
        for m, n, k in {CASES}:
            rng = random.Random(m * 1000 + n * 10 + k)
            def rand(r, c):
                return torch.tensor([[rng.gauss(0, 1) for _ in range(c)] for _ in range(r)])
            x, w, r = (rand(m, k).bfloat16(), rand(n, k).bfloat16(), rand(m, n).bfloat16())
            xs, ws = x.double().tolist(), w.double().tolist()
            # exact dot products of the bf16 values (fsum), independent of torch's matmul
            exact = torch.tensor(
                [[math.fsum(a * b for a, b in zip(xr, wr)) for wr in ws] for xr in xs],
                dtype=torch.float64,
            )
            for wide in ("fp32", "fp64"):
                got = wstream_gemm_ref(x, w, fp64=wide == "fp64")
                with_r = wstream_gemm_ref(x, w, r, fp64=wide == "fp64")
                out[f"{{m}},{{n}},{{k}},{{wide}}"] = {{
                    "dtype": str(got.dtype),
                    "rel": float((got.double() - exact).norm() / exact.norm()),
                    "rel_r": float((with_r.double() - exact - r.double()).norm() / exact.norm()),
                }}
        """
    )


@pytest.mark.parametrize("wide", ["fp32", "fp64"])
@pytest.mark.parametrize(("m", "n", "k"), CASES)
def test_reference_matches_exact_dot(reference_runs: dict, wide: str, m: int, n: int, k: int):
    out = reference_runs[f"{m},{n},{k},{wide}"]
    assert out["dtype"] == ("torch.float64" if wide == "fp64" else "torch.float32")
    assert out["rel"] <= TOLERANCES[wide]
    assert out["rel_r"] <= TOLERANCES[wide]


def test_host_wrapper_rejects_bad_inputs_before_any_launch():
    out = _in_torch(
        """
        import torch
        from kimictl.kernels.gemm.wstream_gemm import wstream_gemm
        bf = torch.bfloat16
        x = torch.zeros((2, 12), dtype=bf)
        msgs = []
        for args in ((x, torch.zeros((4, 12), dtype=bf)), (x, torch.zeros((4, 16), dtype=bf)),
                     (x.float(), torch.zeros((4, 12)))):
            try:
                wstream_gemm(*args)
                msgs.append(None)
            except AssertionError as e:
                msgs.append(str(e))
        empty = wstream_gemm(torch.zeros((0, 16), dtype=bf), torch.zeros((4, 16), dtype=bf))
        out = {"msgs": msgs, "empty": list(empty.shape)}
        """
    )
    first, second, third = out["msgs"]
    assert "multiple of 8" in first
    assert "K mismatch" in second
    assert "must be bf16" in third
    assert out["empty"] == [0, 4]  # empty batch: no launch, no library needed


@pytest.fixture(scope="module")
def recorded() -> dict:
    if not FIXTURE.is_file():
        pytest.skip("verify output from the H200 not committed yet")
    return json.loads(FIXTURE.read_text())


def test_recorded_verify_passed_on_h200(recorded: dict):
    assert recorded["arch"] == "sm_90a" and "H200" in recorded["device"]
    assert recorded["ok"] is True and recorded["failed"] == []
    for c in recorded["results"]:
        assert c["unwritten"] == 0, c
        assert c["graph_identical"], c
        assert 0 <= c["rel_err"] <= REL_TOL, c


def test_recorded_verify_is_of_the_current_kernel_source(recorded: dict):
    assert recorded["manifest"]["source_hash"] == source_hash(), (
        "kernel source changed since the H200 verify: rerun lab/bench/kernels_h200.py"
    )


def test_recorded_verify_covers_every_variant_m_and_edge_size(recorded: dict):
    results = recorded["results"]
    assert {c["name"] for c in results} == {c.name for c in ALL_CONFIGS}
    assert {c["m"] for c in results} == set(TC_MS)  # 1..8, 16, 32, 64
    assert {(c["n"], c["k"]) for c in results} == set(VERIFY_SHAPES)
    assert any(c["residual"] for c in results)
    per = {(c["name"], c["n"], c["k"]) for c in results}
    assert len(per) == len(ALL_CONFIGS) * len(VERIFY_SHAPES)  # every variant on every size
