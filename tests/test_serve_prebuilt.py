"""`kimictl serve` and the node's prebuilt CuTe unit cache (runtime.serving.prebuilt): the lookup
(doctor's), the KIMICTL_VLLM_PREBUILT it adds to vLLM's environment, the profile's
`[serve] prebuilt_units` switch, and (slow) kimictl's plugin inside the real vLLM CPU server with
the variable set, falling back to vLLM's JIT."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import httpx
import pytest
from conftest import start_cpu_server_retrying, stop_cpu_server

import kimictl
from kimictl.cli import main
from kimictl.core.errors import InputError
from kimictl.deployment.profiles import load_profile, shipped_profiles_dir
from kimictl.deployment.spec import PREBUILT_ENV_VAR
from kimictl.kernels.vllm.cache import MANIFEST, deployment_cache
from kimictl.runtime.checks import hardware
from kimictl.runtime.checks.rules.kernel_cache import kernel_cache_check, node_capability
from kimictl.runtime.serving import workflow
from kimictl.runtime.serving.prebuilt import PrebuiltChoice, prebuilt_choice
from tests.test_kernel_cache import _stack

ROOT = Path(__file__).resolve().parent.parent
H200_SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "h200-real.json"
H200 = (9, 0)
VERSIONS = {"nvidia-cutlass-dsl": "4.8.0", "vllm": "0.33.0"}
PROFILE = "k3-tp8-latency"
_CACHE_DIR = os.environ.get("KIMICTL_CACHE_DIR")  # as the session found it


@pytest.fixture(autouse=True)
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    return tmp_path


def _build_cache(spec, versions=VERSIONS, capability=H200, folder=None, **override: str) -> Path:  # type: ignore[no-untyped-def]
    """A manifest where `kimictl kernels install --vllm` writes it (or in `folder`), with
    vllm_prebuilt.build_skinny's fields for the stack given; `override` changes a field."""
    from kimictl.kernels.vllm.cache import deployment_hash

    cache = deployment_cache(spec, versions=versions, capability=capability)
    assert cache is not None and cache.lookup is not None
    fields = {
        "cutlass_dsl": versions["nvidia-cutlass-dsl"],
        "vllm": versions["vllm"],
        "arch": cache.arch,
        "deployment": deployment_hash(cache.plan),
        "units": [],
        **override,
    }
    folder = folder or cache.lookup.folder
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps(fields))
    return folder


def _choice(spec, mode: str = "auto", versions=VERSIONS, capability=H200):  # type: ignore[no-untyped-def]
    return prebuilt_choice(
        spec, profile=PROFILE, mode=mode, versions=versions, capability=capability
    )


# ---------------------------------------------------------------- the lookup and the env


def test_no_cache_names_the_install_command_and_adds_nothing(homes: Path) -> None:
    spec = load_profile(PROFILE).spec
    choice = _choice(spec)
    assert choice.env == {}
    assert f"`kimictl kernels install --vllm {PROFILE}`" in choice.note
    assert str(homes / "cache" / "cute-dsl" / "dsl4.8.0-vllm0.33.0-sm_90a") in choice.note
    units = len(deployment_cache(spec, versions=VERSIONS, capability=H200).plan.units)  # type: ignore[union-attr]
    assert f"vLLM compiles {units}+ units" in choice.note


def test_a_matching_cache_is_handed_to_vllm(homes: Path) -> None:
    spec = load_profile(PROFILE).spec
    folder = _build_cache(spec)
    choice = _choice(spec)
    assert choice.env == {PREBUILT_ENV_VAR: str(folder)}
    assert str(folder) in choice.note and "plugin loads them" in choice.note
    # doctor's rule reads the same lookup: it passes on the same folder
    check = kernel_cache_check(spec, _stack(), H200)
    assert check is not None and str(folder) in check.message and check.status.value == "pass"


def test_a_cache_for_another_stack_or_deployment_is_not_used() -> None:
    tp8, tp16 = load_profile(PROFILE).spec, load_profile("k3-tp16-latency").spec
    _build_cache(tp16)  # another unit set: another deployment hash
    assert _choice(tp16).env != {}
    assert _choice(tp8).env == {} and "install --vllm" in _choice(tp8).note
    _build_cache(tp8, vllm="0.33.1")  # tp8's folder, but the manifest names another vLLM
    assert _choice(tp8).env == {}
    # the installed vLLM moved on: the cache built for 0.33.0 no longer matches
    assert _choice(tp16, versions={**VERSIONS, "vllm": "0.33.1"}).env == {}


def test_off_and_the_profiles_own_env_win_over_the_lookup() -> None:
    spec = load_profile(PROFILE).spec
    _build_cache(spec)
    off = _choice(spec, mode="off")
    assert off.env == {} and 'prebuilt_units = "off"' in off.note
    mine = spec.with_(env={**spec.env, PREBUILT_ENV_VAR: "/data/units"})
    given = _choice(mine)
    assert given.env == {} and "/data/units" in given.note and "[env]" in given.note


