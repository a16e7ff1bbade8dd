"""Hardware reports: types, JSON snapshots, the live probe on this machine, and the hardware/fabric
rules over the real H200 snapshot and the simulated GB300 ones (checked as one TP group)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kimictl.core.errors import InputError
from kimictl.runtime.checks import hardware
from kimictl.runtime.checks.hardware import HardwareReport, Unavailable, load_snapshots
from kimictl.runtime.checks.hardware._imex import list_imex_channels
from kimictl.runtime.checks.hardware._smi import _fabric_from_q
from kimictl.runtime.checks.rules.base import Section, Status
from kimictl.runtime.checks.rules.hardware import hardware_checks

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
H200 = SNAPSHOTS / "h200-real.json"


def scenario(name: str) -> HardwareReport:
    return load_snapshots(sorted((SNAPSHOTS / name).glob("*.json")))


def failing(checks: list) -> set[str]:
    return {c.id for c in checks if c.status is Status.FAIL}


# ---------------------------------------------------------------------------------------- types


def test_unavailable_is_falsy_and_says_why() -> None:
    value = Unavailable("no driver")
    assert not value
    assert str(value) == "unknown: no driver"
    assert hardware.known(False) and not hardware.known(value)


def test_real_h200_snapshot_round_trips_through_json(tmp_path: Path) -> None:
    report = hardware.load_snapshot(H200)
    assert report.source == "recorded"
    again = HardwareReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again == report
    saved = hardware.save_snapshot(report, tmp_path / "sub" / "copy.json")
    assert hardware.load_snapshot(saved) == report


def test_real_h200_snapshot_holds_what_the_device_reported() -> None:
    gpu = hardware.load_snapshot(H200).gpus[0]
    assert gpu.name == "NVIDIA H200"
    assert gpu.compute_capability == (9, 0)
    assert gpu.multicast_supported is False
    # NVLink is not exposed to this VM: the field carries NVML's reason instead of a value.
    assert isinstance(gpu.nvlinks, Unavailable) and "not supported" in gpu.nvlinks.reason


def test_live_report_is_saved_as_recorded(tmp_path: Path) -> None:
    live = hardware.load_snapshot(H200).with_source("live")
    path = hardware.save_snapshot(live, tmp_path / "s.json")
    assert json.loads(path.read_text())["source"] == "recorded"


def test_simulated_fixtures_say_so_in_their_content() -> None:
    files = sorted(SNAPSHOTS.glob("gb300-*/*.json"))
    assert len(files) >= 18
    for path in files:
        assert json.loads(path.read_text())["source"] == "simulated", path
    assert json.loads(H200.read_text())["source"] == "recorded"


def test_merge_keeps_every_node_and_marks_simulated() -> None:
    merged = hardware.merge([hardware.load_snapshot(H200), scenario("gb300-tp8-healthy")])
    assert len(merged.nodes) == 3
    assert len(merged.gpus) == 9
    assert merged.source == "simulated"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ('{"source": "recorded"}', "'nodes'"),
        ('{"nodes": [{"hostname": "x"}]}', "malformed"),
        ('{"source": "imagined", "nodes": []}', "malformed"),
        ('{"nodes": [{}]}', "malformed (missing the key 'hostname')"),
        ('{"source": "recorded", "nodes": []}', "the 'nodes' list is empty"),
        ("\udcff{", "not JSON (not UTF-8 text)"),
    ],
)
def test_bad_snapshot_is_an_input_error_naming_the_file(
    tmp_path: Path, content: str | None, needle: str
) -> None:
    path = tmp_path / "snap.json"
    if content is not None:
        path.write_bytes(content.encode("utf-8", "surrogateescape"))  # \udcff: the byte 0xff
    with pytest.raises(InputError) as info:
        load_snapshots([path])
    assert str(path) in info.value.message
    assert needle in info.value.message
    assert info.value.exit_code == 2


# ----------------------------------------------------------------------------- live probe (here)


def test_probe_local_never_raises_and_explains_a_missing_driver() -> None:
    report = hardware.probe_local(include_stack=False)
    assert report.source == "live" and len(report.nodes) == 1
    node = report.nodes[0]
    if node.no_driver_reason is None:
        pytest.skip("this machine has an NVIDIA driver")
    assert "driver" in node.no_driver_reason.lower() or "not installed" in node.no_driver_reason
    assert node.gpus == []
    assert isinstance(node.driver_version, Unavailable)
    checks = hardware_checks(report)
    assert [c.id for c in checks] == ["hw.driver"]
    assert checks[0].status is Status.FAIL
    reason = node.no_driver_reason.removeprefix("no NVIDIA driver: ")
    assert reason in checks[0].message


def test_nvml_choke_point_returns_unavailable_instead_of_raising() -> None:
    from kimictl.runtime.checks.hardware import _nvml

    if _nvml.nvml_status() is None:
        pytest.skip("NVML works here")
    result = _nvml._query("nvmlDeviceGetCount")
    assert isinstance(result, Unavailable)
    assert result.reason == _nvml.nvml_status().reason  # type: ignore[union-attr]


def test_imex_channels_listed_from_the_device_directory(tmp_path: Path) -> None:
    missing = list_imex_channels(tmp_path / "nope")
    assert isinstance(missing, Unavailable) and "does not exist" in missing.reason
    (tmp_path / "channel1").touch()
    (tmp_path / "channel0").touch()
    (tmp_path / "README").touch()
    assert list_imex_channels(tmp_path) == ["channel0", "channel1"]


def test_nvidia_smi_fabric_parser() -> None:
    real = (SNAPSHOTS / "h200-real.nvidia-smi-q.txt").read_text()
    fabrics = _fabric_from_q(real)
    assert fabrics and all(isinstance(f, Unavailable) for f in fabrics)  # H200 VM: N/A
    text = (
        "GPU 00000008:01:00.0\n    Fabric\n        State : Completed\n        Status : Success\n"
        "        CliqueId : 32766\n        ClusterUUID : 5b0e6a7c-1f2d\n    Processes : None\n"
    )
    (fabric,) = _fabric_from_q(text)
    assert not isinstance(fabric, Unavailable)
    assert (fabric.state, fabric.status, fabric.clique_id) == ("completed", "success", 32766)


# --------------------------------------------------------------------- rules over the snapshots


def test_real_h200_is_not_ready_sm90_and_no_multicast() -> None:
    checks = hardware_checks(hardware.load_snapshot(H200))
    fails = failing(checks)
    assert fails == {"hw.compute_capability", "fabric.multicast"}
    cc = next(c for c in checks if c.id == "hw.compute_capability")
    assert "Kimi K3 specialized decode does not support this GPU (SM100/103)" in cc.message
    assert "SM90" in cc.message
    driver = next(c for c in checks if c.id == "hw.driver_version")
    assert driver.status is Status.PASS and "580.159.04" in driver.message


@pytest.mark.parametrize("name", ["gb300-tp8-healthy", "gb300-tp16-healthy"])
def test_healthy_gb300_group_passes_every_hardware_check(name: str) -> None:
    report = scenario(name)
    checks = hardware_checks(report)
    # fabric.pods names what host snapshots cannot see: unknown by design, never blocking
    assert {c.status for c in checks if c.id != "fabric.pods"} == {Status.PASS}
    ids = {c.id for c in checks}
    assert {"fabric.clique", "fabric.multicast", "fabric.imex", "hw.driver_same"} <= ids
    clique = next(c for c in checks if c.id == "fabric.clique")
    assert f"all {len(report.gpus)} GPUs" in clique.message


@pytest.mark.parametrize(
    ("name", "expected", "needle"),
    [
        ("gb300-tp16-split-clique", "fabric.clique", "gb300-r07-tray04"),
        ("gb300-tp8-multicast-off", "fabric.multicast", "gb300-r07-tray02 GPUs 0, 1, 2, 3"),
        ("gb300-tp8-fabric-incomplete", "fabric.state", "state in_progress"),
        ("gb300-tp8-mig-on", "hw.mig", "gb300-r07-tray01 GPU 1"),
        ("gb300-tp8-gpu-missing", "hw.gpu_count", "GPU is lost"),
        ("gb300-tp8-old-driver", "hw.driver_version", "570.172.08"),
    ],
)
def test_each_broken_scenario_fails_exactly_its_check(
    name: str, expected: str, needle: str
) -> None:
    checks = hardware_checks(scenario(name))
    assert failing(checks) == {expected}
    check = next(c for c in checks if c.id == expected)
    assert needle in check.message
    assert check.remedy  # every failure says how to fix it


def test_clique_split_names_both_groups() -> None:
    check = next(
        c for c in hardware_checks(scenario("gb300-tp16-split-clique")) if c.id == "fabric.clique"
    )
    assert "2 NVLink cliques" in check.message
    assert "clique 32766" in check.message and "clique 32767" in check.message


def test_tray_without_imex_channel_fails_in_a_multi_tray_group() -> None:
    report = scenario("gb300-tp8-healthy")
    nodes = [report.nodes[0], replace(report.nodes[1], imex_channels=Unavailable("no dir"))]
    checks = hardware_checks(replace(report, nodes=nodes))
    assert failing(checks) == {"fabric.imex"}


def test_mixed_drivers_across_nodes_fail() -> None:
    report = scenario("gb300-tp8-healthy")
    nodes = [report.nodes[0], replace(report.nodes[1], driver_version="580.82.07")]
    assert "hw.driver_same" in failing(hardware_checks(replace(report, nodes=nodes)))


def test_unreadable_multicast_is_unknown_not_blocking() -> None:
    report = scenario("gb300-tp8-healthy")
    why = Unavailable("libcuda.so.1 not loadable")
    node = replace(
        report.nodes[1], gpus=[replace(g, multicast_supported=why) for g in report.nodes[1].gpus]
    )
    checks = hardware_checks(replace(report, nodes=[report.nodes[0], node]))
    check = next(c for c in checks if c.id == "fabric.multicast")
    assert check.status is Status.UNKNOWN and "libcuda.so.1" in check.message
    assert not failing(checks)


def test_sections_are_hardware_or_fabric() -> None:
    checks = hardware_checks(scenario("gb300-tp16-healthy"))
    assert {c.section for c in checks} == {Section.HARDWARE, Section.FABRIC}


# ----------------------------------------------------------------- more edges of the TP group


def test_node_without_driver_in_a_group_is_named() -> None:
    report = scenario("gb300-tp8-healthy")
    why = "no NVIDIA driver: libnvidia-ml.so.1 was not found"
    dead = replace(report.nodes[1], gpus=[], no_driver_reason=why, driver_version=Unavailable(why))
    checks = hardware_checks(replace(report, nodes=[report.nodes[0], dead]))
    driver = next(c for c in checks if c.id == "hw.driver")
    assert driver.status is Status.FAIL and "gb300-r07-tray02" in driver.message
    assert failing(checks) == {"hw.driver"}  # one cause, one blocking line
    count = next(c for c in checks if c.id == "hw.gpu_count")
    assert count.message == "4 GPUs on 1 node with a driver."


def test_snapshot_without_recorded_stack_is_unknown(tmp_path: Path) -> None:
    from kimictl.runtime.checks.rules import diagnose

    report = scenario("gb300-tp8-healthy")
    paths = []
    for i, node in enumerate(report.nodes):
        path = tmp_path / f"n{i}.json"
        hardware.save_snapshot(HardwareReport([replace(node, stack=None)], "simulated"), path)
        paths.append(path)
    result = diagnose(snapshots=paths)
    recorded = next(c for c in result.checks if c.id == "stack.recorded")
    assert recorded.status is Status.UNKNOWN
    assert result.stack is None and result.verdict == "ready"


@pytest.mark.gpu
def test_probe_local_on_a_gpu_node() -> None:
    report = hardware.probe_local()
    if not report.has_driver:
        pytest.skip("no NVIDIA driver here")
    node = report.nodes[0]
    assert node.gpus and node.device_count == len(node.gpus)
    assert all(isinstance(g.uuid, str) and g.uuid.startswith("GPU-") for g in node.gpus)
    assert isinstance(node.driver_version, str)


# --------------------------------------------------------- property: JSON round trip of any report


@pytest.mark.parametrize("name", ["gb300-tp8-healthy", "gb300-tp16-healthy"])
def test_tray_snapshots_name_the_pods_view_they_cannot_see(name: str) -> None:
    # the label value GPU feature discovery sets: "<clusterUuid>.<cliqueId>" of the trays' GPUs,
    # read here from the snapshot files themselves
    files = sorted((SNAPSHOTS / name).glob("*.json"))
    fabrics = {
        (g["fabric"]["cluster_uuid"], g["fabric"]["clique_id"])
        for f in files
        for n in json.loads(f.read_text())["nodes"]
        for g in n["gpus"]
    }
    ((uuid, cid),) = fabrics
    (check,) = [c for c in hardware_checks(scenario(name)) if c.id == "fabric.pods"]
    assert check.status is Status.UNKNOWN and not check.blocking
    assert f"nvidia.com/gpu.clique={uuid}.{cid}" in check.message
    assert f"all {len(files)} nodes" in check.message
    assert "kubectl get nodes -l" in check.remedy and "nvidia-caps-imex-channels" in check.remedy


@pytest.mark.parametrize("name", ["gb300-tp16-split-clique", "gb300-tp8-fabric-incomplete"])
def test_no_pods_view_finding_where_the_fabric_already_fails(name: str) -> None:
    assert "fabric.pods" not in {c.id for c in hardware_checks(scenario(name))}


def test_one_node_needs_no_pods_view_finding() -> None:
    assert "fabric.pods" not in {c.id for c in hardware_checks(hardware.load_snapshot(H200))}


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_why = st.builds(Unavailable, st.text(min_size=1, max_size=20))


def _or_unknown(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(strategy, _why)


_fabric = st.builds(
    hardware.FabricInfo,
    st.sampled_from(["not_supported", "not_started", "in_progress", "completed"]),
    st.sampled_from(["success", "NVML_ERROR_UNKNOWN"]),
    st.uuids().map(str),
    st.integers(0, 2**32 - 1),
)
_link = st.builds(
    hardware.NvLinkInfo,
    st.integers(0, 17),
    _or_unknown(st.booleans()),
    _or_unknown(st.sampled_from(["4.0", "5.0"])),
    _or_unknown(st.text(max_size=16)),
    _or_unknown(st.sampled_from(["gpu", "switch"])),
)
_gpu = st.builds(
    hardware.GpuInfo,
    index=st.integers(0, 7),
    name=_or_unknown(st.text(max_size=20)),
    uuid=_or_unknown(st.text(max_size=40)),
    compute_capability=_or_unknown(st.tuples(st.integers(7, 12), st.integers(0, 9))),
    memory_total_mib=_or_unknown(st.integers(0, 10**6)),
    mig_mode=_or_unknown(st.booleans()),
    ecc=_or_unknown(st.booleans()),
    persistence=_or_unknown(st.booleans()),
    throttle_reasons=_or_unknown(st.lists(st.sampled_from(["gpu_idle", "hw_slowdown"]))),
    nvlinks=_or_unknown(st.lists(_link, max_size=3)),
    fabric=_or_unknown(_fabric),
    multicast_supported=_or_unknown(st.booleans()),
    pci_bus_id=_or_unknown(st.text(max_size=16)),
    lost=st.one_of(st.none(), st.text(max_size=10)),
)
_node = st.builds(
    hardware.NodeReport,
    hostname=st.text(min_size=1, max_size=12),
    captured_at=st.just("2026-11-30T00:00:00+00:00"),
    driver_version=_or_unknown(st.text(max_size=12)),
    cuda_driver_version=_or_unknown(st.sampled_from(["12.8", "13.0"])),
    gpus=st.lists(_gpu, max_size=3),
    p2p=_or_unknown(
        st.lists(
            st.builds(
                hardware.P2PStatus,
                st.integers(0, 3),
                st.integers(0, 3),
                st.sampled_from(["ok", "not_supported"]),
            ),
            max_size=3,
        )
    ),
    imex_channels=_or_unknown(st.lists(st.sampled_from(["channel0", "channel1"]), max_size=2)),
    no_driver_reason=st.one_of(st.none(), st.text(max_size=10)),
    device_count=_or_unknown(st.integers(0, 8)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_node, min_size=1, max_size=3), st.sampled_from(["live", "recorded", "simulated"]))
def test_any_report_round_trips_through_json(nodes: list, source: str) -> None:
    report = HardwareReport(nodes=nodes, source=source)  # type: ignore[arg-type]
    text = json.dumps(report.to_json())
    assert HardwareReport.from_json(json.loads(text)) == report


def test_nvidia_smi_fallback_parses_the_csv_query() -> None:
    from kimictl.runtime.checks.hardware._smi import parse_smi

    csv = (
        "0, NVIDIA H200, GPU-36e529ec-00d8-5312-8107-981a2be1110d, 9.0, 143771, [N/A], Enabled, "
        "Enabled, 00000000:00:06.0, 580.159.04\n"
        "1, NVIDIA H200, GPU-0000, 9.0, 143771, Disabled, Disabled, Disabled, "
        "00000000:00:07.0, 580.159.04\n"
    )
    q = (SNAPSHOTS / "h200-real.nvidia-smi-q.txt").read_text()
    driver, gpus = parse_smi(csv, q)
    assert driver == "580.159.04"
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].compute_capability == (9, 0) and gpus[0].memory_total_mib == 143771
    assert isinstance(gpus[0].mig_mode, Unavailable)  # "[N/A]" is not a reading
    assert gpus[0].ecc is True and gpus[1].ecc is False and gpus[1].mig_mode is False
    assert isinstance(gpus[0].nvlinks, Unavailable) and "nvidia-smi" in gpus[0].nvlinks.reason
