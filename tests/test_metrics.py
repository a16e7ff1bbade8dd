"""Window math of runtime.observe on /metrics texts recorded from the real CPU vLLM server
(tests/fixtures/metrics, captured with capture.py there: `load_*` from a loaded server, `spec_*`
from a fresh server with ngram speculation, i.e. a restart relative to `load_*`)."""

from __future__ import annotations

import asyncio
import http.server
import json
import math
import random
import re
import socket
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimictl.core.errors import EndpointError, InputError
from kimictl.runtime.observe.names import (
    GENERATION_TOKENS,
    KV_CACHE_USAGE,
    REQUEST_SUCCESS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SPEC_ACCEPTED_PER_POS,
    SPEC_ACCEPTED_TOKENS,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
)
from kimictl.runtime.observe.poller import (
    EndpointPoller,
    EndpointStatus,
    EndpointView,
    ab_pair_of,
    monitor_snapshot,
)
from kimictl.runtime.observe.prometheus import Histogram, parse_prometheus_text
from kimictl.runtime.observe.scrape import MetricsScraper
from kimictl.runtime.observe.snapshot import MetricsSnapshot, merge_snapshots, snapshot_from_text
from kimictl.runtime.observe.window import MetricsSeries, compute_window, parse_window

FIX = Path(__file__).parent / "fixtures" / "metrics"


def text(name: str) -> str:
    return (FIX / f"{name}.txt").read_text()


def gaps(prefix: str) -> list[float]:
    return json.loads((FIX / f"{prefix}_meta.json").read_text())["gaps_s"]


def snaps(prefix: str) -> list[MetricsSnapshot]:
    g = gaps(prefix)
    times = [0.0, g[0], g[0] + g[1]]
    return [
        snapshot_from_text(text(f"{prefix}_t{i}"), monotonic=times[i], taken_at=1e9 + times[i])
        for i in range(3)
    ]


