"""`[serve] kimictl_layer = true`: the profile switch, doctor's finding, and the plugin against
vLLM 0.33.0's real K3 decoder-layer code (tests/vllm_layer_src.py, a child process with torch and
CUDA stubbed): which layers the fused dense layer may serve, and why each keeps vLLM's forward."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from kimictl.kernels.vllm import layer_route, plugin
from kimictl.runtime.deployment.spec import LAYER_ENV_VAR

ROOT = Path(__file__).resolve().parents[1]


def test_profile_switch_renders_the_env(tmp_path: Path) -> None:
    from kimictl.runtime.deployment.profiles import load_profile
    from kimictl.runtime.errors import InputError

    on = tmp_path / "on.toml"
    on.write_text('[model]\nname = "m"\n[serve]\nkimictl_layer = true\n')
    env = load_profile(on).spec.env
    assert env[LAYER_ENV_VAR] == "1" and plugin.ENV_VAR not in env  # one switch, not both
    assert layer_route.layer_enabled(env) and not plugin.enabled(env)
    off = tmp_path / "off.toml"
    off.write_text('[model]\nname = "m"\n[serve]\nkimictl_layer = false\n')
    assert LAYER_ENV_VAR not in load_profile(off).spec.env
    clash = tmp_path / "clash.toml"
    clash.write_text(
        f'[model]\nname = "m"\n[serve]\nkimictl_layer = true\n[env]\n{LAYER_ENV_VAR} = "0"\n'
    )
    with pytest.raises(InputError, match="kimictl_layer = true but"):
        load_profile(clash)
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nname = "m"\n[serve]\nkimictl_layer = "yes"\n')
    with pytest.raises(InputError, match="kimictl_layer"):
        load_profile(bad)


def test_the_switch_is_recorded_in_snapshots() -> None:
    from kimictl.runtime.checks.hardware import RECORDED_ENV

    assert LAYER_ENV_VAR in RECORDED_ENV and plugin.ENV_VAR in RECORDED_ENV


class MultiHeadLatentAttention:  # named as vLLM's classes: the verdict reads the type's name
    pass


class KimiK3DeltaAttention:
    pass


class KimiLinearGatedDeltaNetAttention:
    pass


def layer(attn: type, *, moe: bool = True, attn_res: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        self_attn=attn(), is_moe_layer=moe, use_attn_res=attn_res, input_layernorm=None
    )


@pytest.mark.parametrize(
    ("lay", "tp", "dtype", "reason"),
    [
        (layer(MultiHeadLatentAttention), 8, "bf16", "AttnRes"),
        (layer(KimiK3DeltaAttention, attn_res=False), 8, "bf16", "TP 8: vLLM all-reduces"),
        (layer(KimiK3DeltaAttention, attn_res=False), 16, "bf16", "TP 16: vLLM all-reduces"),
        (layer(MultiHeadLatentAttention, attn_res=False), 1, "bf16", "built at TP 8 shapes"),
        (layer(MultiHeadLatentAttention, moe=False), 8, "bf16", "dense MLP"),
        (layer(KimiLinearGatedDeltaNetAttention), 8, "bf16", "not built for"),
        (layer(KimiK3DeltaAttention), 8, "fp16", "dtype fp16"),
    ],
)
def test_every_layer_gets_the_reason_that_stops_it(lay, tp, dtype, reason) -> None:
    v = layer_route.verdict(lay, 0, tp, dtype, "bf16")
    assert reason in v.reason
    assert v.kind == {"MultiHeadLatentAttention": "mla", "KimiK3DeltaAttention": "kda"}.get(
        type(lay.self_attn).__name__, ""
    )


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    from kimictl.kernels.toolchain import build

    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "default_build_dir", lambda: tmp_path / "tree")
    return tmp_path / "cache" / "kernels" / build.LAYER_DIR / "sm_90a"


def test_doctor_says_when_the_switch_is_on_without_layer_kernels(node: Path) -> None:
    from kimictl.runtime.checks.rules.plugin import layer_check

    assert layer_check({}, "sm_90a") is None  # switch off: no finding at all
    on = {LAYER_ENV_VAR: "1"}
    missing = layer_check(on, "sm_90a")
    assert missing is not None and missing.status.value == "warn" and not missing.blocking
    assert "no built layer kernels for sm_90a" in missing.message
    assert missing.remedy.startswith("kimictl kernels build --arch sm_90a")
    other = layer_check(on, "sm_103a")
    assert other is not None and "built for sm_90a only" in other.message
    node.mkdir(parents=True)
    (node / "manifest.json").write_text("{}")
    built = layer_check(on, "sm_90a")
    assert built is not None and built.status.value == "warn"
    assert str(node) in built.message and "keep vLLM's forward" in built.message


def test_doctor_and_serve_gate_carry_the_finding(node: Path) -> None:
    from kimictl.runtime.checks.rules import evaluate
    from kimictl.runtime.deployment.spec import DeploymentSpec

    spec = DeploymentSpec(model="m", env={LAYER_ENV_VAR: "1"})
    ids = [c.id for c in evaluate(spec, None, None)]  # what serve's gate runs
    assert "kernels.vllm_layer" in ids
    plain = evaluate(DeploymentSpec(model="m"), None, None)
    assert "kernels.vllm_layer" not in [c.id for c in plain]


@pytest.mark.vllm_src
def test_plugin_against_vllms_real_layer_code() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "vllm_layer_src.py")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    # vLLM's forward: AttnRes replaces both add + RMSNorm calls segments a and b open with
    assert out["forward"]["plain"] == ["input_layernorm", "self_attn", "post_attention_layernorm",
                                       "mlp"]  # fmt: skip
    assert out["forward"]["attn_res"] == ["attn_res", "self_attn", "attn_res", "mlp"]
    # at TP 8 o_proj's partial sums are all-reduced before segment b's residual add can run,
    # and the routed latent before segment c's norm; at TP 1 neither
    assert out["o_proj"] == {"8": ["o_proj_gemm", "all_reduce"], "1": ["o_proj_gemm"]}
    assert out["latent"] == {"8": ["all_reduce", "latent_norm"], "1": ["latent_norm"]}
    # the switch off: vLLM's hook is its own; on: wrapped, every layer keeps vLLM's forward and
    # the log says why, per reason
    assert out["plugin_off"]["hook_is_vllms"]
    p = out["plugin"]
    assert p["wrapped"] and p["forwards_unchanged"]
    assert p["kinds"].count("KimiK3DeltaAttention") == 3
    assert p["logs"] == [
        "kimictl layer: installed on 0 of 5 decoder layers, vLLM's forward (4 layers: "
        f"{layer_route.ATTN_RES}; 1 layer: {layer_route.NOT_MOE})",
        "kimictl layer: installed on 0 of 5 decoder layers, vLLM's forward (5 layers: "
        "dtype torch.float16, the segments are bfloat16)",
        "kimictl layer: installed on 0 of 1 decoder layers, vLLM's forward (1 layer: "
        f"{layer_route.TP_COLLECTIVES.format(tp=8)})",
        "kimictl layer: installed on 0 of 1 decoder layers, vLLM's forward (1 layer: "
        f"{layer_route.TP_SHAPES.format(tp=1, built=8)})",
    ]


@pytest.mark.vllm_src
@pytest.mark.parametrize("fact", layer_route.LAYER_FACTS, ids=lambda f: f"{f[0]}:{f[1]}")
def test_cited_vllm_lines(fact: tuple[str, int, str]) -> None:
    from tests.vllm_src import ensure_sources

    root, why = ensure_sources()
    if root is None:
        pytest.skip(why)
    path, line, text = fact
    assert text in (root / path).read_text().splitlines()[line - 1]
