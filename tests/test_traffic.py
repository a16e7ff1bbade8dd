"""Capture (observe.capture), the trace check (load.mooncake) and `bench --paired`'s refusals, fast:
no server. The capture is fed the spans the OTLP decoder makes of a real protobuf export."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from kimictl.core.errors import InputError
from kimictl.core.http1 import OWN_REQUEST_PREFIX, is_own_request, own_request_headers
from kimictl.runtime.load.mooncake import iter_trace, scan_trace
from kimictl.runtime.load.paired import span_key
from kimictl.runtime.observe.capture import CaptureWriter, check_capture_target, rolled_name
from kimictl.runtime.observe.otlp import TracedRequest, TraceStore, decode_export

T0 = 1_700_000_000.0


def span(rid: str, arrived: float, e2e: float, n_in: int = 10, n_out: int = 5) -> TracedRequest:
    return TracedRequest(
        server="127.0.0.1:8000",
        finished_at=T0 + arrived + e2e,
        ttft_s=0.01,
        e2e_s=e2e,
        queue_s=0.0,
        decode_s=e2e - 0.01,
        prompt_tokens=n_in,
        output_tokens=n_out,
        request_id=rid,
        arrived_at=T0 + arrived,
    )


def export(trace_id: bytes, parent: bytes) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    msg = ExportTraceServiceRequest()
    s = msg.resource_spans.add().scope_spans.add().spans.add()
    s.name, s.trace_id, s.parent_span_id = "llm_request", trace_id, parent
    s.start_time_unix_nano, s.end_time_unix_nano = int(T0 * 1e9), int((T0 + 1) * 1e9)
    attrs = {"gen_ai.latency.e2e": AnyValue(double_value=1.0),
             "gen_ai.usage.prompt_tokens": AnyValue(int_value=7),
             "gen_ai.usage.completion_tokens": AnyValue(int_value=3),
             "gen_ai.request.id": AnyValue(string_value="cmpl-x-0")}  # fmt: skip
    s.attributes.extend(KeyValue(key=k, value=v) for k, v in attrs.items())
    return bytes(msg.SerializeToString())


def test_a_spans_session_is_the_clients_trace_id_only_when_it_sent_one() -> None:
    tid = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
    [with_parent] = decode_export(export(tid, b"\x01" * 8), "application/x-protobuf")
    [own_trace] = decode_export(export(tid, b""), "application/x-protobuf")
    assert with_parent.session_id == tid.hex() and with_parent.arrived_at == T0
    assert own_trace.session_id is None


def test_own_requests_are_recognised_as_sent_and_as_vllm_names_them() -> None:
    rid = own_request_headers("probe")["X-Request-Id"]
    assert rid.startswith(OWN_REQUEST_PREFIX + "probe-")
    assert (
        is_own_request(rid)
        and is_own_request(f"cmpl-{rid}-0")
        and is_own_request(f"chatcmpl-{rid}")
    )
    assert not is_own_request("cmpl-3-a-0") and not is_own_request(None)
    assert span_key("cmpl-3-a-0") == "3-a" and span_key("chatcmpl-3-b") == "3-b"
    assert span_key("cmpl-3-a") is None and span_key("other") is None


def test_capture_writes_arrival_order_leaves_out_own_and_late(tmp_path: Path) -> None:
    out = check_capture_target(tmp_path / "cap.jsonl")
    w = CaptureWriter(out, arm_of=lambda s: "tuned", hold_s=5.0, clock=lambda: T0 + 1.0)
    store = TraceStore(keep_s=1e9)
    store.listeners.append(w.take)
    # finish order: the long request that arrived first ends last
    store.add([span("cmpl-b-0", 0.2, 0.1), span("cmpl-kimictl-own-probe-1-0", 0.25, 0.01)])
    store.add([span("cmpl-a-0", 0.0, 0.9), span("chatcmpl-c", 0.5, 0.1)])
    w.flush(now=T0 + 5.3)  # rows that arrived before T0 + 0.3 are safe
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["request_id"] for r in rows] == ["cmpl-a-0", "cmpl-b-0"]
    store.add([span("cmpl-late-0", 0.1, 5.5)])  # arrived before a written row: not out of order
    w.close()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["request_id"] for r in rows] == ["cmpl-a-0", "cmpl-b-0", "chatcmpl-c"]
    assert [r["timestamp"] for r in rows] == [0, 200, 500]
    first = {"timestamp": 0, "input_length": 10, "output_length": 5, "request_id": "cmpl-a-0"}
    assert rows[0] == first | {"server": "127.0.0.1:8000", "arm": "tuned"}
    assert (w.own, w.late, w.rows) == (1, 1, 3)
    assert not any(k in r for r in rows for k in ("prompt", "text", "text_input"))


def test_capture_rolls_bounded_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "cap.jsonl"
    (tmp_path / "cap.002.jsonl").write_text("mine\n")  # someone's file in the way
    w = CaptureWriter(out, hold_s=0.0, max_rows=2, max_files=3)
    w.take([span(f"cmpl-{i}-0", i * 0.1, 0.01) for i in range(9)])
    w.close()
    assert w.files == [out, rolled_name(out, 1)]
    assert (tmp_path / "cap.002.jsonl").read_text() == "mine\n"
    assert w.rows == 4 and w.stopped and "cap.002.jsonl" in w.stopped
    # each file is a trace on the one clock; the first file's rows come first
    second = [json.loads(x)["timestamp"] for x in rolled_name(out, 1).read_text().splitlines()]
    assert second == [200, 300]


@pytest.mark.parametrize("name", ["cap.jsonl", "cap.001.jsonl"])
def test_a_capture_target_that_exists_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("x\n")
    with pytest.raises(InputError, match="does not overwrite it"):
        check_capture_target(tmp_path / "cap.jsonl")
    assert (tmp_path / name).read_text() == "x\n"


def test_monitor_capture_target_that_exists_exits_2_untouched(tmp_path: Path) -> None:
    target = tmp_path / "cap.jsonl"
    target.write_text("kept\n")
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", "monitor", "http://127.0.0.1:9", "--once",
         "--traces-port", "0", "--capture", str(target)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
    assert target.read_text() == "kept\n"


ROW = '{"timestamp": %s, "input_length": %s, "output_length": %s}\n'
BAD = {
    "malformed": (ROW % (0, 5, 2) + "{oops\n", ":2: not a JSON object"),
    "order": (ROW % (50, 5, 2) + ROW % (10, 5, 2), ":2: timestamp 10 ms is before"),
    "zero": (ROW % (0, 0, 2), ":1: `input_length` must be a whole number >= 1, got 0"),
    "negative": (ROW % (0, 5, -3), ":1: `output_length` must be"),
    "text only": (
        '{"timestamp": 0, "text_input": "hi", "output_length": 2}\n',
        "no `input_length`",
    ),
    "empty": ("\n\n", "the trace has no rows"),
    "no timestamp": ('{"input_length": 5, "output_length": 2}\n', ":1: `timestamp`"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bench_paired_refuses_a_bad_trace_in_one_sentence(tmp_path: Path, case: str) -> None:
    text, expected = BAD[case]
    trace = tmp_path / "t.jsonl"
    trace.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", "bench", "--paired", "--trace", str(trace),
         "--target", "a=http://127.0.0.1:9", "--target", "b=http://127.0.0.1:9",
         "-o", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
    assert expected in " ".join(done.stderr.split()), done.stderr
    assert not (tmp_path / "r.json").exists()


def test_lengths_over_the_context_and_text_fields(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 2, "text_input": "x"}\n'
        '{"timestamp": 3, "input_length": 500, "output_length": 20, "prompt": "y"}\n'
    )
    scan = scan_trace(trace, max_context=1000)
    assert scan.rows == 2 and len(scan.notes) == 1 and "ignored" in scan.notes[0]
    with pytest.raises(InputError, match=r":2: input_length \+ output_length = 520 tokens"):
        scan_trace(trace, max_context=512)
    assert [r.at_s for r in iter_trace(trace)] == [0.0, 0.003]


def test_a_long_trace_is_checked_in_bounded_memory(tmp_path: Path) -> None:
    trace = tmp_path / "long.jsonl"
    with trace.open("w") as fh:
        for i in range(100_000):
            fh.write(f'{{"timestamp": {i}, "input_length": 9, "output_length": 4}}\n')
    tracemalloc.start()
    scan = scan_trace(trace)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert scan.rows == 100_000
    assert peak < 2 * 2**20  # a few rows at a time, not 100k


def test_paired_refuses_a_present_output_and_one_target(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n')
    (tmp_path / "r.json").write_text("{}")
    for extra, needle in (
        (["--target", "b=http://127.0.0.1:9", "-o", str(tmp_path / "r.json")], "already exists"),
        ([], "needs two targets"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "kimictl", "bench", "--paired", "--trace", str(trace),
             "--target", "a=http://127.0.0.1:9", *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and needle in done.stderr, done.stderr
    assert (tmp_path / "r.json").read_text() == "{}"


def _judged(tpot_b: float, ran: tuple[float, float] = (1e9, 1e9 + 60), **cfg: Any) -> Any:
    """_judge on 40 rows whose spans say A decodes at 20 ms/token and B at `tpot_b`, replayed
    over `ran` (unix s)."""
    from kimictl.runtime.load.paired import ArmResult, PairedConfig, PairedRow, _judge
    from kimictl.runtime.load.records import LoadTarget
    from kimictl.runtime.observe.otlp import TracedRequest

    def arm(tpot: float, i: int) -> ArmResult:
        span = TracedRequest("s", 0.0, 0.1, 0.1 + 31 * tpot, 0.0, 31 * tpot * (1 + i % 7 / 100),
                             8, 32, request_id=f"{i}")  # fmt: skip
        return ArmResult(due_s=float(i), sent_s=float(i), ok=True, span=span)

    rows = [PairedRow(i, None, 8, 32, "a", {"a": arm(0.02, i), "b": arm(tpot_b, i)})
            for i in range(40)]  # fmt: skip
    targets = (
        LoadTarget("a", "http://127.0.0.1:1", "m"),
        LoadTarget("b", "http://127.0.0.1:2", "m"),
    )
    config = PairedConfig(trace=Path("t.jsonl"), targets=targets, traces_port=1, **cfg)
    return _judge(config, rows, [], None, ran)


def test_a_decision_without_an_aa_calibration_says_it_is_uncalibrated() -> None:
    from kimictl.runtime.load.paired import UNCALIBRATED
    from kimictl.runtime.verdict.paired import aa_calibration

    faster = _judged(0.01)
    assert faster.verdict.decision == "B better" and UNCALIBRATED in faster.calibration_notes
    # judged with an A/A calibration, or an A/A run itself: no such note
    calibration = aa_calibration([0.01, -0.02, 0.0], [1e-4] * 3)
    judged = _judged(0.01, calibration=calibration)
    assert UNCALIBRATED not in judged.calibration_notes
    assert judged.verdict.calibration == calibration
    assert UNCALIBRATED not in _judged(0.02).calibration_notes  # no difference: no caveat
    assert _judged(0.01, aa=True).calibration_notes == []


def _saved(path: Path, tpot_b: float, start: float, **cfg: Any) -> Path:
    """A replay's JSON report (as `bench --paired -o` writes it), replayed from `start` for 60 s."""
    import orjson

    path.write_bytes(orjson.dumps(_judged(tpot_b, (start, start + 60), **cfg).to_json()))
    return path


