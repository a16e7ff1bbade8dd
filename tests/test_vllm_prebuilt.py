"""Prebuilt vLLM skinny GEMM units: the unit set vs vLLM 0.33.0's own code, the injection into
vLLM's real ShapeDynamicSkinnyGemm and every fall-back to vLLM's JIT, the install CLI and doctor.

vLLM's sources come from the wheel (tests/vllm_k3_gemm_src.py: low_latency_gemm.py, linear.py and
skinny_gemm.py real, torch and CUDA stubbed). The real build (DSL compile with vLLM's options and
export) needs apache-tvm-ffi and quack-kernels' compile_utils importable; it is skipped without.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kimictl.deployment.profiles import load_profile
from kimictl.kernels.vllm import prebuilt as vllm_prebuilt
from kimictl.kernels.vllm.cache import MANIFEST, deployment_hash, find_cache
from kimictl.kernels.vllm.plan import plan_units
from kimictl.kernels.vllm.skinny import SM90_TABLE, skinny_units
from kimictl.runtime.checks.rules.base import Status
from kimictl.runtime.checks.rules.kernel_cache import kernel_cache_check
from tests.test_kernel_cache import _stack
from tests.vllm_k3_gemm_src import FakeTensor, World, bfloat16, ensure_sources

H200 = (9, 0)
WARMUP = "vllm/model_executor/warmup/cutedsl_warmup.py"
STACK = {"cutlass_dsl": "4.8.0", "vllm": "0.33.0", "arch": "sm_90a"}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    root, why = ensure_sources()
    if root is None:
        pytest.skip(why)
    w = World(root, monkeypatch, real_skinny=True)
    # vLLM's real warmup registry (cutedsl_warmup.py); its tracing decorator is a no-op here
    tracing = type(sys)("vllm.tracing")
    tracing.instrument = lambda **k: lambda f: f  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.tracing", tracing)
    tqdm = type(sys)("tqdm")  # progress bars only (not installed here)
    tqdm.tqdm = lambda it, **k: it  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm", tqdm)
    w.warmup = w._load(  # type: ignore[attr-defined]
        "vllm.model_executor.warmup.cutedsl_warmup", root / WARMUP, monkeypatch
    )
    return w


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _config_fields(config: Any) -> tuple[Any, ...]:
    return (
        config.num_rows, config.block_size, config.outputs_per_block, config.k_unroll,
        config.vector_width, config.static_k,
    )  # fmt: skip


def test_sm90_table_is_the_wheels(world: World) -> None:
    wheel = world.llg.KIMI_K3_PROJECTIONS_SM90
    assert set(wheel) == set(SM90_TABLE)
    for shape, spec in wheel.items():
        mine = [(m, 1 + 0, *cfg) for m, cfg in enumerate(SM90_TABLE[shape], start=1)]
        theirs = [(m, 1, *_config_fields(c)[1:5]) for m, c in spec.cute_configs]
        assert theirs == mine, shape
        assert not spec.residual_configs  # SM90 has none: no has_residual units
    kda = [*world.llg.KDA_QKVG_CONFIGS.values(), world.llg.KDA_M1_FAB_CONFIG]
    assert {_config_fields(c) for c in kda} <= {u.config for u in skinny_units("sm_90a", 8)}


def _model_with_every_shape(world: World, tp: int) -> Any:
    root = world.torch.nn.Module()
    for i, (n, k) in enumerate(SM90_TABLE):
        setattr(root, f"lin{i}", world.linear_layer(n, k))
    kda = world.KimiK3DeltaAttention()
    kda.tp_size = tp
    kda.in_proj_qkvgfab = world.linear_layer(6288, 7168)
    kda.f_b_proj = world.linear_layer(1536, 128)
    kda._projection_aux_stream = object()
    kda._projection_events = (object(), object())
    root.kda = kda
    return root


@pytest.mark.parametrize("tp", [8, 16])
def test_units_are_what_vllms_install_step_requests(world: World, tp: int) -> None:
    """vLLM's real enable_kimi_k3_low_latency_gemm over a model holding every SM90 table shape
    (plus a KDA layer at this TP) asks its real skinny singleton for exactly these keys."""
    world.capability = (9, 0)
    skinny = world.skinny_module.shape_dynamic_skinny_gemm
    world.llg.enable_kimi_k3_low_latency_gemm(_model_with_every_shape(world, tp), bfloat16)
    requested = {("bfloat16", *_config_fields(c), res) for _, c, res in skinny._warmup_configs}
    assert requested == {u.key for u in skinny_units("sm_90a", tp)}
    units = skinny.get_cutedsl_warmup_compile_units()  # what vLLM's warmup will compile
    assert len(units) == len(requested)  # 24 at TP8, 21 at TP16 (no KDA overlap)


def test_plan_lists_sm90_skinny_units_and_doctor_hashes_them() -> None:
    stock = load_profile("k3-tp8-latency-stock").spec
    assert not plan_units(stock).units  # without an arch: nothing derived
    plan = plan_units(stock, arch="sm_90a")
    assert {u.family for u in plan.units} == {"skinny_gemm"} and len(plan.units) == 24
    assert not plan_units(stock, arch="sm_103a").units  # SM103 table not derived


def _write_cache(plan: Any, units: list[Any], objects: bool = True, **override: str) -> Path:
    folder = find_cache(plan, dsl="4.8.0", vllm="0.33.0", arch="sm_90a").folder
    folder.mkdir(parents=True)
    entries = []
    for u in units:
        if objects:
            (folder / f"{u.name}.o").write_bytes(b"obj")
        entries.append(
            {"family": "skinny_gemm", "name": u.name, "key": list(u.key),
             "object": f"{u.name}.o", "symbol": u.name}
        )  # fmt: skip
    manifest = {**STACK, "deployment": deployment_hash(plan), "units": entries, **override}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_doctor_warns_then_finds_the_prebuilt_cache_on_h200() -> None:
    stock = load_profile("k3-tp8-latency-stock").spec
    assert kernel_cache_check(stock, _stack(), (10, 3)) is None  # GB300 stock: nothing derived
    check = kernel_cache_check(stock, _stack(), H200)
    assert check is not None and check.status is Status.WARN
    assert "24+ CuTe DSL units" in check.message and "install --vllm" in check.remedy
    _write_cache(plan_units(stock, arch="sm_90a"), skinny_units("sm_90a", 8) or [])
    check = kernel_cache_check(stock, _stack(), H200)
    assert check is not None and check.status is Status.PASS, check.message


class Loader:
    """Stands in for cute.runtime.load_module: a callable per object, or an error."""

    def __init__(self, broken: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.broken, self.loaded, self.calls = broken, [], []

    def __call__(self, path: Path, symbol: str) -> Any:
        if symbol in self.broken:
            raise RuntimeError("JITLink: bad object")
        self.loaded.append(symbol)

        def fn(*args: Any) -> None:
            self.calls.append((symbol, args))

        return fn


def _inject(world: World, folder: Path | None, loader: Loader, **installed: str) -> Any:
    skinny = world.skinny_module.shape_dynamic_skinny_gemm
    compiled: list[Any] = []
    skinny._compile = lambda d, c, r: compiled.append((d, c, r))  # vLLM's JIT, observed
    report = vllm_prebuilt.inject_prebuilt(
        skinny, folder, dtype=bfloat16, config_cls=world.skinny_module.SkinnyGemmConfig,
        installed={**STACK, **installed}, loader=loader,
    )  # fmt: skip
    return skinny, report, compiled


def _warm(world: World, skinny: Any) -> None:
    """vLLM's warmup: request the configs, collect the registered providers' units and call each
    unit's compile (cutedsl_warmup.py: what _compile_cutedsl_warmup_units does per unit)."""
    cfg = world.skinny_module.SkinnyGemmConfig
    configs = [cfg(*u.config) for u in skinny_units("sm_90a", 8) or []]
    skinny.request_warmup_configs(bfloat16, configs)
    warmup = world.warmup  # type: ignore[attr-defined]
    units = warmup._collect_unique_compile_units(warmup._iter_cutedsl_warmup_compile_units())
    assert len(units) == len(configs)
    for unit in units:
        unit.compile()