def test_nothing_to_say_without_cute_units_and_a_line_without_a_gpu() -> None:
    stock = load_profile("k3-tp8-latency-stock").spec
    assert _choice(stock, capability=(10, 3)) == PrebuiltChoice()  # stock decode: no CuTe units
    blind = _choice(load_profile(PROFILE).spec, versions={}, capability=None)
    assert blind.env == {}
    assert "cannot look without nvidia-cutlass-dsl, vllm, GPU arch" in blind.note


def test_a_matching_cache_is_not_handed_to_a_vllm_without_the_plugin(homes: Path) -> None:
    spec = load_profile(PROFILE).spec
    folder = _build_cache(spec)
    python = "/opt/vllm-env/bin/python"
    choice = prebuilt_choice(
        spec, profile=PROFILE, mode="auto", versions=VERSIONS, capability=H200,
        plugin_check=lambda: (False, python),
    )  # fmt: skip
    assert choice.env == {}
    assert str(folder) in choice.note and f"({python})" in choice.note
    assert f"`{python} -m pip install kimictl`" in choice.note
    for answer in ((True, python), (None, "vllm")):  # has it, or cannot tell: hand it over
        kept = prebuilt_choice(
            spec, profile=PROFILE, mode="auto", versions=VERSIONS, capability=H200,
            plugin_check=lambda answer=answer: answer,
        )  # fmt: skip
        assert kept.env == {PREBUILT_ENV_VAR: str(folder)}


def test_plugin_in_env_of_asks_the_python_behind_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `vllm` script's own interpreter answers: this test's Python (kimictl installed, or
    not when run from a source tree) and a bare venv (never); non-Python scripts: unknown."""
    import subprocess
    import sys
    from importlib.metadata import entry_points

    from kimictl.kernels.vllm.plugin import ENTRY_POINT, GROUP
    from kimictl.runtime.serving.prebuilt import plugin_in_env_of

    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    here = any(e.name == ENTRY_POINT for e in entry_points(group=GROUP))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    script = bin_dir / "vllm"
    for shebang, expected in (
        (f"#!{sys.executable}", (here, sys.executable)),
        (f"#!{bare / 'bin' / 'python'}", (False, str(bare / "bin" / "python"))),
        (f"#!/usr/bin/env {bare / 'bin' / 'python'}", (False, str(bare / "bin" / "python"))),
        ("#!/bin/sh", (None, str(script))),
    ):
        script.write_text(f"{shebang}\nprint('vllm')\n")
        script.chmod(0o755)
        assert plugin_in_env_of() == expected, shebang
    script.unlink()
    assert plugin_in_env_of() == (None, "vllm")  # no vllm on PATH


def test_node_capability_reads_the_first_gpu() -> None:
    assert node_capability(hardware.load_snapshots([H200_SNAPSHOT])) == H200
    assert node_capability(None) is None


# ---------------------------------------------------------------- the profile switch


def _profile_with(tmp_path: Path, name: str, **lines: str) -> Path:
    """The shipped profile with `lines[table]` added at the top of each of its tables."""
    text = (shipped_profiles_dir() / f"{PROFILE}.toml").read_text()
    for table, line in lines.items():
        assert f"[{table}]\n" in text  # the shipped profile has [serve] and [env]
        text = text.replace(f"[{table}]\n", f"[{table}]\n{line}\n", 1)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_prebuilt_units_field(tmp_path: Path) -> None:
    assert load_profile(PROFILE).prebuilt_units == "auto"
    off = _profile_with(tmp_path, "off", serve='prebuilt_units = "off"')
    assert load_profile(off).prebuilt_units == "off"
    assert load_profile(off).to_json()["prebuilt_units"] == "off"
    bad = _profile_with(tmp_path, "bad", serve='prebuilt_units = "always"')
    with pytest.raises(InputError) as err:
        load_profile(bad)
    assert f"{bad}:" in err.value.message and "prebuilt_units" in err.value.message
    assert '"auto" | "off"' in err.value.message
    both = _profile_with(
        tmp_path,
        "both",
        serve='prebuilt_units = "off"',
        env=f'{PREBUILT_ENV_VAR} = "/data/units"',
    )
    with pytest.raises(InputError) as err:
        load_profile(both)
    assert f"{both}:" in err.value.message and "set one of them" in err.value.message
    given = _profile_with(tmp_path, "given", env=f'{PREBUILT_ENV_VAR} = "/data/units"')
    assert load_profile(given).spec.env[PREBUILT_ENV_VAR] == "/data/units"  # auto: allowed


# ---------------------------------------------------------------- serve --dry-run on an H200


@pytest.fixture
def h200_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve's probes answer with the recorded H200 and a stack with vLLM 0.33.0 + DSL 4.8.0,
    whose environment has kimictl's plugin (whatever `vllm` this machine's PATH may hold)."""
    from kimictl.runtime.serving import prebuilt

    monkeypatch.setattr(
        workflow, "_probe_node", lambda: (hardware.load_snapshots([H200_SNAPSHOT]), _stack())
    )
    monkeypatch.setattr(prebuilt, "plugin_in_env_of", lambda: (True, "/opt/vllm/bin/python"))


