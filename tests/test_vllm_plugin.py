"""kimictl's vLLM plugin against vLLM 0.33.0's real low_latency_gemm.py and linear.py.

The sources come from the vLLM wheel (tests/vllm_k3_gemm_src.py; torch and CUDA are stubbed).
vLLM's own `enable_kimi_k3_low_latency_gemm` installs its SM90 plans first; the plugin's wrapper
then re-routes only the (module, M) points a node table measured faster than vLLM's plan. Each
forward below records which path served it, so every route and every fall-through is observed.
"""

from __future__ import annotations

import copy
import json
import logging
import tomllib
import types
from pathlib import Path

import pytest

from kimictl.kernels.toolchain.dispatch import DispatchTable, Measurement
from kimictl.kernels.vllm import plugin as vllm_plugin
from tests.vllm_k3_gemm_src import FakeTensor, World, bfloat16, ensure_sources, float16

ROOT = Path(__file__).resolve().parents[1]
QKV_A = (2112, 7168)  # vLLM SM90: CuTe at M1..4, dsv3_fused_a at M5..16
O_PROJ = (7168, 1536)  # vLLM SM90: CuTe at M1..2, its cuBLAS fallback above
ROUTER = (896, 7168)  # not in vLLM's table: UnquantizedLinearMethod (cuBLAS)
LM_HEAD = (20480, 7168)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    root, why = ensure_sources()
    if root is None:
        pytest.skip(why)
    return World(root, monkeypatch)


def table(
    *rows: tuple[tuple[int, int], int, float | None, float, dict[str, float]],
) -> DispatchTable:
    t = DispatchTable("NVIDIA H200", "sm_90a")
    for (n, k), m, vllm_us, cublas_us, kernels in rows:
        t.add(Measurement(n, k, m, cublas_us, kernels, vllm_us=vllm_us))
    return t


NODE = table(
    (QKV_A, 1, 10.0, 12.0, {"wstream_m1_a": 8.0}),  # kimictl fastest
    (QKV_A, 4, 10.0, 9.0, {"tcstream_m4_a": 11.0}),  # cuBLAS fastest
    (QKV_A, 8, 9.0, 12.0, {"wgmma_m8_a": 9.5}),  # vLLM's dsv3 fastest
    (QKV_A, 16, 9.0, 12.0, {"wgmma_m16_a": 9.0}),  # a tie keeps vLLM's plan
    (QKV_A, 2, None, 12.0, {"wstream_m2_a": 1.0}),  # two-way only: vLLM's plan not timed
    (O_PROJ, 4, 7.0, 7.0, {"wgmma_m4_o": 5.0}),  # above vLLM's CuTe M: its cuBLAS fallback
    (ROUTER, 1, 6.0, 6.0, {"wstream_m1_r": 4.0}),
    (LM_HEAD, 1, 70.0, 78.0, {"wstream_m1_h": 65.0}),
)


def model(world: World, dtype: object = bfloat16) -> types.SimpleNamespace:
    root = world.torch.nn.Module()
    root.qkv_a = world.linear_layer(*QKV_A)
    root.o_proj = world.linear_layer(*O_PROJ)
    root.router = world.linear_layer(*ROUTER)
    root.lm_head = world.lm_head(*LM_HEAD)
    root.quantized = world.linear_layer(*QKV_A, quant_method=types.SimpleNamespace())
    return root


def install(world: World, root: object, node: DispatchTable | None = NODE, dtype: object = None):
    vllm_plugin.patch_vllm(world.llg, table_loader=lambda: node, register_ops=lambda: None)
    world.llg.enable_kimi_k3_low_latency_gemm(root, dtype or bfloat16)


def run(world: World, layer: object, m: int, **x_kw: object) -> str:
    k = layer.weight.shape[1]  # type: ignore[attr-defined]
    x = FakeTensor((m, k), **x_kw)  # type: ignore[arg-type]
    return layer.quant_method.apply(layer, x).made_by  # type: ignore[attr-defined]


