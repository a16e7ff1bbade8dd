"""The environment vLLM will run with (issue 20) and the real 2 x H200 snapshot (issue 18).

h200x2-real.json was captured by `kimictl doctor --save-snapshot` on the lent 2 x H200 (NVSwitch)
with NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 set, so it
records those three in `env`. Variations come from the deployment's env (which wins) and, for the
live path, from the environment of a real `kimictl doctor` child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.deployment.vllm_args import parse_vllm_command
from kimictl.runtime.checks.hardware import (
    FabricInfo,
    HardwareReport,
    load_snapshot,
    load_snapshots,
)
from kimictl.runtime.checks.rules import Status, evaluate
from kimictl.runtime.checks.rules.environment import parse_visible_devices

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
X2 = SNAPSHOTS / "h200x2-real.json"
SERVE = "vllm serve moonshotai/Kimi-K3 -tp 2"


def by_id(hw: HardwareReport, command: str = SERVE) -> dict[str, tuple[Status, str]]:
    spec = parse_vllm_command(command).spec
    return {c.id: (c.status, c.message) for c in evaluate(spec, hw, None)}


def x2(env: dict[str, str] | None) -> HardwareReport:
    hw = load_snapshot(X2)
    return replace(hw, nodes=[replace(n, env=env) for n in hw.nodes])


# ------------------------------------------------------------------------- the real snapshot


def test_real_x2_snapshot_holds_what_the_driver_reported() -> None:
    hw = load_snapshot(X2)
    assert hw.source == "recorded"
    node = hw.nodes[0]
    assert node.env == {
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NCCL_NVLS_ENABLE": "0",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    assert [g.name for g in node.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    for gpu in node.gpus:
        assert isinstance(gpu.nvlinks, list) and len(gpu.nvlinks) == 18
        assert {(ln.active, ln.version, ln.remote_device_type) for ln in gpu.nvlinks} == {
            (True, "4.0", "switch")
        }
        assert gpu.multicast_supported is True  # the attribute; torch's switch is separate
        assert isinstance(gpu.fabric, FabricInfo) and gpu.fabric.state == "completed"
        assert gpu.fabric.cluster_uuid == "00000000-0000-0000-0000-000000000000"
    assert [(p.a, p.b, p.status) for p in node.p2p] == [(0, 1, "ok")]


def test_real_x2_fabric_checks_read_the_single_node_nvswitch_right() -> None:
    got = by_id(load_snapshot(X2))
    assert got["fabric.nvlink"] == (Status.PASS, "18 active NVLinks per GPU.")
    assert got["fabric.p2p"][0] is Status.PASS and "1 GPU pairs" in got["fabric.p2p"][1]
    assert got["fabric.state"][0] is Status.PASS
    assert got["fabric.clique"][0] is Status.PASS
    assert "single-node NVSwitch" in got["fabric.clique"][1]
    assert got["fabric.multicast"][0] is Status.PASS
    # ... and the recorded environment switches multicast off in torch: the gap issue 20 closes
    assert got["env.torch_multicast"][0] is Status.FAIL
    assert got["env.nccl_nvls"][0] is Status.WARN


def test_two_single_node_fabrics_are_two_cliques(tmp_path: Path) -> None:
    raw = json.loads(X2.read_text())
    raw["nodes"][0]["hostname"] = "h200-b"
    other = tmp_path / "b.json"
    other.write_text(json.dumps(raw))
    got = by_id(load_snapshots([X2, other]), "vllm serve moonshotai/Kimi-K3 -tp 4")
    status, message = got["fabric.clique"]
    assert status is Status.FAIL
    assert "vm's own NVSwitch fabric" in message and "h200-b's own" in message


# ------------------------------------------------------------------ torch / NCCL / vLLM switches


@pytest.mark.parametrize(
    ("value", "status"),
    [("1", Status.FAIL), ("0", Status.PASS), ("true", Status.WARN), (" 1", Status.WARN)],
)
def test_torch_switch_is_read_as_torch_reads_it(value: str, status: Status) -> None:
    # c10::utils::check_env: exactly "1" disables, exactly "0" does not, the rest is ignored
    got = by_id(x2({"TORCH_SYMM_MEM_DISABLE_MULTICAST": value}))
    assert got["env.torch_multicast"][0] is status


def test_deployment_env_wins_over_the_launching_environment() -> None:
    hw = x2({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
    assert by_id(hw)["env.torch_multicast"][0] is Status.FAIL
    fixed = by_id(hw, f"TORCH_SYMM_MEM_DISABLE_MULTICAST=0 {SERVE}")
    assert fixed["env.torch_multicast"][0] is Status.PASS
    broken = by_id(x2({}), f"TORCH_SYMM_MEM_DISABLE_MULTICAST=1 {SERVE}")
    status, message = broken["env.torch_multicast"]
    assert status is Status.FAIL and "deployment's env" in message


def test_fail_names_the_fix_for_where_the_value_came_from() -> None:
    spec = parse_vllm_command(f"TORCH_SYMM_MEM_DISABLE_MULTICAST=1 {SERVE}").spec
    from_deployment = {c.id: c for c in evaluate(spec, x2({}), None)}["env.torch_multicast"]
    assert from_deployment.remedy.startswith("remove TORCH_SYMM_MEM_DISABLE_MULTICAST=1")
    spec = parse_vllm_command(SERVE).spec
    from_process = {c.id: c for c in evaluate(spec, load_snapshot(X2), None)}
    assert "unset TORCH_SYMM_MEM_DISABLE_MULTICAST" in from_process["env.torch_multicast"].remedy


@pytest.mark.parametrize(
    ("env", "status"),
    [
        ({}, Status.PASS),
        ({"TORCH_SYMMMEM": "CUDA"}, Status.PASS),
        ({"TORCH_SYMMMEM": "NCCL"}, Status.FAIL),  # NCCL backend: get_multicast_ptr is nullptr
        ({"TORCH_SYMMMEM": "cuda"}, Status.FAIL),  # torch compares exact strings and raises
        ({"TORCH_SYMMMEM": "NVSHMEM"}, Status.WARN),
        ({"TORCH_SYMMMEM": "NVSHMEM", "NVSHMEM_DISABLE_NVLS": "1"}, Status.FAIL),
    ],
)
def test_symmetric_memory_backend(env: dict[str, str], status: Status) -> None:
    assert by_id(x2(env))["env.symm_mem_backend"][0] is status


@pytest.mark.parametrize(
    ("value", "status"), [("0", Status.WARN), ("1", Status.PASS), ("off", Status.WARN)]
)
def test_nccl_nvls_is_a_warning_not_a_block(value: str, status: Status) -> None:
    got = by_id(x2({"NCCL_NVLS_ENABLE": value}))
    assert got["env.nccl_nvls"][0] is status
    assert "env.torch_multicast" in got and got["env.torch_multicast"][0] is Status.PASS


def test_nvshmem_switch_warns_only_with_the_cuda_backend() -> None:
    assert by_id(x2({"NVSHMEM_DISABLE_NVLS": "yes"}))["env.nvshmem_nvls"][0] is Status.WARN
    assert "env.nvshmem_nvls" not in by_id(x2({"NVSHMEM_DISABLE_NVLS": "0"}))


@pytest.mark.parametrize(
    ("value", "status"), [("0", Status.WARN), ("1", Status.PASS), ("true", Status.FAIL)]
)
def test_vllm_symm_mem_allreduce_follows_envs_py(value: str, status: Status) -> None:
    # vLLM: bool(int(os.getenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "1"))): "true" raises ValueError
    got = by_id(x2({}), f"VLLM_ALLREDUCE_USE_SYMM_MEM={value} {SERVE}")
    assert got["env.vllm_symm_mem_allreduce"][0] is status


def test_old_snapshot_without_env_uses_the_deployment_env_only() -> None:
    hw = load_snapshot(SNAPSHOTS / "h200-real.json")
    assert hw.nodes[0].env is None
    # not recorded: UNKNOWN, never a PASS "not set" beside the UNKNOWN that says so
    assert by_id(hw)["env.torch_multicast"][0] is Status.UNKNOWN
    assert (
        "not known (the launching environment was not recorded"
        in (by_id(hw)["env.torch_multicast"][1])
    )
    assert by_id(hw)["env.recorded"][0] is Status.UNKNOWN  # said, not silently passed
    assert "env.recorded" not in by_id(load_snapshot(X2))
    got = by_id(hw, f"TORCH_SYMM_MEM_DISABLE_MULTICAST=1 {SERVE}")
    assert got["env.torch_multicast"][0] is Status.FAIL


# ------------------------------------------------------------------------ CUDA_VISIBLE_DEVICES


@pytest.mark.parametrize(
    ("text", "indices", "ignored"),
    [
        ("1", [1], []),
        ("1,0", [1, 0], []),
        ("GPU-fadefbd9", [1], []),  # a unique UUID prefix is enough for CUDA
        ("GPU-", [], ["GPU-"]),  # ambiguous prefix: CUDA stops there
        ("0,7,1", [0], ["7", "1"]),  # the list ends at the first entry that names no GPU
        ("0,0", [0], ["0"]),
        ("", [], []),
        ("-1", [], ["-1"]),
    ],
)
def test_visible_devices_parse_like_cuda(text: str, indices: list[int], ignored: list[str]) -> None:
    vis = parse_visible_devices(text, load_snapshot(X2).nodes[0])
    assert (vis.indices, vis.ignored) == (indices, ignored)


def test_too_few_visible_gpus_fail_naming_the_set_and_hardware_sees_only_them() -> None:
    got = by_id(x2({"CUDA_VISIBLE_DEVICES": "1"}))
    status, message = got["env.visible_devices"]
    assert status is Status.FAIL
    assert "CUDA_VISIBLE_DEVICES='1' -> GPU 1 of 2" in message and "needs 2" in message
    assert got["hw.gpu_count"] == (Status.PASS, "1 GPU.")
    assert "fabric.p2p" not in got  # no pair left among the visible GPUs
    assert got["k3.gpu_count"][0] is Status.FAIL


def test_mig_devices_are_not_whole_gpus() -> None:
    got = by_id(x2({"CUDA_VISIBLE_DEVICES": "MIG-0f3b7c1e-8a4d-5b2e-9c1f-1a2b3c4d5e6f"}))
    assert got["env.visible_devices"][0] is Status.FAIL
    assert "MIG" in got["env.visible_devices"][1]


def test_enough_visible_gpus_pass_and_bad_tails_warn() -> None:
    assert by_id(x2({"CUDA_VISIBLE_DEVICES": "0,1"}))["env.visible_devices"][0] is Status.PASS
    got = by_id(x2({"CUDA_VISIBLE_DEVICES": "0,1,5"}))
    assert got["env.visible_devices"][0] is Status.WARN and "5" in got["env.visible_devices"][1]


def test_deployment_visible_devices_override_the_recorded_ones() -> None:
    hw = x2({"CUDA_VISIBLE_DEVICES": "0"})
    got = by_id(hw, f"CUDA_VISIBLE_DEVICES=0,1 {SERVE}")
    assert got["env.visible_devices"][0] is Status.PASS
    assert got["hw.gpu_count"] == (Status.PASS, "2 GPUs.")


# ---------------------------------------------------------------------------------- end to end


def test_doctor_cli_on_the_real_snapshot_with_an_env_override(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["doctor", "--json", "--from-snapshot", str(X2), "--vllm-args"]
    main([*argv, f"CUDA_VISIBLE_DEVICES=1 {SERVE}"])
    doc = json.loads(capsys.readouterr().out)
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["env.visible_devices"]["status"] == "fail"
    assert checks["env.torch_multicast"]["status"] == "fail"  # recorded in the snapshot
    assert doc["hardware"]["nodes"][0]["env"]["NCCL_NVLS_ENABLE"] == "0"


def _live_doctor(env: dict[str, str]) -> dict[str, str]:
    """A real `kimictl doctor --json` child on this machine with `env` added."""
    child = {k: v for k, v in os.environ.items() if k not in ("TORCH_SYMM_MEM_DISABLE_MULTICAST",)}
    child.update(env)
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", "doctor", "--json"],
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    doc = json.loads(done.stdout)
    return {c["id"]: c["status"] for c in doc["checks"]}


def test_live_doctor_reads_the_process_environment() -> None:
    assert _live_doctor({})["env.torch_multicast"] == "pass"
    assert _live_doctor({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})["env.torch_multicast"] == "fail"


def test_links_down_on_one_real_gpu_warn_naming_it() -> None:
    hw = load_snapshot(X2)
    node = hw.nodes[0]
    gpu1 = node.gpus[1]
    assert isinstance(gpu1.nvlinks, list)
    links = [replace(ln, active=False) if ln.link < 3 else ln for ln in gpu1.nvlinks]
    node = replace(node, gpus=[node.gpus[0], replace(gpu1, nvlinks=links)])
    status, message = by_id(replace(hw, nodes=[node]))["fabric.nvlink"]
    assert status is Status.WARN and "GPU 1" in message and "15/18" in message