def _dry_run(profile: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["serve", profile, "--dry-run", "--force", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_serve_passes_the_cache_to_vllm_and_prints_it(h200_node, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = _dry_run(PROFILE, capsys)
    assert code == 0
    assert "note: prebuilt CuTe units: none for this deployment and stack at " in out
    assert f"`kimictl kernels install --vllm {PROFILE}`" in out and PREBUILT_ENV_VAR not in out

    folder = _build_cache(load_profile(PROFILE).spec)
    code, out, _ = _dry_run(PROFILE, capsys)
    assert code == 0
    assert f"note: prebuilt CuTe units: {folder} ({PREBUILT_ENV_VAR};" in out
    assert f"  {PREBUILT_ENV_VAR}={folder}\n" in out  # the printed environment of the command
    code, out, _ = _dry_run(PROFILE, capsys, "--json")
    doc = json.loads(out)
    (run,) = doc["runs"]
    assert run["env"][PREBUILT_ENV_VAR] == str(folder)
    assert sum(PREBUILT_ENV_VAR in n for n in doc["notes"]) == 1


def test_serve_leaves_it_out_if_vllms_env_lacks_the_plugin(h200_node, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from kimictl.runtime.serving import prebuilt

    _build_cache(load_profile(PROFILE).spec)
    monkeypatch.setattr(prebuilt, "plugin_in_env_of", lambda: (False, "/opt/other/bin/python"))
    code, out, _ = _dry_run(PROFILE, capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and PREBUILT_ENV_VAR not in doc["runs"][0]["env"]
    assert any("/opt/other/bin/python -m pip install kimictl" in n for n in doc["notes"])


def test_serve_leaves_it_out_when_the_profile_says_off(h200_node, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _build_cache(load_profile(PROFILE).spec)
    path = _profile_with(tmp_path, "off", serve='prebuilt_units = "off"')
    code, out, _ = _dry_run(str(path), capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and PREBUILT_ENV_VAR not in doc["runs"][0]["env"]
    assert any('prebuilt_units = "off"' in n for n in doc["notes"])


def test_cpu_runtime_serve_looks_for_no_cache(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def no_probe():  # type: ignore[no-untyped-def]
        raise AssertionError("the CPU runtime has no CuTe units: no node probe")

    monkeypatch.setattr(workflow, "_probe_node", no_probe)
    code, out, _ = _dry_run("cpu-demo", capsys, "--json")
    doc = json.loads(out)
    assert all(PREBUILT_ENV_VAR not in run["env"] for run in doc["runs"])
    assert not any("prebuilt" in n for n in doc["notes"])


# ---------------------------------------------------------------- slow: the real vLLM process


def _plugin_overlay(root: Path) -> Path:
    """kimictl as `pip install kimictl` lays it into vLLM's environment (the package and a
    dist-info whose entry_points.txt is pyproject.toml's), in a folder for vLLM's PYTHONPATH: the
    CPU runtime's venv holds vLLM only, and the shared venv is not ours to change."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    root.mkdir(parents=True)
    (root / "kimictl").symlink_to(Path(kimictl.__file__).parent)
    version = kimictl.__version__  # pyproject reads it from there (dynamic)
    info = root / f"kimictl-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kimictl\nVersion: {version}\n")
    groups = [
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in eps.items())
        for group, eps in project["entry-points"].items()
    ]
    (info / "entry_points.txt").write_text("\n".join(groups))
    return root


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_plugin_in_the_real_vllm_process_falls_back_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM loads kimictl's entry point with KIMICTL_VLLM_PREBUILT naming an H200 cache; the CPU
    process has no SM90 arch (and another vLLM), so the plugin says so once per vLLM process
    and the server serves on vLLM's own path."""
    # the CPU runtime and the tiny model live in the real kimictl cache; the units do not
    if _CACHE_DIR is None:
        monkeypatch.delenv("KIMICTL_CACHE_DIR")
    else:
        monkeypatch.setenv("KIMICTL_CACHE_DIR", _CACHE_DIR)
    folder = _build_cache(load_profile(PROFILE).spec, folder=tmp_path / "units")
    overlay = _plugin_overlay(tmp_path / "site")
    server = start_cpu_server_retrying(
        tmp_path / "run", env={"PYTHONPATH": str(overlay), PREBUILT_ENV_VAR: str(folder)}
    )
    try:
        reply = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": server.model, "prompt": "def f(x):", "max_tokens": 4},
            timeout=60,
        )
        assert reply.status_code == 200
        assert reply.json()["usage"]["completion_tokens"] == 4
    finally:
        stop_cpu_server(server)
    log = server.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if "kimictl prebuilt kernels:" in line]
    assert lines, log[-3000:]
    # each vLLM process that loads general plugins says it once, and only the fall-back
    assert all("none loaded (cache built for another stack" in line for line in lines), lines
    assert all("arch 'sm_90a' (this process: None)" in line for line in lines)
    assert all(line.endswith("vLLM compiles them") for line in lines)
    # one line per vLLM process that calls general plugins (measured: engine core and worker)
    pids = [re.search(r"pid=(\d+)", line) for line in lines]
    assert all(pids) and len({m.group(1) for m in pids if m}) == len(lines), lines