def test_injected_units_skip_vllms_compile_and_serve_calls(world: World) -> None:
    units = skinny_units("sm_90a", 8) or []
    plan = plan_units(load_profile("k3-tp8-latency-stock").spec, arch="sm_90a")
    loader = Loader()
    skinny, report, compiled = _inject(world, _write_cache(plan, units), loader)
    assert report.injected == report.cached_units == 24 and not report.skipped
    _warm(world, skinny)
    assert compiled == []  # warmup compiled nothing: every requested key was injected
    cfg = world.skinny_module.SkinnyGemmConfig(*units[0].config)
    skinny._stream = lambda: "stream"
    a, b = FakeTensor((cfg.num_rows, 7168)), FakeTensor((cfg.outputs_per_block * 4, 7168))
    skinny(a, b, cfg)  # vLLM's real __call__: checks, then the injected function
    assert (
        loader.calls and loader.calls[0][0] == units[0].name and loader.calls[0][1][-1] == "stream"
    )
    assert compiled == []


@pytest.mark.parametrize(
    "case",
    [
        "no_env",
        "no_manifest",
        "other_vllm",
        "other_arch",
        "other_dsl",
        "missing_unit",
        "load_error",
    ],
)
def test_every_miss_falls_back_to_vllms_jit(world: World, case: str, tmp_path: Path) -> None:
    units = skinny_units("sm_90a", 8) or []
    plan = plan_units(load_profile("k3-tp8-latency-stock").spec, arch="sm_90a")
    folder: Path | None = _write_cache(plan, units)
    installed: dict[str, str] = {}
    broken: set[str] = set()
    if case == "no_env":
        folder = None
    elif case == "no_manifest":
        folder = tmp_path / "empty"
    elif case == "other_vllm":
        installed = {"vllm": "0.33.1"}
    elif case == "other_arch":
        installed = {"arch": "sm_100a"}
    elif case == "other_dsl":
        installed = {"cutlass_dsl": "4.9.0"}
    elif case == "missing_unit":
        assert folder is not None
        (folder / f"{units[3].name}.o").unlink()
    else:
        broken = {units[5].name}
    skinny, report, compiled = _inject(world, folder, Loader(broken), **installed)
    _warm(world, skinny)
    jit = {_config_fields(c) for _, c, _ in compiled}
    if case in ("missing_unit", "load_error"):
        gone = units[3] if case == "missing_unit" else units[5]
        assert jit == {gone.config}  # only the unit the cache lacks goes to vLLM's JIT
        assert report.injected == 23
        want = "(1 missing, 0 failed" if case == "missing_unit" else "(0 missing, 1 failed"
        assert want in report.line()
    else:
        assert jit == {u.config for u in units}  # all of them: vLLM as without kimictl
        assert report.injected == 0 and report.skipped
        assert "none loaded" in report.line()
        if case.startswith("other_"):
            assert "another stack" in report.skipped