def grep_sum(txt: str, sample: str) -> float:
    """Independent reading of a sample's value summed over its label sets (a plain regex)."""
    pattern = re.compile(rf"^{re.escape(sample)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(txt))


def drop_family(txt: str, family: str) -> str:
    return "\n".join(line for line in txt.splitlines() if family not in line)


# ---- parsing


def test_parser_reads_labels_escapes_and_skips_bad_lines() -> None:
    src = (
        "# TYPE demo_total counter\n"
        'demo_total{a="x",b="q\\"uote\\\\back",c="line\\nbreak"} 3.5\n'
        "this line is garbage\n"
        'demo_total{a="y"} +Inf\n'
        "plain_gauge 7 1700000000000\n"
    )
    samples, types = parse_prometheus_text(src)
    assert types == {"demo_total": "counter"}
    assert [s.name for s in samples] == ["demo_total", "demo_total", "plain_gauge"]
    assert samples[0].label("b") == 'q"uote\\back'
    assert samples[0].label("c") == "line\nbreak"
    assert math.isinf(samples[1].value)
    assert samples[2].value == 7.0


def test_snapshot_sums_label_sets_like_an_independent_reading() -> None:
    raw = text("load_t2")
    snap = snapshot_from_text(raw)
    assert snap.counters[GENERATION_TOKENS] == grep_sum(raw, GENERATION_TOKENS + "_total")
    # request_success has one sample per finished_reason: all of them count
    assert raw.count(REQUEST_SUCCESS + "_total{") >= 2
    assert snap.counters[REQUEST_SUCCESS] == grep_sum(raw, REQUEST_SUCCESS + "_total")
    tpot = snap.histograms[TIME_PER_OUTPUT_TOKEN]
    assert tpot.count == grep_sum(raw, TIME_PER_OUTPUT_TOKEN + "_count")
    assert tpot.cumulative[-1] == tpot.count and math.isinf(tpot.bounds[-1])
    assert list(tpot.cumulative) == sorted(tpot.cumulative)
    assert snap.process_start == grep_sum(raw, "process_start_time_seconds")
    assert snap.models == ("tiny-k2",)


def test_model_filter_keeps_only_that_model() -> None:
    assert snapshot_from_text(text("load_t2"), model="other").counters == {}
    assert snapshot_from_text(text("load_t2"), model="tiny-k2").counters


# ---- windows on real captures


def test_window_rates_are_deltas_over_elapsed_time() -> None:
    t0, _, t2 = snaps("load")
    w = compute_window(t0, t2)
    dt = sum(gaps("load"))
    gen = grep_sum(text("load_t2"), GENERATION_TOKENS + "_total") - grep_sum(
        text("load_t0"), GENERATION_TOKENS + "_total"
    )
    assert gen > 0
    assert w.window_s == pytest.approx(dt)
    assert w.tokens_per_s == pytest.approx(gen / dt)
    done = t2.counters[REQUEST_SUCCESS] - t0.counters[REQUEST_SUCCESS]
    assert w.requests_finished == done and w.request_rate == pytest.approx(done / dt)
    assert w.resets == 0 and w.missing == ()


def test_window_is_not_a_since_start_average() -> None:
    t0, t1, t2 = snaps("load")
    since_start = t2.counters[GENERATION_TOKENS]
    late = compute_window(t1, t2)
    assert late.tokens_per_s == pytest.approx(
        (t2.counters[GENERATION_TOKENS] - t1.counters[GENERATION_TOKENS])
        / (t2.monotonic - t1.monotonic)
    )
    assert late.tokens_per_s * late.window_s < since_start


def test_interactivity_percentiles_mirror_tpot_percentiles() -> None:
    # the fixture was captured with vLLM's default buckets: 10-50 ms TPOT lands in buckets 60-150%
    # wide, so every TPOT percentile is a range (the bucket), never a number
    t0, _, t2 = snaps("load")
    w = compute_window(t0, t2)
    d = t2.histograms[TIME_PER_OUTPUT_TOKEN].minus(t0.histograms[TIME_PER_OUTPUT_TOKEN])
    for key, speed_key, q in (
        ("tpot_p10_ms", "interactivity_p90", 0.1),
        ("tpot_p50_ms", "interactivity_p50", 0.5),
        ("tpot_p90_ms", "interactivity_p10", 0.9),
    ):
        assert getattr(w, key) is None and getattr(w, speed_key) is None
        i = next(k for k, c in enumerate(d.cumulative) if c >= q * d.count)
        lower = d.bounds[i - 1] if i else 0.0
        ms, speed = w.unresolved[key], w.unresolved[speed_key]
        assert ms["bucket_s"] == [lower, d.bounds[i]] == speed["bucket_s"]
        assert ms["bound"] == "range" and ms["low"] == pytest.approx(lower * 1000)
        assert speed["low"] == pytest.approx(1 / d.bounds[i])
        assert speed["high"] == pytest.approx(1 / lower)
    assert set(w.to_json()["unresolved"]) >= {"interactivity_p10", "interactivity_p90"}


def test_gauges_come_from_the_newest_scrape() -> None:
    t0, t1, _ = snaps("load")
    w = compute_window(t0, t1)
    assert w.running == grep_sum(text("load_t1"), REQUESTS_RUNNING)
    assert w.waiting == grep_sum(text("load_t1"), REQUESTS_WAITING)
    assert w.kv_cache_usage == grep_sum(text("load_t1"), KV_CACHE_USAGE)


def test_empty_window_has_no_percentiles_and_zero_rates() -> None:
    t0 = snaps("load")[0]
    again = snapshot_from_text(text("load_t0"), monotonic=5.0)
    w = compute_window(t0, again)
    assert w.tokens_per_s == 0.0
    assert w.interactivity_p10 is None and w.ttft_p90_ms is None


# ---- restarts, missing families, merging


def test_restart_between_two_scrapes_counts_from_zero() -> None:
    _, _, load2 = snaps("load")
    spec = snaps("spec")
    fresh = MetricsSnapshot(**{**_fields(spec[2]), "monotonic": load2.monotonic + 10})
    assert fresh.counters[GENERATION_TOKENS] < load2.counters[GENERATION_TOKENS]
    w = compute_window(load2, fresh)
    assert w.resets == 1
    assert w.tokens_per_s == pytest.approx(fresh.counters[GENERATION_TOKENS] / 10)
    assert w.tokens_per_s >= 0


def test_restart_detected_by_start_time_even_when_counters_grew() -> None:
    a = snapshot_from_text(
        "process_start_time_seconds 100\nvllm:generation_tokens_total 5\n", monotonic=0
    )
    b = snapshot_from_text(
        "process_start_time_seconds 200\nvllm:generation_tokens_total 8\n", monotonic=1
    )
    assert compute_window(a, b).tokens_per_s == 8.0


def _fields(s: MetricsSnapshot) -> dict[str, object]:
    return {f: getattr(s, f) for f in MetricsSnapshot.__dataclass_fields__}


def test_series_keeps_counts_from_both_sides_of_a_restart() -> None:
    load = snaps("load")
    spec = snaps("spec")
    series = MetricsSeries()
    for s in load:
        series.ingest(s)
    base = load[2].monotonic + 3.0
    for s in spec:  # the server restarted (the fresh spec server) 3 s after load_t2
        series.ingest(MetricsSnapshot(**{**_fields(s), "monotonic": base + s.monotonic}))
    w = series.window(3600)
    assert w is not None and w.resets == 1
    gen = GENERATION_TOKENS
    expected = (load[2].counters[gen] - load[0].counters[gen]) + spec[2].counters[gen]
    assert w.tokens_per_s * w.window_s == pytest.approx(expected)
    ok = REQUEST_SUCCESS
    done = (load[2].counters[ok] - load[0].counters[ok]) + spec[2].counters[ok]
    assert w.requests_finished == pytest.approx(done)
    tail = series.window(1.0)  # a window after the restart sees no reset
    assert tail is not None and tail.resets == 0


def test_series_window_picks_the_scrape_at_the_window_start() -> None:
    series = MetricsSeries()
    for t in range(0, 31):
        series.ingest(
            snapshot_from_text(f"vllm:generation_tokens_total {t * t}\n", monotonic=float(t))
        )
    w10 = series.window(10)
    assert w10 is not None and w10.window_s == 10
    assert w10.tokens_per_s == pytest.approx((30 * 30 - 20 * 20) / 10)
    long = series.window(300)  # longer than the history: the whole history, labelled as such
    assert long is not None and long.window_s == 30


def test_series_drops_history_older_than_keep() -> None:
    series = MetricsSeries(keep_s=20)
    for t in range(100):
        series.ingest(snapshot_from_text(f"vllm:generation_tokens_total {t}\n", monotonic=float(t)))
    assert len(series) <= 23


def test_missing_family_gives_none_and_is_listed() -> None:
    raw0 = drop_family(text("load_t0"), TIME_PER_OUTPUT_TOKEN)
    raw2 = drop_family(text("load_t2"), TIME_PER_OUTPUT_TOKEN)
    w = compute_window(
        snapshot_from_text(raw0, monotonic=0), snapshot_from_text(raw2, monotonic=12)
    )
    assert w.interactivity_p10 is None and w.tpot_p90_ms is None
    assert w.missing == (TIME_PER_OUTPUT_TOKEN,)
    assert w.tokens_per_s is not None and w.tokens_per_s > 0  # the rest still works
    # no speculation configured: spec figures are None but not "missing"
    assert w.spec_acceptance_length is None


def test_family_appearing_mid_window_gives_no_delta() -> None:
    old = snapshot_from_text(drop_family(text("load_t0"), GENERATION_TOKENS), monotonic=0)
    new = snapshot_from_text(text("load_t2"), monotonic=12)
    assert compute_window(old, new).tokens_per_s is None


def test_merging_engines_sums_buckets_not_percentiles() -> None:
    raw = [text("load_t0"), text("load_t2")]
    two = [r + "\n" + r.replace('engine="0"', 'engine="1"') for r in raw]
    one_w = compute_window(
        snapshot_from_text(raw[0], monotonic=0), snapshot_from_text(raw[1], monotonic=10)
    )
    s0, s1 = (snapshot_from_text(t, monotonic=i * 10.0) for i, t in enumerate(two))
    assert s1.engines == 2
    two_w = compute_window(s0, s1)
    assert two_w.tokens_per_s == pytest.approx(2 * one_w.tokens_per_s)
    assert two_w.interactivity_p10 == pytest.approx(one_w.interactivity_p10)
    assert two_w.kv_cache_usage == pytest.approx(one_w.kv_cache_usage)
    # replicas (two scrapes) merge the same way
    merged = [
        merge_snapshots([snapshot_from_text(r, monotonic=i * 10.0)] * 2) for i, r in enumerate(raw)
    ]
    assert compute_window(*merged).tokens_per_s == pytest.approx(two_w.tokens_per_s)


def test_merge_of_differently_bucketed_histograms_drops_them() -> None:
    name = TIME_TO_FIRST_TOKEN + "_bucket"
    a = snapshot_from_text(f'{name}{{le="1"}} 1\n{name}{{le="+Inf"}} 1\n')
    b = snapshot_from_text(f'{name}{{le="2"}} 1\n{name}{{le="+Inf"}} 1\n')
    assert TIME_TO_FIRST_TOKEN not in merge_snapshots([a, b]).histograms


# ---- speculative decoding (real ngram-spec server; accepted counts edited where noted)


def test_spec_acceptance_from_real_counters() -> None:
    s0, _, s2 = snaps("spec")
    w = compute_window(s0, s2)
    drafts = s2.counters[SPEC_DRAFTS] - s0.counters[SPEC_DRAFTS]
    accepted = s2.counters[SPEC_ACCEPTED_TOKENS] - s0.counters[SPEC_ACCEPTED_TOKENS]
    assert drafts > 0
    assert w.spec_acceptance_length == pytest.approx(1 + accepted / drafts)
    assert len(w.spec_acceptance_per_pos) == 3


def set_sample(txt: str, sample: str, value: float, label: str = "") -> str:
    """Edit one counter of a real capture (the lines matching `sample{...label...}`)."""
    pat = rf"^({re.escape(sample)}\{{[^}}]*{re.escape(label)}[^}}]*\}}) \S+$"
    return re.sub(pat, rf"\g<1> {value}", txt, flags=re.M)


def test_spec_acceptance_length_and_rate_formulas() -> None:
    def edited(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> str:
        out = text("spec_t2")
        out = set_sample(out, SPEC_DRAFTS + "_total", drafts)
        out = set_sample(out, SPEC_DRAFT_TOKENS + "_total", draft_tokens)
        out = set_sample(out, SPEC_ACCEPTED_TOKENS + "_total", accepted)
        for pos, v in enumerate(per_pos):
            out = set_sample(out, SPEC_ACCEPTED_PER_POS + "_total", v, f'position="{pos}"')
        return out

    old = snapshot_from_text(edited(7, 19, 0, [0, 0, 0]), monotonic=0)
    new = snapshot_from_text(edited(13, 37, 12, [6, 4, 2]), monotonic=1)
    w = compute_window(old, new)
    assert w.spec_acceptance_length == pytest.approx(1 + 12 / 6)
    assert w.spec_acceptance_rate == pytest.approx(12 / 18)
    assert w.spec_acceptance_per_pos == pytest.approx((1.0, 4 / 6, 2 / 6))


# ---- histogram quantiles (property: agrees with the buckets of raw samples)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(min_value=0.0005, max_value=3.0), min_size=1, max_size=200),
    q=st.sampled_from([0.1, 0.5, 0.9, 0.99]),
)
def test_quantile_lands_in_the_bucket_of_the_true_quantile(values: list[float], q: float) -> None:
    bounds = (0.001, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 2.5, math.inf)
    cum = tuple(float(sum(v <= b for v in values)) for b in bounds)
    h = Histogram(bounds, cum, float(len(values)), sum(values))
    est = h.quantile(q)
    assert est is not None
    ordered = sorted(values)
    true = ordered[max(0, math.ceil(q * len(values)) - 1)]
    i = next(k for k, b in enumerate(bounds) if true <= b)
    lo = bounds[i - 1] if i else 0.0
    hi = bounds[i] if not math.isinf(bounds[i]) else bounds[i - 1]
    assert lo - 1e-12 <= est <= hi + 1e-12


def test_quantile_of_empty_histogram_is_none() -> None:
    assert Histogram((1.0, math.inf), (0.0, 0.0), 0.0, 0.0).quantile(0.5) is None


def test_quantile_reproducible_random_counts_monotone() -> None:
    rng = random.Random(7)
    bounds = (0.01, 0.05, 0.1, math.inf)
    counts = [rng.randint(0, 20) for _ in bounds]
    cum = tuple(float(sum(counts[: i + 1])) for i in range(len(counts)))
    h = Histogram(bounds, cum, cum[-1], 0.0)
    qs = [h.quantile(x / 20) for x in range(1, 20)]
    assert all(a is not None and b is not None and a <= b for a, b in zip(qs, qs[1:], strict=False))


# ---- windows and polling


@pytest.mark.parametrize(
    ("raw", "seconds"), [("10s", 10), ("1m", 60), ("5m", 300), ("2.5", 2.5), ("500ms", 0.5)]
)
def test_parse_window(raw: str, seconds: float) -> None:
    assert parse_window(raw) == seconds


@pytest.mark.parametrize("raw", ["", "abc", "-5s", "0", "1h"])
def test_parse_window_rejects_with_a_sentence(raw: str) -> None:
    with pytest.raises(InputError, match="--window .* is not a duration: use seconds"):
        parse_window(raw)


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers GET /metrics with the next (status, body) of `script`, one connection per answer."""

    protocol_version = "HTTP/1.1"
    script: list[tuple[int, bytes]] = []

    def do_GET(self) -> None:
        # a server that ignores prometheus_client's ?name[]= filter (the full text on any path)
        assert self.path == "/metrics" or self.path.startswith("/metrics/?name")
        status, body = type(self).script.pop(0)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[http.server.BaseHTTPRequestHandler], port: int = 0):  # type: ignore[no-untyped-def]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stop(server: http.server.ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


async def test_poller_goes_down_with_reason_backs_off_and_recovers() -> None:
    ok = [(200, text(f"load_t{i}").encode()) for i in range(3)]
    handler = type("H", (_Scripted,), {"script": [ok[0], (503, b"dead"), ok[1], ok[2]]})
    server = _serve(handler)
    port = server.server_address[1]
    poller = EndpointPoller("a", f"http://127.0.0.1:{port}/v1")
    poller.scrape_budget = math.inf  # backoff is tested here; at 0.01 s any scrape would pace
    try:
        assert await poller.poll(interval=0.01)
        assert poller.status is EndpointStatus.UP
        _stop(server)  # nothing listens now: refused
        assert not await poller.poll(interval=0.01)
        assert poller.status is EndpointStatus.DOWN
        assert poller.reason == "connection refused or host unreachable"
        first_wait = poller.next_try_mono
        poller.next_try_mono = 0.0
        server = _serve(handler, port)
        assert not await poller.poll(interval=0.01)
        assert poller.reason == "HTTP 503" and poller.failures == 2
        assert poller.next_try_mono > first_wait  # backoff grew
        view = poller.view(10, interval=0.01)
        assert view.stale_since is not None and view.stats is None  # one scrape only: no window yet
        poller.next_try_mono = 0.0
        assert await poller.poll(interval=0.01)
        assert await poller.poll(interval=0.01)
    finally:
        poller.close()
        _stop(server)
    assert poller.status is EndpointStatus.UP and poller.reason is None
    view = poller.view(60, interval=1.0)
    assert view.stale_since is None and view.stats is not None and view.stats.tokens_per_s
    assert len(view.history) == 2


async def test_poller_skips_while_backing_off() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    poller = EndpointPoller("a", f"http://127.0.0.1:{port}")
    await poller.poll(interval=5.0)
    handler = type("H", (_Scripted,), {"script": []})  # any request would fail: empty script
    server = _serve(handler, port)
    try:
        assert not await poller.poll(interval=5.0)  # backing off: no request
    finally:
        _stop(server)
    assert poller.failures == 1


async def test_scrape_of_a_non_vllm_server_is_an_endpoint_error() -> None:
    body = (200, b"up 1\n")  # asked filtered, then in full: the same non-vLLM text
    server = _serve(type("H", (_Scripted,), {"script": [body, body]}))
    scraper = MetricsScraper(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        with pytest.raises(EndpointError, match="no vllm: metrics"):
            await scraper.scrape(timeout=5)
    finally:
        scraper.close()
        _stop(server)


def test_monitor_snapshot_has_the_documented_keys_and_ab_ratio() -> None:
    t0, _, t2 = snaps("load")
    series = MetricsSeries()
    series.ingest(t0)
    series.ingest(t2)
    stats = series.window(60)
    views = [
        EndpointView(n, "http://h", EndpointStatus.UP, None, None, 1.0, None, stats, ())
        for n in ("tuned", "stock")
    ]
    doc = monitor_snapshot(views, window_s=60, ab=ab_pair_of(["tuned", "stock"]))
    for key in (
        "tokens_per_s",
        "interactivity_p10",
        "interactivity_p50",
        "interactivity_p90",
        "ttft_p90_ms",
        "running",
        "waiting",
        "kv_cache_usage",
        "spec_acceptance_length",
    ):
        assert key in doc["endpoints"]["tuned"]
    assert doc["ab"]["ratio"]["tokens_per_s"] == pytest.approx(1.0)
    json.dumps(doc, allow_nan=False)


# ---- the keep-alive scrape connection, over real sockets


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "length"
    body = b""
    connections: set[tuple[str, int]] = set()

    def do_GET(self) -> None:
        type(self).connections.add(self.client_address)
        self.send_response(200)
        if self.mode == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(self.body), 1000):
                part = self.body[i : i + 1000]
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("mode", ["length", "chunked"])
async def test_keepalive_scrape_reuses_one_connection(mode: str) -> None:
    handler = type(
        "H", (_Handler,), {"mode": mode, "body": text("load_t2").encode(), "connections": set()}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    poller = EndpointPoller("a", url)
    try:
        # a long interval: on a loaded machine a scrape slower than interval x the scrape budget
        # would pace the next poll (not due), which is not what this test is about
        for _ in range(3):
            assert await poller.poll(interval=30.0), (poller.status, poller.reason)
    finally:
        poller.close()
        server.shutdown()
        server.server_close()
    latest = poller.series.latest
    assert latest is not None
    assert latest.counters == snapshot_from_text(text("load_t2")).counters
    assert len(handler.connections) == 1  # three scrapes, one TCP connection


async def test_scrape_reports_refused_and_not_http() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointError, match="connection refused or host unreachable"):
        await MetricsScraper(f"http://127.0.0.1:{port}").scrape(timeout=2)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(EndpointError, match="not HTTP|connection lost"):
            await MetricsScraper(f"http://127.0.0.1:{port}").scrape(timeout=2)
    finally:
        server.close()