def test_every_m_runs_the_fastest_of_vllm_kimictl_cublas(world: World, caplog) -> None:
    root = model(world)
    with caplog.at_level(logging.INFO, logger="vllm.kimictl"):
        install(world, root)
    # vLLM's own install step ran first: its method class, with the plugin's apply on top
    assert isinstance(root.qkv_a.quant_method, world.llg.KimiK3LowLatencyLinearMethod)
    assert type(root.qkv_a.quant_method).__name__ == "KimictlKimiK3LowLatencyLinearMethod"
    qkv = {m: run(world, root.qkv_a, m) for m in range(1, 17)}
    assert qkv[1] == "kimictl:wstream_m1_a"
    assert qkv[4] == "cublas"
    assert qkv[8] == "vllm-dsv3" and qkv[16] == "vllm-dsv3"  # vLLM faster / tied
    assert qkv[2] == "vllm-cute"  # vLLM's plan not timed at M=2: vLLM's plan
    assert qkv[3] == "vllm-cute" and qkv[12] == "vllm-dsv3"  # not measured at all
    # o_proj M=4: vLLM's plan there is its cuBLAS fallback, measured slower than the kernel
    assert run(world, root.o_proj, 4) == "kimictl:wgmma_m4_o"
    assert run(world, root.o_proj, 1) == "vllm-cute"
    # a linear vLLM left on cuBLAS and the LM head are routed too
    assert run(world, root.router, 1) == "kimictl:wstream_m1_r"
    assert run(world, root.router, 2) == "cublas"  # vLLM's UnquantizedLinearMethod
    assert isinstance(root.lm_head.quant_method, world.llg.KimiK3LowLatencyEmbeddingMethod)
    assert run(world, root.lm_head, 1) == "kimictl:wstream_m1_h"
    # a quantized linear is never touched
    assert type(root.quantized.quant_method) is types.SimpleNamespace
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm.kimictl"]
    assert len(lines) == 1
    assert lines[0].startswith("kimictl kernels: 5 (module, M) routes on 4 modules")


KDA_IN, F_B = (6288, 7168), (1536, 128)  # a TP8 KDA layer's two input projections


def test_kda_projections_vllm_runs_on_two_streams_stay_with_vllm(world: World, caplog) -> None:
    # vLLM's install step enables its two-stream projection overlap on a TP8 KDA layer: under
    # CUDA-graph capture, up to M = 14, it runs in_proj_qkvgfab and f_b_proj itself, so the
    # bench's vLLM time there is not what vLLM runs; those points stay vLLM's, above them the
    # table decides as anywhere else
    root = world.torch.nn.Module()
    kda = world.KimiK3DeltaAttention()
    kda.tp_size = 8
    kda.in_proj_qkvgfab = world.linear_layer(*KDA_IN)
    kda.f_b_proj = world.linear_layer(*F_B)
    kda._projection_aux_stream, kda._projection_events = object(), (object(), object())
    root.kda = kda
    node = table(
        (KDA_IN, 1, 30.0, 33.0, {"wstream_m1_k": 20.0}),
        (KDA_IN, 8, 31.0, 33.0, {"wgmma_m8_k": 25.0}),
        (KDA_IN, 16, 31.0, 33.0, {"wgmma_m16_k": 25.0}),
        (KDA_IN, 32, 34.0, 34.0, {"wgmma_m32_k": 28.0}),
        (F_B, 1, 3.0, 3.0, {"wgmma_m1_f": 2.0}),
    )
    with caplog.at_level(logging.INFO, logger="vllm.kimictl"):
        install(world, root, node)
    assert kda._projection_overlap_max_tokens > 0  # vLLM's real install step turned it on
    assert not run(world, kda.in_proj_qkvgfab, 1).startswith("kimictl")
    assert not run(world, kda.in_proj_qkvgfab, 8).startswith("kimictl")
    assert not run(world, kda.f_b_proj, 1).startswith("kimictl")
    assert run(world, kda.in_proj_qkvgfab, 16) == "kimictl:wgmma_m16_k"
    # M = 32: vLLM's plan is its cuBLAS fallback, timed as such by the bench
    assert run(world, kda.in_proj_qkvgfab, 32) == "kimictl:wgmma_m32_k"
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm.kimictl"]
    assert lines[0].startswith("kimictl kernels: 2 (module, M) routes on 1 modules")
    assert "3 (module, M) points left to vLLM's KDA projection overlap" in lines[0]


@pytest.mark.parametrize(
    ("what", "x_kw", "bias"),
    [
        ("bias", {}, True),
        ("fp16 activations", {"dtype_": float16}, False),
        ("not packed row-major", {"stride": (7168 * 2, 1)}, False),
        ("on the CPU", {"device": "cpu"}, False),
    ],
)
def test_runtime_fall_through_to_vllms_plan(world: World, what, x_kw, bias) -> None:
    root = model(world)
    install(world, root)
    layer = root.qkv_a
    x = FakeTensor((1, 7168), **x_kw)
    out = layer.quant_method.apply(layer, x, FakeTensor((2112,)) if bias else None)
    assert not out.made_by.startswith("kimictl"), what
    assert "kimictl:wstream_m1_a" not in world.calls