def test_plugin_loads_prebuilt_and_logs_one_line(world: World, caplog) -> None:
    units = skinny_units("sm_90a", 8) or []
    plan = plan_units(load_profile("k3-tp8-latency-stock").spec, arch="sm_90a")
    folder = _write_cache(plan, units[:2])
    with caplog.at_level(logging.INFO, logger="vllm.kimictl"):
        report = vllm_prebuilt.load_prebuilt(
            {vllm_prebuilt.PREBUILT_ENV: str(folder)}, installed=STACK, loader=Loader()
        )
    assert report is not None and report.injected == 2
    lines = [r.getMessage() for r in caplog.records if "prebuilt" in r.getMessage()]
    assert lines == [
        "kimictl prebuilt kernels: 2 of 2 skinny GEMM units loaded; vLLM compiles any other"
    ]
    assert vllm_prebuilt.load_prebuilt({}) is None


def _dsl_build_possible() -> str:
    for mod in ("tvm_ffi", "quack", "cutlass"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not importable"
    return ""


@pytest.mark.skipif(bool(_dsl_build_possible()), reason=_dsl_build_possible() or "ok")
def test_install_vllm_builds_with_vllms_compile_body_and_loads_back(tmp_path: Path) -> None:
    """The real CLI, vLLM's real compile body (from the wheel), exported, then loaded back with
    the DSL's loader (no GPU needed to load); doctor then finds the cache."""
    root, why = ensure_sources()
    if root is None:
        pytest.skip(why)
    env = {**os.environ, "KIMICTL_CACHE_DIR": os.environ["KIMICTL_CACHE_DIR"]}
    argv = [sys.executable, "-m", "kimictl", "kernels", "install", "--vllm", "k3-tp8-latency-stock"]
    argv += ["--arch", "sm_90a", "--vllm-src", str(root), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["units"] == out["compiled"] == 24 and not out["failed"]
    manifest = json.loads((Path(out["folder"]) / MANIFEST).read_text())
    assert manifest["compile_options"] == ["--enable-tvm-ffi --ptxas-options -maxrregcount=64"]
    check = kernel_cache_check(
        load_profile("k3-tp8-latency-stock").spec, _stack(dsl=out["cutlass_dsl"]), H200
    )
    assert check is not None and check.status is Status.PASS
    probe = (
        "import sys, json; from pathlib import Path; import tvm_ffi; import cutlass.cute as cute\n"
        "m = json.loads(Path(sys.argv[1], 'manifest.json').read_text())\n"
        "fns = [getattr(cute.runtime.load_module(str(Path(sys.argv[1], u['object'])),"
        " enable_tvm_ffi=True), u['symbol']) for u in m['units']]\n"
        "print(len(fns), type(fns[0]).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, out["folder"]], capture_output=True,
                          text=True, env=env, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["24", "Function"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kimictl", "kernels", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_install_vllm_refusals_say_one_thing() -> None:
    done = _cli("install", "--arch", "sm_90a")  # --arch without --vllm: bad input
    assert done.returncode == 2 and "apply to --vllm PROFILE only" in done.stderr
    done = _cli("install", "--vllm", "k3-tp8-latency-stock", "--arch", "sm_103a")
    assert done.returncode == 1 and "no vLLM 0.33 unit" in done.stderr  # nothing derived there
    done = _cli("install", "--vllm", "k3-tp8-latency", "--arch", "sm_80")
    assert done.returncode == 2 and "sm_80" in done.stderr
    done = _cli("install", "--vllm", "k3-tp8-latency", "--arch", "sm_90a", "--vllm-src", "/nope")
    assert done.returncode == 2 and "no such folder" in done.stderr


def test_plan_arch_lists_the_skinny_family() -> None:
    done = _cli("plan", "k3-tp8-latency-stock", "--arch", "sm_90a", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    fams = {f["family"]: f for f in doc["families"]}
    assert doc["arch"] == "sm_90a" and fams["skinny_gemm"]["units"] == 24
    assert json.loads(_cli("plan", "k3-tp8-latency-stock", "--json").stdout)["families"] == []


def test_plugin_checks_this_process_stack_by_default(world: World) -> None:
    """Without `installed`, the plugin reads this process's versions (vLLM is not installed here)
    and arch (vLLM's platform): a cache for vLLM 0.33.0 on sm_90a is refused, nothing injected."""
    units = skinny_units("sm_90a", 8) or []
    plan = plan_units(load_profile("k3-tp8-latency-stock").spec, arch="sm_90a")
    folder = _write_cache(plan, units[:2])
    loader = Loader()
    report = vllm_prebuilt.load_prebuilt({vllm_prebuilt.PREBUILT_ENV: str(folder)}, loader=loader)
    assert report is not None and report.injected == 0 and loader.loaded == []
    assert "another stack" in report.skipped and "vllm '0.33.0'" in report.skipped
    assert not world.skinny_module.shape_dynamic_skinny_gemm._compiled
