"""Prebuilt specialized-decode units (o-proj, AttnRes) for sm_103a: the loader wrapped onto
vLLM 0.33.0's real compile functions (wheel sources, in a child process: tests/
vllm_specialized_child.py) with every fall-back to vLLM's compile, a real build of a few units
with vLLM's compile bodies and the DSL's loader reading them back, and doctor/serve finding the
sm_103a cache. Nothing here runs on Blackwell."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kimictl.deployment.profiles import load_profile
from kimictl.kernels.vllm.cache import MANIFEST, PREBUILT_FAMILIES, deployment_hash, find_cache
from kimictl.kernels.vllm.plan import CompileUnit, plan_units
from kimictl.kernels.vllm.specialized import COMPILERS, FAMILIES, vllm_args
from kimictl.runtime.checks.rules.base import Status
from kimictl.runtime.checks.rules.kernel_cache import kernel_cache_check
from kimictl.runtime.serving.prebuilt import prebuilt_choice
from tests.test_kernel_cache import _stack
from tests.vllm_src import ensure_sources

ROOT = Path(__file__).resolve().parent.parent
GB300 = (10, 3)
ARCH = "sm_103a"
PROFILE = "k3-tp8-latency"
STACK = {"cutlass_dsl": "4.8.0", "vllm": "0.33.0", "arch": ARCH}


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def sources() -> Path:
    root, why = ensure_sources()
    if root is None:
        pytest.skip(why)
    return root


def _units() -> list[CompileUnit]:
    plan = plan_units(load_profile(PROFILE).spec, arch=ARCH)
    return [u for u in plan.units if u.family in FAMILIES]


def _groups(units: list[CompileUnit]) -> dict[tuple[str, Any], list[CompileUnit]]:
    groups: dict[tuple[str, Any], list[CompileUnit]] = {}
    for u in units:
        groups.setdefault((u.family, u.effective), []).append(u)
    return groups


def _write_cache(folder: Path, groups: list[list[CompileUnit]]) -> list[dict[str, Any]]:
    """A manifest as build_specialized writes it, one object (bytes, not a real kernel) per
    group of duplicate vLLM keys."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, members in enumerate(groups):
        symbol = f"{members[0].family.replace('.', '_')}_{i:03d}"
        data = f"object {symbol}".encode()
        (folder / f"{symbol}.o").write_bytes(data)
        for u in members:
            entries.append(
                {
                    "family": u.family, "key": list(u.key), "effective": list(u.effective),
                    "object": f"{symbol}.o", "symbol": symbol, "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest()[:16], "seconds": 0.1,
                }
            )  # fmt: skip
    manifest = {**STACK, "deployment": "test", "units": entries}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return entries


