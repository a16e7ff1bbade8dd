"""`kimictl kernels` on a machine without a GPU: bad input exits 2 with one sentence, GPU commands
say what they need and exit 1, `--help` imports no heavy module, and the stack plan is computed
from the real installed packages and A's pins."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.runtime.checks.hardware import Unavailable
from kimictl.runtime.checks.kernel_stack import KERNEL_STACK, plan_stack
from kimictl.runtime.checks.stack import PINNED, PackageCheck, StackReport


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


no_gpu = pytest.mark.skipif(_has_gpu(), reason="asserts the no-GPU behaviour")


def test_help_imports_no_heavy_module():
    code = (
        "import sys\n"
        "from kimictl.cli import main\n"
        "try:\n    main(['kernels', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('torch', 'cutlass', 'pynvml', 'textual', 'numpy')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "build" in out.stdout and "verify" in out.stdout


def test_build_rejects_unknown_arch(capsys):
    assert main(["kernels", "build", "--arch", "sm_80"]) == 2
    err = capsys.readouterr().err
    assert "--arch 'sm_80' is not supported; allowed: sm_90a, sm_100a, sm_103a" in err


def test_build_out_that_is_a_file_is_bad_input_and_the_file_survives(tmp_path):
    from kimictl.kernels.toolchain.build import dsl_version

    if dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    out = tmp_path / "notes.txt"
    out.write_text("mine\n")
    # its own process: importing the DSL here would change later in-process builds' DSL state
    cmd = [sys.executable, "-m", "kimictl.cli", "kernels", "build", "--arch", "sm_90a"]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot use {out / 'sm_90a'} as the build folder (Not a directory)" in proc.stderr
    assert "kimictl bug" not in proc.stderr and out.read_text() == "mine\n"


def test_dry_run_without_stack_is_bad_input(capsys):
    assert main(["kernels", "install", "--dry-run"]) == 2
    assert "--dry-run applies to --stack only" in capsys.readouterr().err


def test_install_from_missing_folder_is_bad_input(tmp_path, capsys):
    assert main(["kernels", "install", "--from", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err


@no_gpu
@pytest.mark.parametrize("cmd", ["verify", "bench", "install"])
def test_gpu_commands_say_what_they_need_and_exit_1(cmd, capsys):
    assert main(["kernels", cmd]) == 1
    err = capsys.readouterr().err
    assert f"`kimictl kernels {cmd}` needs" in err
    assert "kimictl kernels build" in err  # the hint names what does work here


@no_gpu
def test_stack_dry_run_without_driver_reports_plan_and_exits_1(capsys):
    assert main(["kernels", "install", "--stack", "--dry-run", "--json"]) == 1
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    assert plan["dry_run"] is True and plan["driver_ok"] is False
    assert [p["name"] for p in plan["packages"]] == list(KERNEL_STACK)
    assert "cannot install the kernel stack" in captured.err


def _stack(installed: dict[str, str | None]) -> StackReport:
    checks = []
    for pin in PINNED:
        have = installed.get(pin.name)
        status = "missing" if have is None else ("ok" if have == pin.spec[2:] else "mismatch")
        checks.append(PackageCheck(pin.name, pin.spec, have, status, "", pin.required))
    return StackReport("3.12.3", checks, None, Unavailable("no vllm"))


PINNED_VERSIONS = {p.name: p.spec[2:] for p in PINNED if p.spec.startswith("==")}


def test_plan_is_empty_when_every_kernel_pin_matches():
    plan = plan_stack(_stack(PINNED_VERSIONS), "13.0")
    assert plan.ok and plan.pip_argv is None
    assert all(p["status"] == "ok" for p in plan.packages)


def test_plan_installs_only_the_off_pins_with_their_extras():
    versions = dict(PINNED_VERSIONS, torch="2.11.0")
    versions.pop("quack-kernels")
    plan = plan_stack(_stack(versions), "13.0", python="/py")
    assert plan.pip_argv == ["/py", "-m", "pip", "install", "torch==2.14.0", "quack-kernels==0.6.5"]
    status = {p["name"]: p["status"] for p in plan.packages}
    assert status["torch"] == "mismatch" and status["quack-kernels"] == "missing"


@pytest.mark.parametrize(
    ("driver", "ok"), [("12.8", False), ("13.0", True), ("13.1", True), (None, False)]
)
def test_driver_must_support_cuda_13(driver, ok):
    plan = plan_stack(_stack(PINNED_VERSIONS), driver if driver else Unavailable("no NVML"))
    assert plan.driver_ok is ok
    if not ok:
        assert "CUDA 13" in plan.driver_reason or ">= 13.0" in plan.driver_reason


def test_bench_rendering_of_the_recorded_h200_run(capsys):

    from kimictl.commands.kernels import _render_bench
    from kimictl.kernels.toolchain.bench import BenchReport

    path = Path(__file__).parents[1] / "tests" / "fixtures" / "runs" / "kernels_h200_bench.json"
    raw = json.loads(path.read_text())
    report = BenchReport.from_json(raw)
    # the object recomputes the same summary the device wrote
    assert report.summary()["geomean_speedup_dispatched"] == pytest.approx(
        raw["summary"]["geomean_speedup_dispatched"]
    )
    _render_bench(report)
    out = capsys.readouterr().out
    assert "decode GEMMs on NVIDIA H200" in out
    assert "lm_head" in out and "layer chain M=1" in out
    assert f"{raw['summary']['geomean_speedup_dispatched']:.2f}x" in out


# ---- kernels table: what the recorded H200 table runs where (no GPU needed)

H200_TABLE = Path(__file__).parent / "fixtures" / "kernels" / "bench_h200_table.json"
H200_FINAL_BENCH = (
    Path(__file__).parents[1] / "tests" / "fixtures" / "runs" / "kernels_h200_final_bench.json"
)


def _table_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["kernels", "table", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_table_of_the_recorded_h200_run(capsys):
    doc = _table_json(capsys, "--from", str(H200_TABLE))
    final = json.loads(H200_FINAL_BENCH.read_text())
    # the same table gives the figure the device's bench reported
    assert doc["geomean_speedup"] == pytest.approx(final["summary"]["geomean_speedup_dispatched"])
    assert len(doc["points"]) == 84 and doc["unmeasured_points"] == 0
    kept = {(p["shape"], p["m"]) for p in doc["points"] if p["provider"] == "cublas"}
    assert kept == {("kda_in_tp8", 64), ("kda_in_tp16", 64), ("lm_head", 64)}
    assert doc["kimictl_points"] == 81
    # never a kernel measured slower than cuBLAS; the layer chain's family restriction holds
    assert all(p["speedup"] >= 1.0 for p in doc["points"])
    m1 = {p["kernel"].split("_", 1)[0] for p in doc["points"] if p["m"] == 1}
    assert m1 <= set(doc["families_ms"]["1"]) == {"tcstream", "wstream"}
    # a bench report holding the table reads the same
    assert _table_json(capsys, "--from", str(H200_FINAL_BENCH))["points"] == doc["points"]


def test_table_renders_every_shape_and_the_geomean(capsys):
    assert main(["kernels", "table", "--from", str(H200_TABLE)]) == 0
    out = capsys.readouterr().out
    from kimictl.kernels.toolchain.dispatch import K3_GEMM_SHAPES

    assert all(name in out for name, _n, _k in K3_GEMM_SHAPES)
    assert "81 of 84 points" in out and "1.39x" in out and "cuBLAS" in out
    assert "M=1: only tcstream, wstream" in out


def test_table_with_unmeasured_points_sends_them_to_cublas(capsys, tmp_path):
    raw = json.loads(H200_TABLE.read_text())
    raw["entries"] = [e for e in raw["entries"] if (e["n"], e["m"]) == (2112, 1)]
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(raw))
    doc = _table_json(capsys, "--from", str(path))
    assert doc["unmeasured_points"] == 83 and doc["kimictl_points"] == 1
    (only,) = [p for p in doc["points"] if p["us"] is not None]
    assert doc["geomean_speedup"] == pytest.approx(only["speedup"]) and only["speedup"] > 1
    assert all(p["kernel"] == "cublas" for p in doc["points"] if p["us"] is None)
    assert main(["kernels", "table", "--from", str(path)]) == 0
    assert "83 not measured on this node" in capsys.readouterr().out


def test_table_finds_the_node_install_and_asks_when_there_are_several(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path))
    assert main(["kernels", "table"]) == 1  # nothing installed on this node
    assert "kimictl kernels install" in capsys.readouterr().err
    (tmp_path / "kernels" / "sm_90a").mkdir(parents=True)
    (tmp_path / "kernels" / "sm_90a" / "dispatch.json").write_text(H200_TABLE.read_text())
    assert _table_json(capsys)["arch"] == "sm_90a"
    (tmp_path / "kernels" / "sm_100a").mkdir()
    (tmp_path / "kernels" / "sm_100a" / "dispatch.json").write_text(H200_TABLE.read_text())
    assert main(["kernels", "table"]) == 2
    assert "--arch" in capsys.readouterr().err
    assert _table_json(capsys, "--arch", "sm_90a")["kimictl_points"] == 81
    assert main(["kernels", "table", "--arch", "sm_103a"]) == 1


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read"),
        ("{", "is not JSON"),
        ('{"device": "x"}', "is not a kimictl dispatch table"),
        ("[1, 2]", "is not a kimictl dispatch table"),
    ],
)
def test_table_bad_file_exits_2_with_one_sentence(capsys, tmp_path, content, said):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    assert main(["kernels", "table", "--from", str(path)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert content is None or path.read_text() == content


def _rendered_at(columns: int, *args: str) -> str:
    """The real CLI's human output on a terminal `columns` wide."""
    import os

    env = dict(os.environ, COLUMNS=str(columns))
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_table_at_80_columns_keeps_every_cell_whole(capsys):
    import re
    from collections import Counter

    from kimictl.kernels.toolchain.dispatch import family_of

    doc = _table_json(capsys, "--from", str(H200_TABLE))
    narrow = _rendered_at(80, "kernels", "table", "--from", str(H200_TABLE))
    wide = _rendered_at(200, "kernels", "table", "--from", str(H200_TABLE))
    assert "…" not in narrow and max(len(line) for line in narrow.splitlines()) <= 80
    words = narrow.split()
    for p in doc["points"]:
        assert p["shape"] in words and f"{p['n']}x{p['k']}" in words
    # every speedup and family name of the wide table, as often, whole
    families = {family_of(p["kernel"]) for p in doc["points"] if p["provider"] != "cublas"}
    assert {f: words.count(f) for f in families} == {f: wide.split().count(f) for f in families}
    speedups = Counter(re.findall(r"\b\d+\.\d\dx\b", narrow))
    assert speedups == Counter(re.findall(r"\b\d+\.\d\dx\b", wide))
    assert sum(speedups.values()) >= doc["kimictl_points"]
    assert all(f"M={m}" in words for m in {p["m"] for p in doc["points"]})


def test_would_run_is_one_exact_shell_line_with_the_extras(capsys, monkeypatch):
    """`nvidia-cutlass-dsl[cu13]==4.8.0` is no Rich markup: the printed command keeps the extra,
    is shell-quoted (the brackets are a glob) and stays one line at any terminal width."""
    import shlex

    from kimictl.commands import _output
    from kimictl.commands.kernels import _render_plan

    monkeypatch.setattr(_output.console, "_width", 60)  # a narrow terminal
    versions = dict(PINNED_VERSIONS)
    versions.pop("nvidia-cutlass-dsl")
    plan = plan_stack(_stack(versions), "13.0", python="/usr/bin/python3")
    assert plan.pip_argv is not None and any("[cu13]" in w for w in plan.pip_argv)
    _render_plan(plan)
    out = capsys.readouterr().out
    (line,) = [row for row in out.splitlines() if row.startswith("would run: ")]
    assert shlex.split(line.removeprefix("would run: ")) == plan.pip_argv
    assert "'nvidia-cutlass-dsl[cu13]==4.8.0'" in line
