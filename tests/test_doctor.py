"""`kimictl doctor` end to end through the real CLI entry point (kimictl.cli.main)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.runtime.checks.hardware import load_snapshot

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
H200 = SNAPSHOTS / "h200-real.json"
UPSTREAM_TP8 = (
    "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve moonshotai/Kimi-K3 -tp 8 --kv-cache-dtype fp8 "
    """--speculative-config '{"method":"dspark","model":"draft","num_speculative_tokens":7}' """
    """--additional-config '{"decode_backend":"latency_specialized"}'"""
)
SECTIONS = ["Hardware", "Fabric and multicast", "Software stack", "Deployment"]


def snapshot_args(name: str) -> list[str]:
    args: list[str] = []
    for path in sorted((SNAPSHOTS / name).glob("*.json")):
        args += ["--from-snapshot", str(path)]
    return args


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["doctor", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cpu_machine_gets_a_clean_no_driver_report(capsys: pytest.CaptureFixture[str]) -> None:
    if load_snapshot_live_has_driver():
        pytest.skip("this machine has an NVIDIA driver")
    code, out, err = run(capsys)
    assert code == 1
    assert "Traceback" not in out + err and "kimictl bug" not in err
    assert "no NVIDIA driver" in out
    positions = [out.index(f"\n{s}\n") for s in SECTIONS]
    assert positions == sorted(positions)
    last = out.strip().splitlines()[-1]
    fails = len(re.findall(r"^\s+FAIL\s", out, flags=re.M))
    assert last == f"Fast path: NOT READY ({fails} blocking)"


def load_snapshot_live_has_driver() -> bool:
    from kimictl.runtime.checks.hardware import probe_local

    return probe_local(include_stack=False).has_driver


def test_json_output_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--json", "--from-snapshot", str(H200))
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "not_ready"
    assert doc["blocking"] == sum(c["status"] == "fail" for c in doc["checks"])
    for check in doc["checks"]:
        assert set(check) == {"id", "section", "status", "message", "remedy"}
        assert check["section"] in SECTIONS
        assert check["status"] in {"pass", "warn", "fail", "unknown"}
    assert doc["hardware"]["nodes"][0]["gpus"][0]["name"] == "NVIDIA H200"
    assert doc["hardware"]["source"] == "recorded"


def test_real_h200_with_upstream_line_is_not_ready_for_sm90_and_multicast(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--json", "--from-snapshot", str(H200), "--vllm-args", UPSTREAM_TP8)
    doc = json.loads(out)
    fails = {c["id"] for c in doc["checks"] if c["status"] == "fail"}
    assert code == 1
    assert "fabric.multicast" in fails
    # vLLM's rule 1 is reported once (by the deployment rules when a deployment is given).
    arch = [c for c in doc["checks"] if "this GPU (SM100/103)" in c["message"]]
    assert len(arch) == 1 and arch[0]["status"] == "fail"


@pytest.mark.parametrize(("name", "tp"), [("gb300-tp8-healthy", 8), ("gb300-tp16-healthy", 16)])
def test_healthy_gb300_and_upstream_line_is_ready(
    capsys: pytest.CaptureFixture[str], name: str, tp: int
) -> None:
    line = UPSTREAM_TP8.replace("-tp 8", f"-tp {tp}")
    code, out, err = run(capsys, *snapshot_args(name), "--vllm-args", line)
    assert code == 0, out + err
    assert out.strip().splitlines()[-1] == "Fast path: READY"
    assert "simulated snapshot" in out
    assert not re.search(r"^\s+FAIL\s", out, flags=re.M)


@pytest.mark.parametrize(
    ("name", "check_id"),
    [
        ("gb300-tp16-split-clique", "fabric.clique"),
        ("gb300-tp8-multicast-off", "fabric.multicast"),
        ("gb300-tp8-fabric-incomplete", "fabric.state"),
        ("gb300-tp8-mig-on", "hw.mig"),
        ("gb300-tp8-gpu-missing", "hw.gpu_count"),
        ("gb300-tp8-old-driver", "hw.driver_version"),
    ],
)
def test_broken_gb300_scenarios_block(
    capsys: pytest.CaptureFixture[str], name: str, check_id: str
) -> None:
    tp = 16 if "tp16" in name else 8
    line = UPSTREAM_TP8.replace("-tp 8", f"-tp {tp}")
    code, out, _ = run(capsys, "--json", *snapshot_args(name), "--vllm-args", line)
    doc = json.loads(out)
    fails = [c["id"] for c in doc["checks"] if c["status"] == "fail"]
    assert code == 1 and check_id in fails
    hardware_fails = [f for f in fails if f.startswith(("hw.", "fabric."))]
    assert hardware_fails == [check_id]


def test_too_few_gpus_for_the_deployment(capsys: pytest.CaptureFixture[str]) -> None:
    line = UPSTREAM_TP8.replace("-tp 8", "-tp 16")
    code, out, _ = run(capsys, "--json", *snapshot_args("gb300-tp8-healthy"), "--vllm-args", line)
    doc = json.loads(out)
    assert code == 1
    count = [c for c in doc["checks"] if "gpu_count" in c["id"] and c["status"] == "fail"]
    assert count and "16" in count[0]["message"] and "8" in count[0]["message"]


def test_save_snapshot_writes_a_loadable_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "merged.json"
    code, out, _ = run(capsys, *snapshot_args("gb300-tp8-healthy"), "--save-snapshot", str(target))
    assert code == 0 and f"Snapshot saved to {target}" in out
    saved = load_snapshot(target)
    assert len(saved.nodes) == 2 and saved.source == "simulated"


def test_save_snapshot_never_replaces_an_existing_file_without_force(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text("# my notes\n")
    code, out, err = run(capsys, *snapshot_args("gb300-tp8-healthy"), "--save-snapshot", str(mine))
    assert code == 2 and out == ""
    assert f"error: --save-snapshot '{mine}' already exists" in err
    assert "--force" in err and mine.read_text() == "# my notes\n"
    code, out, _ = run(
        capsys, *snapshot_args("gb300-tp8-healthy"), "--save-snapshot", str(mine), "--force"
    )
    assert code == 0 and len(load_snapshot(mine).nodes) == 2


@pytest.mark.parametrize(
    ("target", "sentence"),
    [
        ("folder", "is a folder; name a new file."),
        ("afile/x.json", "afile' is a file, not a folder."),
    ],
)
def test_save_snapshot_to_an_unwritable_place_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str, sentence: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("x")
    path = tmp_path / target
    code, out, err = run(capsys, *snapshot_args("gb300-tp8-healthy"), "--save-snapshot", str(path))
    assert code == 2 and out == ""
    assert err.startswith("error: --save-snapshot ") and str(path) in err and sentence in err
    assert "kimictl bug" not in err and (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--from-snapshot", "/nonexistent/snap.json"], "/nonexistent/snap.json"),
        (["--vllm-args", "vllm serve m -tp eight"], "-tp"),
        (["--vllm-args", "  "], "--vllm-args"),
        (["--profile", "x", "--vllm-args", "vllm serve m"], "--profile and --vllm-args"),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err
    assert "Traceback" not in out + err


def test_unparsable_snapshot_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code, _, err = run(capsys, "--from-snapshot", str(bad))
    assert code == 2 and f"error: snapshot {bad}: not JSON" in err


def test_empty_snapshot_is_bad_input_not_ready(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text('{"source": "recorded", "nodes": []}')
    code, out, err = run(capsys, "--from-snapshot", str(empty))
    assert code == 2 and out == "" and "READY" not in out
    assert err.startswith(f"error: snapshot {empty}: the 'nodes' list is empty")


def test_profile_by_name_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    profiles = pytest.importorskip("kimictl.deployment.profiles")
    names = [p.name for p in profiles.list_profiles()]
    if "k3-tp8-latency" not in names:
        pytest.skip(f"no k3-tp8-latency profile shipped (have {names})")
    code, out, _ = run(
        capsys, "--json", *snapshot_args("gb300-tp8-healthy"), "--profile", "k3-tp8-latency"
    )
    doc = json.loads(out)
    assert doc["deployment"]["tensor_parallel_size"] == 8
    assert code == (0 if doc["verdict"] == "ready" else 1)


def test_unrecognised_flags_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, *snapshot_args("gb300-tp8-healthy"), "--vllm-args", UPSTREAM_TP8 + " --frobnicate 3"
    )
    assert "--frobnicate" in out
    assert code == 0  # an unknown flag warns; it does not block