def test_batch_invariant_at_runtime_falls_through(world: World) -> None:
    root = model(world)
    install(world, root)
    world.envs.VLLM_BATCH_INVARIANT = True
    assert run(world, root.router, 1) == "vllm-batch-invariant"


def test_residual_form_stays_on_vllms_path(world: World) -> None:
    root = model(world)
    install(world, root)
    layer = root.qkv_a
    x, r = FakeTensor((1, 7168)), FakeTensor((1, 2112))
    assert layer.quant_method.apply_with_residual(layer, x, r).made_by == "cublas-addmm"


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("fp16 model", "dtype torch.float16 is not bfloat16"),
        ("batch invariant", "VLLM_BATCH_INVARIANT is set"),
        ("no table", "no kimictl dispatch table for this GPU"),
    ],
)
def test_install_fall_through(world: World, case: str, expect: str) -> None:
    root = model(world)
    before = {name: type(c.quant_method) for name, c in root._children.items()}
    node = None if case == "no table" else NODE
    if case == "batch invariant":
        world.envs.VLLM_BATCH_INVARIANT = True
    report = vllm_plugin.take_over(
        world.llg, root, float16 if case == "fp16 model" else bfloat16, table=node
    )
    assert report.skipped == expect and report.installed == 0
    assert {name: type(c.quant_method) for name, c in root._children.items()} == before


def test_two_way_table_keeps_vllms_plan_everywhere(world: World) -> None:
    two_way = DispatchTable("NVIDIA H200", "sm_90a")
    for m in range(1, 17):
        two_way.add(Measurement(*QKV_A, m, 12.0, {"wstream_fast": 1.0}))
    root = model(world)
    world.llg.enable_kimi_k3_low_latency_gemm(root, bfloat16)
    report = vllm_plugin.take_over(world.llg, root, bfloat16, table=two_way)
    assert (report.installed, report.kept) == (0, 3)  # qkv_a, o_proj, lm_head planned by vLLM
    assert type(root.qkv_a.quant_method) is world.llg.KimiK3LowLatencyLinearMethod


def test_fp16_weight_is_left_alone(world: World) -> None:
    root = world.torch.nn.Module()
    root.router = world.linear_layer(*ROUTER)
    root.router.weight = FakeTensor(ROUTER, float16)
    report = vllm_plugin.take_over(world.llg, root, bfloat16, table=NODE)
    assert report.installed == 0
    assert type(root.router.quant_method) is world.linear.UnquantizedLinearMethod


def test_patch_rebinds_names_and_is_idempotent(world: World) -> None:
    original = world.llg.enable_kimi_k3_low_latency_gemm
    bound = {
        name: types.SimpleNamespace(enable_kimi_k3_low_latency_gemm=original)
        for name in vllm_plugin.BOUND_IN
    }
    assert vllm_plugin.patch_vllm(world.llg, table_loader=lambda: NODE, modules=bound)
    wrapped = world.llg.enable_kimi_k3_low_latency_gemm
    assert wrapped is not original and wrapped.__wrapped__ is original
    assert all(m.enable_kimi_k3_low_latency_gemm is wrapped for m in bound.values())
    assert not vllm_plugin.patch_vllm(world.llg, table_loader=lambda: NODE)
    assert world.llg.enable_kimi_k3_low_latency_gemm is wrapped


def test_a_broken_table_leaves_vllms_plan(world: World, caplog) -> None:
    def broken() -> DispatchTable:
        raise ValueError("dispatch.json: bad entry")

    root = model(world)
    vllm_plugin.patch_vllm(world.llg, table_loader=broken, register_ops=lambda: None)
    with caplog.at_level(logging.WARNING, logger="vllm.kimictl"):
        world.llg.enable_kimi_k3_low_latency_gemm(root, bfloat16)
    assert type(root.qkv_a.quant_method) is world.llg.KimiK3LowLatencyLinearMethod
    assert "bad entry" in caplog.text


