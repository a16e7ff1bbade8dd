"""Numerics. CPU: the references (fp32 and fp64 math) against an independent float64 dot product,
and the host wrapper's input checks. GPU: the verify output recorded on the lent H200 by
benchmarks/kernels_h200.py, committed as a fixture: it must cover every built variant of the
current kernel source, every M, the odd sizes, and pass every check."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from kimictl.kernels.build import ALL_CONFIGS, source_hash
from kimictl.kernels.tcstream_gemm import TC_MS
from kimictl.kernels.verify import REL_TOL, VERIFY_SHAPES

FIXTURE = Path(__file__).parent / "fixtures" / "kernels" / "verify_h200.json"

# bf16 inputs are exact in fp32 and fp64; the references differ only by accumulation rounding.
TOLERANCES = {"fp32": 1e-5, "fp64": 1e-12}


def _dot_ref(x: list[list[float]], w: list[list[float]]) -> list[list[float]]:
    return [[math.fsum(a * b for a, b in zip(row, wrow, strict=True)) for wrow in w] for row in x]


@pytest.mark.parametrize("wide", ["fp32", "fp64"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 3, 8), (8, 5, 1000), (3, 33, 24)])
def test_reference_matches_exact_dot(wide: str, m: int, n: int, k: int):
    torch = pytest.importorskip("torch", reason="the references are torch functions")
    from kimictl.kernels.wstream_gemm import wstream_gemm_ref

    rng = random.Random(m * 1000 + n * 10 + k)
    x = torch.tensor([[rng.gauss(0, 1) for _ in range(k)] for _ in range(m)]).to(torch.bfloat16)
    w = torch.tensor([[rng.gauss(0, 1) for _ in range(k)] for _ in range(n)]).to(torch.bfloat16)
    r = torch.tensor([[rng.gauss(0, 1) for _ in range(n)] for _ in range(m)]).to(torch.bfloat16)
    exact = torch.tensor(_dot_ref(x.double().tolist(), w.double().tolist()), dtype=torch.float64)
    got = wstream_gemm_ref(x, w, fp64=wide == "fp64")
    assert got.dtype == (torch.float64 if wide == "fp64" else torch.float32)
    rel = float((got.double() - exact).norm() / exact.norm())
    assert rel <= TOLERANCES[wide]
    with_r = wstream_gemm_ref(x, w, r, fp64=wide == "fp64")
    assert torch.allclose(with_r.double(), exact + r.double(), rtol=TOLERANCES[wide], atol=1e-4)


def test_host_wrapper_rejects_bad_inputs_before_any_launch():
    torch = pytest.importorskip("torch", reason="the host wrapper takes torch tensors")
    from kimictl.kernels.wstream_gemm import wstream_gemm

    x = torch.zeros((2, 12), dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="multiple of 8"):
        wstream_gemm(x, torch.zeros((4, 12), dtype=torch.bfloat16))
    with pytest.raises(AssertionError, match="K mismatch"):
        wstream_gemm(x, torch.zeros((4, 16), dtype=torch.bfloat16))
    with pytest.raises(AssertionError, match="must be bf16"):
        wstream_gemm(x.float(), torch.zeros((4, 12)))
    empty = wstream_gemm(
        torch.zeros((0, 16), dtype=torch.bfloat16), torch.zeros((4, 16), dtype=torch.bfloat16)
    )
    assert empty.shape == (0, 4)  # empty batch: no launch, no library needed


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
        "kernel source changed since the H200 verify: rerun benchmarks/kernels_h200.py"
    )


def test_recorded_verify_covers_every_variant_m_and_edge_size(recorded: dict):
    results = recorded["results"]
    assert {c["name"] for c in results} == {c.name for c in ALL_CONFIGS}
    assert {c["m"] for c in results} == set(TC_MS)  # 1..8, 16, 32, 64
    assert {(c["n"], c["k"]) for c in results} == set(VERIFY_SHAPES)
    assert any(c["residual"] for c in results)
    per = {(c["name"], c["n"], c["k"]) for c in results}
    assert len(per) == len(ALL_CONFIGS) * len(VERIFY_SHAPES)  # every variant on every size