def _child(sources: Path, **request: Any) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUTE_DSL_ARCH": ARCH}
    argv = [sys.executable, str(ROOT / "tests/vllm_specialized_child.py"), str(sources)]
    done = subprocess.run(
        [*argv, json.dumps(request)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cases() -> tuple[list[CompileUnit], CompileUnit, CompileUnit, CompileUnit]:
    """A consumer group with duplicate vLLM keys, one producer, one AttnRes; and a producer
    left out of the cache."""
    groups = _groups(_units())
    consumer = next(g for (f, _), g in groups.items() if f == "oproj.consumer" and len(g) > 2)
    producers = [g[0] for (f, _), g in groups.items() if f == "oproj.producer"]
    attn = next(g[0] for (f, _), g in groups.items() if f == "attn_res" and g[0].key[4] == 0)
    return consumer, producers[0], attn, producers[1]


def _call(unit: CompileUnit, arch: str = ARCH) -> list[Any]:
    return [FAMILIES[unit.family], list(vllm_args(unit.family, unit.key, arch))]


def test_the_plan_has_99_objects_for_561_vllm_keys_and_doctor_knows_the_families() -> None:
    units = _units()
    assert len(units) == 561 and len(_groups(units)) == 99
    assert set(FAMILIES) <= PREBUILT_FAMILIES  # what doctor/serve call installable
    assert {g for g, _ in COMPILERS.items()} == set(FAMILIES.values())


def test_a_manifest_hit_loads_and_never_compiles(sources: Path, tmp_path: Path) -> None:
    consumer, producer, attn, _ = _cases()
    folder = tmp_path / "units"
    _write_cache(folder, [consumer, [producer], [attn]])
    calls = [_call(u) for u in consumer[:3]] + [_call(producer), _call(consumer[0])]
    out = _child(
        sources, folder=str(folder), installed=STACK, calls=calls,
        prepared_attn_res=list(attn.key[:4]),
    )  # fmt: skip
    assert out["wrapped"] == {"oproj": True, "attn_res": True}
    # the three duplicate consumer keys share one object; the repeat is vLLM's cache at work
    assert out["results"] == [
        "loaded oproj_consumer_000", "loaded oproj_consumer_000", "loaded oproj_consumer_000",
        "loaded oproj_producer_001", "loaded oproj_consumer_000", "loaded attn_res_002",
    ]  # fmt: skip
    assert len(out["loads"]) == 5  # one per distinct vLLM key, none for the repeat
    assert not any("vLLM compiles it" in line for line in out["log"])
    assert any(f"{len(consumer) + 2} specialized decode units" in s for s in out["log"])


def test_a_miss_another_arch_a_changed_or_broken_object_fall_back(
    sources: Path, tmp_path: Path
) -> None:
    consumer, producer, attn, absent = _cases()
    folder = tmp_path / "units"
    _write_cache(folder, [consumer, [producer], [attn]])
    (folder / "oproj_producer_001.o").write_bytes(b"truncated")  # changed since the build
    calls = [_call(absent), _call(producer), _call(consumer[0]), _call(attn, "sm_100a")]
    out = _child(
        sources, folder=str(folder), installed=STACK, calls=calls,
        broken=["oproj_consumer_000"], prepared_attn_res=list(attn.key[:4]),
    )  # fmt: skip
    assert out["results"] == [
        "compiled OprojProducer",  # not in the cache: vLLM's body ran up to cute.compile
        "compiled OprojProducer",  # object changed since the build
        "compiled OprojConsumer",  # the loader raised
        "compiled ClusterAttnRes",  # vLLM asked for another arch
        "loaded attn_res_002",  # the same key on sm_103a, through vLLM's PreparedAttnRes
    ]
    why = [line.split(") ", 1)[-1] for line in out["log"] if "vLLM compiles it" in line]
    assert why[0] == "is not in the prebuilt cache; vLLM compiles it"
    assert "changed since the build" in why[1] and "JITLink: bad object" in why[2]
    assert "asks for sm_100a (cache: sm_103a)" in why[3] and len(why) == 4


def test_a_cache_for_another_stack_wraps_nothing(sources: Path, tmp_path: Path) -> None:
    consumer, producer, attn, _ = _cases()
    folder = tmp_path / "units"
    _write_cache(folder, [consumer, [producer], [attn]])
    out = _child(
        sources, folder=str(folder), installed={**STACK, "vllm": "0.33.1"},
        calls=[_call(producer)],
    )  # fmt: skip
    assert out["wrapped"] == {"oproj": False, "attn_res": False}
    assert out["results"] == ["compiled OprojProducer"] and out["loads"] == []
    assert any("another stack" in line and "0.33.1" in line for line in out["log"])


BUILD = """
import json, sys
from pathlib import Path
from kimictl.kernels.vllm.specialized import FAMILIES, build_specialized, compile_modules
from kimictl.deployment.profiles import load_profile
from kimictl.kernels.vllm.cache import deployment_hash, find_cache
from kimictl.kernels.vllm.plan import plan_units
plan = plan_units(load_profile("k3-tp8-latency").spec, arch="sm_103a")
picked, units = set(), []
for u in plan.units:  # the first effective key of each family, with all its vLLM keys
    seen = {f for f, _ in picked}
    if u.family in FAMILIES and (u.family not in seen or (u.family, u.effective) in picked):
        picked.add((u.family, u.effective)); units.append(u)
folder = find_cache(plan, dsl=sys.argv[2], vllm="0.33.0", arch="sm_103a").folder
stack = {"cutlass_dsl": sys.argv[2], "vllm": "0.33.0", "deployment": deployment_hash(plan)}
r = build_specialized(units, folder, modules=compile_modules(Path(sys.argv[1])), arch="sm_103a",
                      stack=stack)
import cutlass.cute as cute
m = json.loads((folder / "manifest.json").read_text())
fns = {type(getattr(cute.runtime.load_module(str(folder / e["object"])), e["symbol"])).__name__
       for e in m["units"]}
print(json.dumps({"folder": str(folder), "units": r.units, "objects": r.distinct,
                  "failed": r.failed, "families": r.families, "loaded": sorted(fns)}))
"""


def test_vllms_compile_bodies_build_and_export_units_the_dsl_loads_back(sources: Path) -> None:
    """A few real units (one object per family, with all its duplicate keys) through
    build_specialized with vLLM 0.33.0's compile bodies; doctor and serve then find the cache."""
    cutlass = pytest.importorskip("cutlass")
    dsl = cutlass.__version__
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUTE_DSL_ARCH": ARCH}
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(sources), dsl],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["failed"] and out["objects"] == 3
    fams = out["families"]
    assert set(fams) == {"oproj.producer", "oproj.consumer", "attn_res"}
    assert all(f["objects"] == 1 for f in fams.values()) and fams["oproj.producer"]["units"] > 1
    assert out["loaded"] == ["CudaDialectJitCompiledFunction"]
    manifest = json.loads((Path(out["folder"]) / MANIFEST).read_text())
    entry = manifest["units"][0]
    assert {"family", "key", "effective", "object", "seconds", "bytes"} <= set(entry)
    assert manifest["arch"] == ARCH and "kda_core" in manifest["jit_families"]
    spec = load_profile(PROFILE).spec
    check = kernel_cache_check(spec, _stack(dsl=dsl), GB300)
    assert check is not None and check.status is Status.PASS and out["folder"] in check.message
    versions = {"nvidia-cutlass-dsl": dsl, "vllm": "0.33.0"}
    choice = prebuilt_choice(spec, profile=PROFILE, mode="auto", versions=versions,
                             capability=GB300)  # fmt: skip
    assert choice.env == {"KIMICTL_VLLM_PREBUILT": out["folder"]}


def test_without_a_cache_doctor_and_serve_name_the_install_command_on_gb300() -> None:
    spec = load_profile(PROFILE).spec
    check = kernel_cache_check(spec, _stack(), GB300)
    assert check is not None and check.status is Status.WARN
    assert "install --vllm PROFILE` prebuilds part of them" in check.remedy
    choice = prebuilt_choice(
        spec, profile=PROFILE, mode="auto", versions={"nvidia-cutlass-dsl": "4.8.0",
        "vllm": "0.33.0"}, capability=GB300,
    )  # fmt: skip
    assert choice.env == {} and f"`kimictl kernels install --vllm {PROFILE}`" in choice.note
    plan = plan_units(spec, arch=ARCH)
    assert find_cache(plan, dsl="4.8.0", vllm="0.33.0", arch=ARCH).folder.name == (
        deployment_hash(plan)
    )
