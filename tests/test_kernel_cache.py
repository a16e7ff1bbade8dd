"""doctor's prebuilt-kernel-cache rule and the versioned cache layout (kernels.vllm.cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimictl.deployment.profiles import load_profile
from kimictl.kernels.vllm.cache import MANIFEST, deployment_hash, find_cache
from kimictl.kernels.vllm.plan import plan_units
from kimictl.runtime.checks.rules.base import Status
from kimictl.runtime.checks.rules.kernel_cache import CHECK_ID, kernel_cache_check
from kimictl.runtime.checks.stack import PackageCheck, StackReport

GB300 = (10, 3)


def _stack(dsl: str | None = "4.8.0", vllm: str | None = "0.33.0") -> StackReport:
    def pkg(name: str, version: str | None) -> PackageCheck:
        status = "ok" if version else "missing"
        return PackageCheck(name, "==x", version, status, "")  # type: ignore[arg-type]

    packages = [pkg("vllm", vllm), pkg("nvidia-cutlass-dsl", dsl)]
    return StackReport("3.11", packages, None, "specialized_decode")


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path))
    return tmp_path


def _write_manifest(folder: Path, **fields: str) -> None:
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps(fields))


def _manifest_for(plan, **override: str) -> tuple[Path, dict[str, str]]:  # type: ignore[no-untyped-def]
    lookup = find_cache(plan, dsl="4.8.0", vllm="0.33.0", arch="sm_103a")
    fields = {"cutlass_dsl": "4.8.0", "vllm": "0.33.0", "arch": "sm_103a"}
    fields["deployment"] = deployment_hash(plan)
    fields.update(override)
    return lookup.folder, fields


def test_no_deployment_or_stock_decode_says_nothing() -> None:
    assert kernel_cache_check(None, _stack(), GB300) is None
    stock = load_profile("k3-tp8-latency-stock").spec
    assert kernel_cache_check(stock, _stack(), GB300) is None


def test_unknown_without_vllm_or_gpu() -> None:
    spec = load_profile("k3-tp8-latency").spec
    check = kernel_cache_check(spec, _stack(vllm=None), GB300)
    assert check is not None and check.status is Status.UNKNOWN and check.id == CHECK_ID
    assert "without vllm" in check.message
    check = kernel_cache_check(spec, _stack(), None)
    assert check is not None and check.status is Status.UNKNOWN and "GPU arch" in check.message


def test_snapshots_are_not_read_for_a_disk_cache() -> None:
    spec = load_profile("k3-tp8-latency").spec
    check = kernel_cache_check(spec, _stack(), GB300, live=False)
    assert check is not None and check.status is Status.UNKNOWN and "snapshot" in check.message


def test_missing_cache_warns_with_the_versioned_folder_and_unit_count(cache_home: Path) -> None:
    spec = load_profile("k3-tp8-latency").spec
    check = kernel_cache_check(spec, _stack(), GB300)
    assert check is not None and check.status is Status.WARN
    folder = cache_home / "cute-dsl" / "dsl4.8.0-vllm0.33.0-sm_103a"
    assert str(folder) in check.message
    assert f"{len(plan_units(spec).units)}+ CuTe DSL units" in check.message
    assert "CUTE_DSL_CACHE_DIR" in check.remedy


def test_matching_manifest_passes() -> None:
    spec = load_profile("k3-tp8-latency").spec
    folder, fields = _manifest_for(plan_units(spec))
    _write_manifest(folder, **fields)
    check = kernel_cache_check(spec, _stack(), GB300)
    assert check is not None and check.status is Status.PASS and str(folder) in check.message


def test_manifest_for_another_dsl_build_is_refused() -> None:
    spec = load_profile("k3-tp8-latency").spec
    folder, fields = _manifest_for(plan_units(spec), cutlass_dsl="4.7.0")
    _write_manifest(folder, **fields)
    check = kernel_cache_check(spec, _stack(), GB300)
    assert check is not None and check.status is Status.WARN
    assert "cutlass_dsl '4.7.0' (want '4.8.0')" in check.message


def test_cache_of_another_deployment_or_stack_is_named_not_used() -> None:
    tp8, tp16 = (load_profile(n).spec for n in ("k3-tp8-latency", "k3-tp16-latency"))
    assert deployment_hash(plan_units(tp8)) != deployment_hash(plan_units(tp16))
    assert deployment_hash(plan_units(tp8)) == deployment_hash(plan_units(tp8))
    folder, fields = _manifest_for(plan_units(tp16))
    _write_manifest(folder, **fields)
    check = kernel_cache_check(tp8, _stack(), GB300)
    assert check is not None and check.status is Status.WARN
    assert f"dsl4.8.0-vllm0.33.0-sm_103a/{fields['deployment']}" in check.message
    # and the same cache under a newer vLLM: the folder name differs, so it is not found
    check = kernel_cache_check(tp16, _stack(vllm="0.34.0"), GB300)
    assert check is not None and check.status is Status.WARN