def test_a_saved_replay_judged_again_is_the_same_and_takes_a_later_calibration(
    tmp_path: Path,
) -> None:
    from kimictl.runtime.load.paired import judge_again
    from kimictl.runtime.verdict.paired import aa_calibration

    doc = json.loads(_saved(tmp_path / "ab.json", 0.0195, 1e9).read_text())
    again, report = judge_again(doc, floor=0.05, calibration=None)
    assert again.to_json() == doc["verdict"]  # the report holds all the verdict reads
    assert report["per_row"] == doc["per_row"] and report["rows"] == 40
    # a wider floor turns the same rows into another decision
    assert judge_again(doc, floor=0.0, calibration=None)[0].decision == "B better"
    assert doc["verdict"]["decision"] == "no practical difference"
    # where the A/A passes ran against the replay (1e9 .. 1e9 + 60)
    cal = aa_calibration([0.01, -0.01, 0.0, 0.005], [1e-4] * 4)
    around = [(1e9 - 200, 1e9 - 140), (1e9 - 100, 1e9 - 40), (1e9 + 70, 1e9 + 130)]
    _, bracketed = judge_again(doc, floor=0.05, calibration=cal, aa_times=around)
    assert bracketed["calibration_notes"] == [
        "A/A calibration brackets this replay: 2 passes before it, 1 after"
    ]
    assert bracketed["verdict"]["calibration"]["passes"] == 4
    _, before = judge_again(doc, floor=0.05, calibration=cal, aa_times=around[:2])
    assert before["calibration_notes"][0].startswith("all 2 A/A passes ran before this replay")
    _, unknown = judge_again(doc, floor=0.05, calibration=cal, aa_times=[(math.nan, math.nan)])
    assert unknown["calibration_notes"] == []  # reports that do not say when they ran
    for bad, needle in (({"kimictl_bench": 1}, "not the JSON report"),
                        (doc | {"verdict": None, "withheld": "late"}, "no verdict"),
                        ({k: v for k, v in doc.items() if k != "per_row"}, "per_row")):  # fmt: skip
        with pytest.raises(ValueError, match=needle):
            judge_again(bad, floor=0.05, calibration=None)


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kimictl", "bench", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_bench_judge_brackets_a_saved_ab_with_aa_passes_made_after_it(tmp_path: Path) -> None:
    ab = _saved(tmp_path / "ab.json", 0.01, 1e9)
    passes = [str(_saved(tmp_path / f"aa{i}.json", 0.02 * (1 + i / 100), t, aa=True))
              for i, t in enumerate((1e9 - 300, 1e9 - 150, 1e9 + 100))]  # fmt: skip
    reports = [x for p in passes for x in ("--aa-report", p)]
    out = tmp_path / "judged.json"
    done = _bench("--paired", "--judge", str(ab), *reports, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "brackets this replay: 2 passes before it, 1 after" in done.stdout
    assert "B better" in done.stdout and "net of 3 A/A passes" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["verdict"]["calibration"]["passes"] == 3 and doc["rows"] == 40
    kept = ab.read_bytes()
    for args, needle in (
        (["--judge", str(ab)], "give it with --paired"),
        (["--paired", "--judge", str(ab), "--target", "http://127.0.0.1:9"], "no --target"),
        (["--paired", "--judge", str(tmp_path / "none.json")], "cannot read"),
        (["--paired", "--judge", passes[0], "-o", str(ab)], "already exists"),
        (["--paired", "--judge", str(ab), *["--aa-report", str(ab)] * 3], "is not the JSON"),
    ):
        bad = _bench(*args)
        assert bad.returncode == 2 and needle in bad.stderr, (args, bad.stderr)
        assert "Traceback" not in bad.stderr
    assert ab.read_bytes() == kept