def test_register_is_off_by_default_and_on_with_the_env(world, monkeypatch, tmp_path) -> None:
    from kimictl.kernels.toolchain import torch_ops

    original = world.llg.enable_kimi_k3_low_latency_gemm
    monkeypatch.delenv(vllm_plugin.ENV_VAR, raising=False)
    vllm_plugin.register()
    assert world.llg.enable_kimi_k3_low_latency_gemm is original
    path = tmp_path / "dispatch.json"
    NODE.save(path)
    monkeypatch.setenv(vllm_plugin.ENV_VAR, "1")
    monkeypatch.setenv(vllm_plugin.TABLE_ENV_VAR, str(path))
    monkeypatch.setattr(torch_ops, "_state", {})
    vllm_plugin.register()
    root = model(world)
    world.llg.enable_kimi_k3_low_latency_gemm(root, bfloat16)
    assert run(world, root.qkv_a, 1) == "kimictl:wstream_m1_a"
    # the kimictl op was defined through torch.library with a fake (meta) implementation
    registered = world.torch.library.registered
    assert torch_ops.OP_NAME in registered and f"{torch_ops.OP_NAME}/fake" in registered
    fake = registered[f"{torch_ops.OP_NAME}/fake"](FakeTensor((3, 7168)), FakeTensor(QKV_A), "v")
    assert fake.shape == (3, 2112)


def test_choose3_never_picks_slower_than_vllm() -> None:
    for (n, k, m, _), meas in NODE.measurements.items():
        c = NODE.choose3(n, k, m)
        if meas.vllm_us is None:
            assert c.provider == "vllm"
        else:
            assert c.us is not None and c.us <= meas.vllm_us


def test_choose3_keeps_vllms_plan_unless_clearly_faster() -> None:
    from kimictl.kernels.toolchain.dispatch import VLLM_MARGIN

    t = table(
        (QKV_A, 8, 10.0, 12.0, {"wgmma_m8_a": 10.0 * (1 - VLLM_MARGIN / 2)}),  # within noise
        (QKV_A, 16, 10.0, 12.0, {"wgmma_m16_a": 10.0 * (1 - 2 * VLLM_MARGIN)}),
    )
    kept = t.choose3(*QKV_A, 8)
    assert kept.provider == "vllm" and kept.us == 10.0 and "faster" in kept.reason
    assert t.choose3(*QKV_A, 16).name == "wgmma_m16_a"


def test_table_round_trips_vllm_times(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    NODE.save(path)
    raw = json.loads(path.read_text())
    assert sum("vllm_us" in e for e in raw["entries"]) == 7
    again = DispatchTable.load(path)
    assert again.measurements == NODE.measurements


def test_entry_point_declared_and_resolves() -> None:
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    target = eps[vllm_plugin.GROUP][vllm_plugin.ENTRY_POINT]
    module, _, attr = target.partition(":")
    import importlib

    assert getattr(importlib.import_module(module), attr) is vllm_plugin.register


def test_plugin_module_imports_without_torch_or_vllm() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kimictl.kernels.vllm.plugin as p; p.register(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm')))"
    )
    env = {"PYTHONPATH": str(ROOT), vllm_plugin.ENV_VAR: "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_profile_field_renders_the_env(tmp_path: Path) -> None:
    from kimictl.core.errors import InputError
    from kimictl.deployment.profiles import load_profile

    on = tmp_path / "on.toml"
    on.write_text('[model]\nname = "m"\n[serve]\nkimictl_kernels = true\n')
    assert load_profile(on).spec.env[vllm_plugin.ENV_VAR] == "1"
    off = tmp_path / "off.toml"
    off.write_text('[model]\nname = "m"\n[serve]\nkimictl_kernels = false\n')
    assert vllm_plugin.ENV_VAR not in load_profile(off).spec.env
    clash = tmp_path / "clash.toml"
    clash.write_text(
        '[model]\nname = "m"\n[serve]\nkimictl_kernels = true\n'
        f'[env]\n{vllm_plugin.ENV_VAR} = "0"\n'
    )
    with pytest.raises(InputError, match="kimictl_kernels = true but"):
        load_profile(clash)


@pytest.mark.parametrize(
    ("installed", "env", "has_table", "status"),
    [
        (False, {}, False, "unknown"),
        (False, {"KIMICTL_VLLM_KERNELS": "1"}, False, "warn"),
        (True, {}, False, "pass"),
        (True, {"KIMICTL_VLLM_KERNELS": "1"}, False, "warn"),
        (True, {"KIMICTL_VLLM_KERNELS": "1"}, True, "pass"),
    ],
)
def test_doctor_check(monkeypatch, tmp_path, installed, env, has_table, status) -> None:
    import importlib.metadata

    ep = importlib.metadata.EntryPoint(
        vllm_plugin.ENTRY_POINT, "kimictl.kernels.vllm.plugin:register", vllm_plugin.GROUP
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ep] if installed else [])
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path))
    if has_table:
        from kimictl.kernels.toolchain.node import dispatch_table_path

        dispatch_table_path("sm_90a").parent.mkdir(parents=True)
        NODE.save(dispatch_table_path("sm_90a"))
    from kimictl.runtime.checks.rules.plugin import plugin_check

    check = plugin_check(env, "sm_90a")
    assert check.status.value == status
    assert not check.blocking
    if has_table:
        assert "has 7 points timed against vLLM's plan" in check.message


