"""`kimictl bench --save-result` files load unchanged where `vllm bench serve --save-result` files
do: both captured from the same load on the same CPU server (tests/fixtures/vllm_bench/capture.py,
vLLM 0.32 CPU build), read by the same reader, same keys, types and units."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.core.errors import WriteFailed
from kimictl.runtime.load import vllm_compat
from kimictl.runtime.load.loadgen import RequestRecord

FIX = Path(__file__).parent / "fixtures" / "vllm_bench"


def read_result(path: Path) -> dict[str, object]:
    """What vLLM's own sweep tools do with a result file (benchmarks/sweep: json.load, then
    run_data[key] per metric, KeyError = unusable)."""
    with path.open("rb") as f:
        data = json.load(f)
    assert isinstance(data, dict)
    return data


def test_same_reader_same_keys_types_and_units() -> None:
    vllm = read_result(FIX / "vllm_save_result.json")
    ours = read_result(FIX / "kimictl_save_result.json")
    assert set(vllm) <= set(ours), set(vllm) - set(ours)
    assert set(vllm_compat.VLLM_RESULT_KEYS) <= set(vllm)
    assert all(not isinstance(v, dict) for v in ours.values())  # flat, as vLLM's
    for key, theirs in vllm.items():
        mine = ours[key]
        if theirs is None or mine is None:
            assert theirs is None and mine is None, key
            continue
        assert type(mine) is type(theirs) or {type(mine), type(theirs)} <= {int, float}, key
        if isinstance(theirs, list):
            assert len(mine) == len(theirs), key
    # units: the same load on the same server gives figures of the same size (ms vs s would be
    # 1000x; tokens vs requests 16x); the box is shared, so only the order of magnitude is held
    for key in (
        "mean_ttft_ms",
        "median_tpot_ms",
        "mean_itl_ms",
        "p99_tpot_ms",
        "output_throughput",
        "request_throughput",
        "duration",
    ):
        ratio = float(ours[key]) / float(vllm[key])  # type: ignore[arg-type]
        assert 1 / 3 < ratio < 3, (key, ours[key], vllm[key])
    for key in ("total_output_tokens", "completed", "num_prompts", "max_concurrency", "rtfx"):
        assert ours[key] == vllm[key], key
    assert ours["request_rate"] == vllm["request_rate"] == "inf"
    q_ours, q_vllm = ours["queue_times"], vllm["queue_times"]
    assert isinstance(q_ours, list) and isinstance(q_vllm, list)
    assert all(isinstance(x, float) and x >= 0 for x in q_ours + q_vllm)


def test_spec_decode_keys_are_vllms() -> None:
    # vLLM's spec keys, written only when speculation ran, percentage rate
    assert set(vllm_compat.SPEC_KEYS) == {
        "spec_decode_acceptance_rate",
        "spec_decode_acceptance_length",
        "spec_decode_num_drafts",
        "spec_decode_draft_tokens",
        "spec_decode_accepted_tokens",
        "spec_decode_per_position_acceptance_rates",
    }
    assert not set(vllm_compat.SPEC_KEYS) & set(read_result(FIX / "vllm_save_result.json"))


def test_save_result_is_flat_atomic_and_refuses_to_overwrite(tmp_path: Path) -> None:
    summary = {"duration": 1.0, "latencies": [0.1], "kimictl": {"x": 1}}
    path = vllm_compat.save_result(summary, tmp_path / "r.json")
    assert read_result(path) == {"duration": 1.0, "latencies": [0.1]}
    with pytest.raises(WriteFailed, match="already exists.*the results are kept in") as lost:
        vllm_compat.save_result(summary, path)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    kept = Path(str(lost.value.message).rsplit(" kept in ", 1)[1].rstrip("."))
    assert read_result(kept) == {"duration": 1.0, "latencies": [0.1]}


def test_cli_save_result_needs_one_point(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        [
            "bench",
            "-t",
            "http://127.0.0.1:9",
            "--concurrency",
            "1,2",
            "--save-result",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 2
    assert "one target, one point" in capsys.readouterr().err


def _rec(start: float, latency: float) -> RequestRecord:
    r = RequestRecord("a", "c=2", 0, 0, False, 0, 0, 32, 16, start=start, end=start + latency)
    r.latency, r.ttft, r.ok = latency, 0.01, True
    return r


def test_max_concurrent_requests_is_vllms_per_second_count() -> None:
    # 8 requests of 0.2 s, two at a time: never more than 2 in flight, but all 8 touch second 0
    recs = [_rec(0.2 * (i // 2), 0.2) for i in range(8)]
    assert vllm_compat.max_concurrent_requests(recs) == 8
    spread = [_rec(1.0 * i, 0.5) for i in range(4)]  # one per second
    assert vllm_compat.max_concurrent_requests(spread) == 1
    assert vllm_compat.max_concurrent_requests([]) == 0
