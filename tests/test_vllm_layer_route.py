"""`[serve] kimictl_layer = true`: the profile switch, doctor's finding, which K3 layers segment f
serves, and the route inside vLLM 0.33.0's real attention methods on CPU torch
(tests/vllm_front_src.py); why segments b and c stay vLLM's, from vLLM's real decoder-layer code
with torch stubbed (tests/vllm_layer_src.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import torch_python

from kimictl.deployment.spec import LAYER_ENV_VAR
from kimictl.kernels.layer import chain
from kimictl.kernels.vllm import layer_route, plugin

ROOT = Path(__file__).resolve().parents[1]


def test_profile_switch_renders_the_env(tmp_path: Path) -> None:
    from kimictl.core.errors import InputError
    from kimictl.deployment.profiles import load_profile

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


def p(*shape: int, dtype: str = "bf16") -> types.SimpleNamespace:
    """A module holding one weight of `shape` (a projection or a norm)."""
    return types.SimpleNamespace(weight=types.SimpleNamespace(shape=shape, dtype=dtype))


def attention(cls: type, tp: int = 8, dtype: str = "bf16", gate: bool = True) -> object:
    """An attention with segment f's parameters at TP `tp` (K3's widths split as vLLM splits
    them): MLA's q/kv LoRA are replicated, its heads and KDA's are split."""
    a = cls()
    h, mla_heads, kda_heads = 7168, 96 // tp, 96 // tp
    if cls is MultiHeadLatentAttention:
        a.fused_qkv_a_g_proj = p(2112 + mla_heads * 128, h, dtype=dtype) if gate else None
        a.q_a_layernorm, a.kv_a_layernorm = p(1536), p(512)
        a.q_b_proj = p(mla_heads * 192, 1536, dtype=dtype)
    else:
        packed = 4 * kda_heads * 128 + 128 + kda_heads
        a.in_proj_qkvgfab = p(packed + -packed % 16, h, dtype=dtype)
        a.f_b_proj = p(kda_heads * 128, 128, dtype=dtype)
    return a


def layer(attn: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(self_attn=attn, is_moe_layer=True, input_layernorm=None)


def test_segment_f_params_are_vllms_tp8_shapes() -> None:
    # the shapes segment f is built at, from chain.segment, as vLLM's TP 8 modules hold them
    assert layer_route._expected_shapes("mla") == [(3648, 7168), (1536,), (512,), (2304, 1536)]
    assert layer_route._expected_shapes("kda") == [(6288, 7168), (1536, 128)]


@pytest.mark.parametrize(
    ("lay", "tp", "dtype", "reason"),
    [
        (layer(attention(MultiHeadLatentAttention)), 8, "bf16", ""),
        (layer(attention(KimiK3DeltaAttention)), 8, "bf16", ""),
        (layer(attention(KimiK3DeltaAttention, tp=16)), 16, "bf16", "TP 16: the attention's"),
        (layer(attention(MultiHeadLatentAttention, tp=16)), 16, "bf16", "TP 8 shapes"),
        (layer(attention(MultiHeadLatentAttention, gate=False)), 8, "bf16", "without q-LoRA"),
        (layer(attention(KimiK3DeltaAttention, dtype="fp8")), 8, "bf16", "quantized"),
        (layer(KimiLinearGatedDeltaNetAttention()), 8, "bf16", "not built for"),
        (layer(attention(KimiK3DeltaAttention)), 8, "fp16", "dtype fp16"),
    ],
)
def test_every_layer_gets_the_route_or_the_reason_that_stops_it(lay, tp, dtype, reason) -> None:
    v = layer_route.verdict(lay, 0, tp, dtype, "bf16")
    assert (reason in v.reason) if reason else v.reason == ""
    assert v.kind == {"MultiHeadLatentAttention": "mla", "KimiK3DeltaAttention": "kda"}.get(
        type(lay.self_attn).__name__, ""
    )


def test_install_without_a_build_routes_nothing_and_says_why() -> None:
    class Root:
        def modules(self):
            return iter([self, layer(attention(KimiK3DeltaAttention))])

    never = lambda: pytest.fail("no op without a build")  # noqa: E731
    torch = types.SimpleNamespace(bfloat16="bf16")
    report = layer_route.install(Root(), 8, "bf16", torch, variants=None, op=never)
    assert report.served == 0
    assert report.line() == (
        "kimictl layer: not installed (no layer build for this GPU); vLLM's forward"
    )
    names = [c.name for c in chain.CHAIN_SHIPPED]
    assert layer_route.front_variants(names) == {
        (c.layer, c.m): c.name for c in chain.CHAIN_SHIPPED if c.seg == "f"
    }
    assert set(layer_route.front_variants(names)) == {
        (k, m) for k in ("mla", "kda") for m in chain.SERVED_MS
    }


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
    built = layer_check(on, "sm_90a", tp=8)
    assert built is not None and built.status.value == "pass"
    assert str(node) in built.message and "segment f serves" in built.message
    tp16 = layer_check(on, "sm_90a", tp=16)
    assert tp16 is not None and tp16.status.value == "warn" and "at TP 16" in tp16.message


def test_doctor_and_serve_gate_carry_the_finding(node: Path) -> None:
    from kimictl.deployment.spec import DeploymentSpec
    from kimictl.runtime.checks.rules import evaluate

    spec = DeploymentSpec(model="m", env={LAYER_ENV_VAR: "1"})
    ids = [c.id for c in evaluate(spec, None, None)]  # what serve's gate runs
    assert "kernels.vllm_layer" in ids
    plain = evaluate(DeploymentSpec(model="m"), None, None)
    assert "kernels.vllm_layer" not in [c.id for c in plain]


def child(python: str, script: str) -> dict:
    """The JSON object a child script prints last (skipped with its reason where it could not
    get vLLM's sources)."""
    done = subprocess.run(
        [python, str(ROOT / "tests" / script)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


@pytest.mark.vllm_src
def test_why_segments_b_and_c_stay_vllms() -> None:
    out = child(sys.executable, "vllm_layer_src.py")
    # vLLM's forward: AttnRes replaces both add + RMSNorm calls segments a and b open with
    assert out["forward"]["plain"] == ["input_layernorm", "self_attn", "post_attention_layernorm",
                                       "mlp"]  # fmt: skip
    assert out["forward"]["attn_res"] == ["attn_res", "self_attn", "attn_res", "mlp"]
    # at TP 8 o_proj's partial sums are all-reduced before segment b's residual add can run,
    # and the routed latent before segment c's norm; at TP 1 neither
    assert out["o_proj"] == {"8": ["o_proj_gemm", "all_reduce"], "1": ["o_proj_gemm"]}
    assert out["latent"] == {"8": ["all_reduce", "latent_norm"], "1": ["latent_norm"]}
    # the switch off: vLLM's hook is its own; on: wrapped
    assert out["plugin_off"]["hook_is_vllms"] and out["plugin_on"]["wrapped"]


@pytest.fixture(scope="module")
def front() -> dict:
    python = torch_python()
    if python is None:
        pytest.skip("no interpreter with torch (run `kimictl setup cpu-runtime`)")
    return child(python, "vllm_front_src.py")


FRONT_GEMMS = {"mla": ["fused_qkv_a_g_proj", "fused_q_kv_rmsnorm", "q_b_proj"],
               "kda": ["in_proj_qkvgfab", "f_b_proj"]}  # fmt: skip


@pytest.mark.vllm_src
def test_route_runs_inside_vllms_real_attention_code(front: dict) -> None:
    cases = {(c["kind"], c["m"], c["capturing"]): c for c in front["cases"]}
    assert len(cases) == 9
    for (kind, m, capturing), c in cases.items():
        vllm, routed = c["calls"]["vllm"], c["calls"]["routed"]
        if kind == "kda" and capturing:  # vLLM's own two-stream form under graph capture
            assert vllm == ["run_kda_projection_overlap", "o_proj"]
        else:
            assert vllm == [*FRONT_GEMMS[kind], "o_proj"]
        if m in chain.SERVED_MS:  # one launch of segment f instead, then vLLM's o_proj
            assert routed == [f"chain_{kind}_f_m{m}_" + routed[0].split("_")[-1], "o_proj"]
            assert routed[0] in {c.name for c in chain.CHAIN_SHIPPED if c.seg == "f"}
        else:  # M = 3: vLLM's forward, call for call
            assert routed == vllm
        if kind == "kda":  # the overlap was held off for the routed call only
            assert c["overlap_restored"] == 14
        # every tensor handed to vLLM's attention core, and the layer's output, within bf16
        assert set(c["rel"]) == ({"q", "kv_c_normed", "k_pe", "out"} if kind == "mla" else
                                 {"mixed_qkv", "g1", "g2", "beta", "out"})  # fmt: skip
        assert max(c["rel"].values()) <= 1e-2, c
        if m not in chain.SERVED_MS:
            assert max(c["rel"].values()) == 0.0


@pytest.mark.vllm_src
def test_route_keeps_one_copy_of_the_weights_and_serves_where_it_measured_faster(front) -> None:
    # loaded after the hook, in place: the parameters are views into segment f's buffer
    assert front["weights_in_flat_buffer"] == [True, True]
    head = "attention's projections and norms before its core as one kernel; " + layer_route.REST
    assert front["logs"] == [  # at every built point (the H200 benchmark's choice), as shipped
        f"kimictl layer: segment f on 2 of 2 decoder layers (KDA 1, MLA 1) at M = 1, 2: the {head}",
        f"kimictl layer: segment f on 1 of 2 decoder layers (MLA 1) at M = 1, 2: the {head}; "
        "vLLM's forward on the rest (1 layer: " + layer_route.NOT_FASTER.format(kind="KDA") + ")",
    ]
    # as shipped: MLA at M = 1, 2, where segment f measured faster than vLLM's plan; KDA stays
    assert front["shipped"] == {"mla": [1, 2], "kda": []}
    assert layer_route.SERVED == {("mla", 1), ("mla", 2)}


@pytest.mark.vllm_src
@pytest.mark.parametrize("fact", layer_route.LAYER_FACTS, ids=lambda f: f"{f[0]}:{f[1]}")
def test_cited_vllm_lines(fact: tuple[str, int, str]) -> None:
    from tests.vllm_src import ensure_sources

    root, why = ensure_sources()
    if root is None:
        pytest.skip(why)
    path, line, text = fact
    assert text in (root / path).read_text().splitlines()[line - 1]


def test_install_puts_no_layer_where_none_can_be_had(tmp_path: Path, monkeypatch) -> None:
    """`kimictl kernels install`'s layer step without a GPU-side verify: another arch, and a
    node with neither a layer build nor the DSL (the verify-and-copy path runs on the H200)."""
    from kimictl.kernels.toolchain import build, node

    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "default_build_dir", lambda: tmp_path / "tree")
    assert node.install_layer("sm_103a") == "the fused layer is not built for sm_103a"
    monkeypatch.setattr(build, "dsl_version", lambda: None)
    said = node.install_layer("sm_90a")
    assert said.startswith(f"no layer build in {tmp_path / 'tree' / 'layer'}")
    assert said.endswith("no CuTe DSL to build one: not installed")
    assert not (tmp_path / "cache" / "kernels" / "layer").exists()