def test_bench_times_vllms_own_plan(world: World) -> None:
    from kimictl.kernels.toolchain.bench import vllm_plan

    run3 = vllm_plan(world.llg)
    assert run3 is not None
    w_qkv, w_o = FakeTensor(QKV_A), FakeTensor(O_PROJ)
    assert run3(FakeTensor((1, 7168)), w_qkv).made_by == "vllm-cute"  # SM90 table: CuTe at M1
    assert run3(FakeTensor((8, 7168)), w_qkv).made_by == "vllm-dsv3"  # dsv3_fused_a at M8
    assert run3(FakeTensor((4, 1536)), w_o).made_by == "cublas"  # no plan entry: fallback
    assert run3(FakeTensor((1, 7168), float16), w_qkv).made_by == "cublas"
    world.capability = (8, 0)  # no vLLM table for this GPU: the bench stays two-way
    assert vllm_plan(world.llg) is None


def test_doctor_reports_the_plugin(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KIMICTL_CACHE_DIR": str(tmp_path),
        vllm_plugin.ENV_VAR: "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", "doctor", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    checks = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
    plugin = checks["kernels.vllm_plugin"]
    # enabled here, but either not installed in this environment or without a table: a warning
    assert plugin["status"] == "warn" and plugin["section"] == "Software stack"
    assert "enabled" in plugin["message"] or "not installed" in plugin["message"]


def test_layer_chain_plan_routes_cells_vllm_won_alone(world: World) -> None:
    from kimictl.kernels.toolchain.dispatch import CHAIN_KIMICTL, CHAIN_VLLM

    node = copy.deepcopy(NODE)
    node.set_chain(8, CHAIN_KIMICTL)  # kimictl's whole layer measured faster at M=8
    node.set_chain(1, CHAIN_VLLM)  # vLLM's whole layer measured faster at M=1
    root = model(world)
    install(world, root, node)
    # qkv_a M=8: vLLM's dsv3 kernel won this cell alone, kimictl's chain won the layer
    assert run(world, root.qkv_a, 8) == "kimictl:wgmma_m8_a"
    assert run(world, root.qkv_a, 16) == "vllm-dsv3"  # M=16 keeps the per-cell rule
    assert run(world, root.qkv_a, 1) == "vllm-cute"  # kimictl won this cell, vLLM's layer won
    assert run(world, root.router, 1) == "cublas"  # vLLM's plan for the router: its fallback


def test_doctor_from_a_snapshot_reads_the_recorded_plugin_not_this_machine(
    tmp_path: Path,
) -> None:
    """`--save-snapshot` records the node's plugin install; `--from-snapshot` reports that one on
    any machine, and UNKNOWN for a snapshot that predates the record (never this machine's)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIMICTL_CACHE_DIR": str(tmp_path)}
    env.pop(vllm_plugin.ENV_VAR, None)

    def doctor(*args: str) -> dict:  # type: ignore[type-arg]
        done = subprocess.run(
            [sys.executable, "-m", "kimictl", "doctor", "--json", *args],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        return {c["id"]: c for c in json.loads(done.stdout)["checks"]}

    snap = tmp_path / "node.json"
    live = doctor("--save-snapshot", str(snap))["kernels.vllm_plugin"]
    raw = json.loads(snap.read_text())
    recorded = raw["nodes"][0]["stack"]["kimictl_plugin"]
    assert recorded["installed"] is ("not installed" not in live["message"])
    # the recorded node said "not installed": this machine's own install must not show through
    raw["nodes"][0]["stack"]["kimictl_plugin"] = {**recorded, "installed": False}
    snap.write_text(json.dumps(raw))
    seen = doctor("--from-snapshot", str(snap))["kernels.vllm_plugin"]
    assert "is not installed" in seen["message"] and seen["status"] == "unknown"
    del raw["nodes"][0]["stack"]["kimictl_plugin"]  # a snapshot from before the record
    snap.write_text(json.dumps(raw))
    old = doctor("--from-snapshot", str(snap))["kernels.vllm_plugin"]
    assert old["status"] == "unknown" and "not recorded in the snapshot" in old["message"]
