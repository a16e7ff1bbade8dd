"""Installed stack vs vLLM 0.33.0's pins, read from package metadata without importing vllm."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimictl.runtime.checks import stack
from kimictl.runtime.checks.hardware import load_snapshots
from kimictl.runtime.checks.rules.base import Status
from kimictl.runtime.checks.rules.hardware import stack_checks

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("2.14.0", "==2.14.0", True),
        ("2.14.0+cu130", "==2.14.0", True),  # local label ignored
        ("2.13.0", "==2.14.0", False),
        ("0.7.2.post1", "==0.7.2.post1", True),
        ("0.7.2", "==0.7.2.post1", False),
        ("5.16.1", ">=5.16.1,<5.21.0", True),
        ("5.20.99", ">=5.16.1,<5.21.0", True),
        ("5.21.0", ">=5.16.1,<5.21.0", False),
        ("5.21.0rc1", ">=5.16.1,<5.21.0", False),  # PEP 440: <V excludes V's pre-releases
        ("5.20.0rc1", ">=5.16.1,<5.21.0", True),
        ("5.16.0", ">=5.16.1,<5.21.0", False),
        ("13.0.3", ">=13", True),
        ("12.9.1", ">=13", False),
        ("not-a-version", "==1", False),
    ],
)
def test_satisfies(version: str, spec: str, ok: bool) -> None:
    assert stack.satisfies(version, spec) is ok


def test_pins_are_vllm_0_33_0s() -> None:
    pins = {p.name: p.spec for p in stack.PINNED}
    assert pins["vllm"] == "==0.33.0"
    assert pins["torch"] == "==2.14.0"
    assert pins["nvidia-cutlass-dsl"] == "==4.8.0"
    assert pins["transformers"] == ">=5.16.1,<5.21.0"
    assert stack.VLLM_VERSION == "0.33.0"


def _fake_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A site-packages folder put first on sys.path (real metadata files, read by importlib)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    importlib.invalidate_caches()


def test_probe_reads_installed_versions_from_metadata() -> None:
    report = stack.probe_stack()
    for pkg in report.packages:
        try:
            installed: str | None = importlib.metadata.version(pkg.name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        assert pkg.installed == installed
        assert (pkg.status == "ok") == (
            installed is not None and stack.satisfies(installed, pkg.spec)
        )
        assert (pkg.fix == "") == (pkg.status == "ok")


def test_mismatch_names_the_exact_pip_command(site: Path) -> None:
    _fake_dist(site, "quack-kernels", "0.6.4")
    _fake_dist(site, "transformers", "5.22.0")
    report = stack.probe_stack()
    quack = report.package("quack-kernels")
    assert quack is not None and quack.status == "mismatch" and quack.installed == "0.6.4"
    assert quack.fix == "pip install quack-kernels==0.6.5"
    tf = report.package("transformers")
    assert tf is not None and tf.fix == "pip install 'transformers>=5.16.1,<5.21.0'"
    checks = {c.id: c for c in stack_checks(report)}
    assert checks["stack.quack-kernels"].status is Status.FAIL
    assert "0.6.4 installed" in checks["stack.quack-kernels"].message
    assert checks["stack.quack-kernels"].remedy == quack.fix


def test_cutlass_is_fixed_with_its_cu13_extra(site: Path) -> None:
    _fake_dist(site, "nvidia-cutlass-dsl", "4.7.0")
    pkg = stack.probe_stack().package("nvidia-cutlass-dsl")
    assert pkg is not None and pkg.status == "mismatch"
    assert pkg.fix == "pip install 'nvidia-cutlass-dsl[cu13]==4.8.0'"


def _fake_vllm(site: Path, with_path: bool) -> None:
    pkg = site / "vllm"
    pkg.mkdir()
    # Importing this package would fail loudly: the probe must only locate it.
    (pkg / "__init__.py").write_text("raise RuntimeError('vllm was imported')\n")
    if with_path:
        (pkg / stack.SPECIALIZED_DECODE_SUBPATH).mkdir(parents=True)


@pytest.mark.parametrize("with_path", [True, False])
def test_specialized_decode_found_without_importing_vllm(site: Path, with_path: bool) -> None:
    if "vllm" in sys.modules:
        pytest.skip("vllm already imported in this process")
    _fake_vllm(site, with_path)
    location, found = stack.find_specialized_decode()
    assert "vllm" not in sys.modules
    assert location == str(site / "vllm")
    if with_path:
        assert found == str(site / "vllm" / stack.SPECIALIZED_DECODE_SUBPATH)
    else:
        assert not found and "no K3 specialized decode" in str(found)
    check = next(c for c in stack_checks(stack.probe_stack()) if c.id == "stack.specialized_decode")
    assert check.status is (Status.PASS if with_path else Status.FAIL)


def test_optional_package_missing_is_a_warning() -> None:
    report = stack.StackReport(
        python="3.12.0",
        packages=[
            stack.PackageCheck(
                "cuda-bindings", ">=13", None, "missing", "pip install 'cuda-bindings>=13'", False
            )
        ],
        vllm_location=None,
        specialized_decode="/x",
    )
    (check, _) = stack_checks(report)
    assert check.status is Status.WARN and check.remedy == "pip install 'cuda-bindings>=13'"


def test_stack_report_round_trips() -> None:
    report = stack.probe_stack()
    assert stack.StackReport.from_json(report.to_json()) == report


def test_different_stacks_across_nodes_fail() -> None:
    paths = sorted((SNAPSHOTS / "gb300-tp8-healthy").glob("*.json"))
    report = load_snapshots(paths)
    node_stack = report.nodes[0].stack
    assert node_stack is not None
    same = next(
        c
        for c in stack_checks(stack.StackReport.from_json(node_stack), report)
        if c.id == "stack.same"
    )
    assert same.status is Status.PASS
    from dataclasses import replace

    changed = dict(node_stack)
    changed["packages"] = [
        dict(p, installed="2.13.0") if p["name"] == "torch" else p for p in node_stack["packages"]
    ]
    broken = replace(report, nodes=[report.nodes[0], replace(report.nodes[1], stack=changed)])
    check = next(
        c
        for c in stack_checks(stack.StackReport.from_json(node_stack), broken)
        if c.id == "stack.same"
    )
    assert check.status is Status.FAIL
    assert "torch: 2.13.0 on gb300-r07-tray02" in check.message
