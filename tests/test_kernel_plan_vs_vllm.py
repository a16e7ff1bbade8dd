"""kimictl's compile-unit plan against the units vLLM 0.33.0's own code asks for.

For each shipped latency_specialized profile (and two derived deployments that move the batch
set and the MLA core), tests/vllm_kernel_units.py builds vLLM's real `SpecializedDecode` over a
fake K3 backbone laid out as kimictl assumes, recording every compile call. Checked here:
- the prepared batches vLLM derives from the capture sizes and q;
- per family, the exact set of vLLM cache keys (device/arch arguments aside) equals kimictl's;
- where vLLM's compile body was recorded (o-projection, AttnRes, MLA core), two keys compile the
  same code (same kernel, constructor arguments and fake arguments) exactly when kimictl gives
  them the same effective key: kimictl's duplicate count is vLLM's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from kimictl.deployment.profiles import load_profile
from kimictl.deployment.spec import DeploymentSpec
from kimictl.kernels.vllm.plan import DEFAULT_CAPTURE_SIZES, K3_LAYOUT, KernelPlan, plan_units

sys.path.insert(0, str(Path(__file__).parent))
import vllm_src

pytestmark = pytest.mark.vllm_src
ROOT = Path(__file__).resolve().parents[1]

SPECIALIZED = ["k3-tp8-latency", "k3-tp16-latency", "k3-tp8-long-context"]


def _deployments() -> dict[str, DeploymentSpec]:
    out = {name: load_profile(name).spec for name in SPECIALIZED}
    tp8 = out["k3-tp8-latency"]
    # no speculation, vLLM's default capture sizes: q = 1 adds the batches 24, 40, 48, 56
    out["tp8-no-spec-default-sizes"] = tp8.with_(speculative_config=None, compilation_config={})
    # TP16 forcing the trtllm MLA core, speculation with 3 draft tokens (q = 4)
    tp16 = out["k3-tp16-latency"]
    spec4 = {**(tp16.speculative_config or {}), "num_speculative_tokens": 3}
    extra = {**tp16.additional_config, "mla_core": "trtllm"}
    out["tp16-q4-trtllm"] = tp16.with_(speculative_config=spec4, additional_config=extra)
    return out


DEPLOYMENTS = _deployments()


def _vllm_units(spec: DeploymentSpec) -> dict[str, Any]:
    layout = asdict(K3_LAYOUT)
    case = {
        "tp": spec.tensor_parallel_size,
        "dcp": spec.decode_context_parallel_size,
        "q": spec.tokens_per_request,
        "max_context": spec.max_model_len or 131072,
        "mla_core": spec.additional_config.get("mla_core", "auto"),
        "capture_sizes": list(spec.cudagraph_capture_sizes or DEFAULT_CAPTURE_SIZES),
        "layout": {k: layout[k] for k in ("num_layers", "mla_layers", "attn_res_block_size",
                                          "first_k_dense_replace", "moe_layer_freq")},
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests/vllm_kernel_units.py"), json.dumps(case)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _comparable(family: str, key: list[Any]) -> tuple[str, Any]:
    """vLLM's cache key -> (kimictl family, kimictl key); device/arch/SM-count arguments and
    the weight layouts (the same for every layer) left out."""
    freeze = lambda v: tuple(freeze(x) for x in v) if isinstance(v, list) else v  # noqa: E731
    if family == "oproj":
        return f"oproj.{key[0]}", freeze(key)
    if family == "attn_res":  # (nb, delta, write, final, slots, cap, arch, aux)
        return family, freeze(key[:6] + key[7:])
    if family == "splitk_projection":  # (tactic, dtype, arch)
        return family, (freeze(key[0]), "bfloat16")
    if family == "skinny_projection":  # (dtype, SkinnyGemmConfig, has_residual)
        return family, ("bfloat16", freeze(key[1][1:]), key[2])
    if family == "kda_core":  # (specs, heads, gate_mode, has_bias, device, tokens)
        return family, (key[0][0][0][0], key[1], key[2], key[5])
    if family == "mla_core":  # (batch, heads, pitch, specs, device, dcp, sms, q)
        return family, (key[0], key[1], key[2], key[5], key[7])
    if family == "mla_dcp_value":  # (heads, size, batch, cap, uv, pitch, device, sms, q)
        return family, (key[0], key[1], key[2], key[3], key[5], key[8])
    raise AssertionError(f"unmapped vLLM family {family}")


@pytest.fixture(scope="module")
def sources() -> None:
    found, why = vllm_src.ensure_sources()
    if found is None:
        pytest.skip(f"vLLM {vllm_src.VLLM_VERSION} sources unavailable: {why}")


@pytest.mark.parametrize("name", list(DEPLOYMENTS))
def test_plan_matches_vllm_keys_and_duplicates(name: str, sources: None) -> None:
    spec = DEPLOYMENTS[name]
    plan: KernelPlan = plan_units(spec)
    vllm = _vllm_units(spec)
    assert list(plan.batches) == vllm["batches"]

    theirs: dict[str, set[Any]] = defaultdict(set)
    signature: dict[tuple[str, Any], str] = {}
    for call in vllm["calls"]:
        family, key = _comparable(call["family"], call["key"])
        theirs[family].add(key)
        if "signature" in call:
            signature[family, key] = json.dumps(call["signature"])
    ours: dict[str, set[Any]] = defaultdict(set)
    effective = {}
    for unit in plan.units:
        ours[unit.family].add(unit.key)
        effective[unit.family, unit.key] = unit.effective
    assert {f: len(k) for f, k in ours.items()} == {f: len(k) for f, k in theirs.items()}
    assert ours == theirs

    # Duplicates: same compiled code <=> same kimictl effective key (per family).
    checked = 0
    for family in ours:
        keys = [k for k in ours[family] if (family, k) in signature]
        if not keys:
            continue
        sigs = {signature[family, k] for k in keys}
        effs = {effective[family, k] for k in keys}
        pairs = {(signature[family, k], effective[family, k]) for k in keys}
        assert len(sigs) == len(effs) == len(pairs), family
        checked += 1
    assert checked >= 3  # oproj producer/consumer (or fused), attn_res, mla_core


def test_stock_profile_plans_no_specialized_units() -> None:
    plan = plan_units(load_profile("k3-tp8-latency-stock").spec)
    assert not plan.specialized and plan.units == []
