"""The filtered /metrics scrape (observe.scrape.MetricsScraper) against real HTTP servers: one that
applies prometheus_client's `?name[]=SAMPLE` filter, one that ignores it (the full text on any
path, as vLLM's exact /metrics route does), one that rejects /metrics/, and one that fails."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from kimictl.core.errors import EndpointError
from kimictl.runtime.observe.names import REQUEST_SUCCESS, SAMPLE_NAMES
from kimictl.runtime.observe.poller import MAX_BACKOFF_S, SCRAPE_BUDGET, EndpointPoller
from kimictl.runtime.observe.scrape import FilterMode, MetricsScraper, honours_filter
from kimictl.runtime.observe.snapshot import MetricsSnapshot, snapshot_from_text

FIX = Path(__file__).parent / "fixtures" / "metrics"
FULL = (FIX / "load_t2.txt").read_text()  # a real capture of the CPU vLLM server's /metrics


def _sample_name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0]


def _filtered(text: str, names: list[str]) -> str:
    """What prometheus_client's RestrictedRegistry renders: only samples with the given names."""
    keep = set(names)
    return "".join(
        line + "\n" for line in text.splitlines() if line and line[0] != "#" and
        _sample_name(line) in keep
    )  # fmt: skip


class _Server(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    behaviour = "honour"  # honour | ignore | reject | fail
    paths: list[str] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        parts = urlsplit(self.path)
        names = parse_qs(parts.query).get("name[]")
        status, body = 200, FULL
        if self.behaviour == "fail":
            status, body = 503, "overloaded"
        elif parts.path == "/metrics/" and self.behaviour == "reject":
            status, body = 404, '{"detail":"Not Found"}'
        elif names and self.behaviour == "honour":
            body = _filtered(FULL, names)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator:  # type: ignore[type-arg]
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(behaviour: str) -> tuple[str, list[str]]:
        handler = type("H", (_Server,), {"behaviour": behaviour, "paths": []})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1", handler.paths

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _same(a: MetricsSnapshot, b: MetricsSnapshot) -> None:
    assert a.gauges == b.gauges and a.counters == b.counters
    assert a.histograms == b.histograms and a.process_start == b.process_start
    assert a.models == b.models and a.engines == b.engines


async def _scrapes(url: str, n: int) -> tuple[MetricsScraper, list[MetricsSnapshot]]:
    scraper = MetricsScraper(url)
    try:
        return scraper, [await scraper.scrape(timeout=5) for _ in range(n)]
    finally:
        scraper.close()


async def test_a_server_that_honours_the_filter_is_scraped_filtered(serve) -> None:  # type: ignore[no-untyped-def]
    url, paths = serve("honour")
    scraper, snaps = await _scrapes(url, 3)
    assert scraper.mode is FilterMode.FILTERED
    assert len(paths) == 3 and all(p.startswith("/metrics/?name%5B%5D=") for p in paths)
    asked = parse_qs(urlsplit(paths[0]).query)["name[]"]
    assert sorted(asked) == sorted(SAMPLE_NAMES)
    for snap in snaps:
        _same(snap, snapshot_from_text(FULL))
    assert len(_filtered(FULL, asked)) < len(FULL) / 3  # the point: far less text to render


async def test_a_server_that_ignores_the_filter_falls_back_once_and_remembers(serve) -> None:  # type: ignore[no-untyped-def]
    url, paths = serve("ignore")
    scraper, snaps = await _scrapes(url, 3)
    assert scraper.mode is FilterMode.FULL
    # the first (filtered) answer was the full text: used as is, no second request for it
    assert paths[0].startswith("/metrics/?name") and paths[1:] == ["/metrics", "/metrics"]
    for snap in snaps:
        _same(snap, snapshot_from_text(FULL))


async def test_a_server_that_rejects_the_filter_path_is_asked_in_full_at_once(serve) -> None:  # type: ignore[no-untyped-def]
    url, paths = serve("reject")
    scraper, snaps = await _scrapes(url, 2)
    assert scraper.mode is FilterMode.FULL
    assert paths[0].startswith("/metrics/?name") and paths[1:] == ["/metrics", "/metrics"]
    assert len(snaps) == 2  # the 404 cost no scrape
    _same(snaps[0], snapshot_from_text(FULL))


async def test_a_failing_server_decides_nothing(serve) -> None:  # type: ignore[no-untyped-def]
    url, paths = serve("fail")
    scraper = MetricsScraper(url)
    try:
        with pytest.raises(EndpointError, match="HTTP 503"):
            await scraper.scrape(timeout=5)
    finally:
        scraper.close()
    assert scraper.mode is FilterMode.UNKNOWN  # the next scrape asks filtered again
    assert len(paths) == 2


def test_honours_filter_reads_sample_names() -> None:
    assert honours_filter(_filtered(FULL, list(SAMPLE_NAMES)))
    assert not honours_filter(FULL)  # python_gc_*, http_* ... were not asked for
    assert not honours_filter("# HELP x\n# TYPE x gauge\n")  # nothing at all is not an answer


# ---- against the real CPU vLLM server (slow; run under the flock, see tests/conftest.py)


def _names(text: str) -> set[str]:
    return {_sample_name(line) for line in text.splitlines() if line and line[0] != "#"}


@pytest.mark.slow
async def test_real_vllm_filtered_scrape_has_what_the_monitor_needs(cpu_server) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    import httpx

    from kimictl.core.http1 import fetch_text
    from kimictl.runtime.observe.names import GAUGES, GENERATION_TOKENS, HISTOGRAMS
    from kimictl.runtime.observe.scrape import FILTER_PATH
    from kimictl.runtime.observe.window import compute_window

    filtered, full = MetricsScraper(cpu_server.url), MetricsScraper(cpu_server.url)
    full.mode = FilterMode.FULL

    async def pair() -> tuple[MetricsSnapshot, MetricsSnapshot]:
        # the server is idle between the two GETs: both must read the same values
        a, b = await filtered.scrape(timeout=30), await full.scrape(timeout=30)
        # same clock for both, so that the window math sees the same elapsed time
        return dataclasses.replace(a, taken_at=b.taken_at, monotonic=b.monotonic), b

    try:
        before = await pair()
        async with httpx.AsyncClient(timeout=300) as client:
            for prompt in ("one", "two two", "three three three"):
                reply = await client.post(
                    f"{cpu_server.url}/v1/completions",
                    json={"model": cpu_server.model, "prompt": prompt, "max_tokens": 24},
                )
                assert reply.status_code == 200
        await asyncio.sleep(2)  # the engine's last stats reach the API server after the reply
        after = await pair()
    finally:
        filtered.close()
        full.close()
    assert filtered.mode is FilterMode.FILTERED and full.mode is FilterMode.FULL
    for f, g in (before, after):
        _same(f, g)
    stats_f, stats_g = compute_window(before[0], after[0]), compute_window(before[1], after[1])
    assert stats_f.to_json() == stats_g.to_json()
    assert stats_f.requests_finished == 3 and stats_f.tokens_per_s

    text_full = await fetch_text(cpu_server.url, "/metrics")
    text_filtered = await fetch_text(cpu_server.url, "/metrics" + FILTER_PATH)
    assert honours_filter(text_filtered)
    # nothing the monitor reads is lost: every wanted sample the full text has, the filtered has
    assert _names(text_filtered) == _names(text_full) & set(SAMPLE_NAMES)
    for needed in (*GAUGES, GENERATION_TOKENS + "_total", *(h + "_bucket" for h in HISTOGRAMS)):
        assert needed in _names(text_filtered), needed
    assert len(text_filtered) < len(text_full) / 3
    print(f"\nfull {len(text_full)} B, filtered {len(text_filtered)} B")


async def test_slow_answers_slow_the_poller_down_and_fast_ones_restore_it() -> None:
    delay = {"s": 0.15}

    class Slow(_Server):
        behaviour = "ignore"
        paths: list[str] = []

        def do_GET(self) -> None:
            time.sleep(delay["s"])
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    poller = EndpointPoller("slow", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        assert await poller.poll(interval=0.5)
        paced = poller.paced_s
        assert paced is not None and 0.15 / SCRAPE_BUDGET <= paced <= MAX_BACKOFF_S
        assert not poller.due(time.monotonic())  # not before `paced` after the last start
        view = poller.view(10, interval=0.5)
        assert view.paced_s == paced and view.stale_since is None  # paced is not stale
        assert view.to_json()["paced_s"] == paced
        poller.next_try_mono = 0.0
        delay["s"] = 0.0
        assert await poller.poll(interval=0.5)
        assert poller.paced_s is None and poller.due(time.monotonic())
    finally:
        poller.close()
        server.shutdown()
        server.server_close()


# --- the other readers of /metrics: validate's finished-request count, bench's server view ------
_SUCCESS = REQUEST_SUCCESS + "_total"


async def test_a_scraper_asks_only_for_the_samples_it_is_given(serve) -> None:  # type: ignore[no-untyped-def]
    url, paths = serve("honour")
    scraper = MetricsScraper(url, names=(_SUCCESS,))
    try:
        snap = await scraper.scrape(timeout=5)
    finally:
        scraper.close()
    assert scraper.mode is FilterMode.FILTERED
    assert parse_qs(urlsplit(paths[0]).query)["name[]"] == [_SUCCESS]
    assert snap.counters == {REQUEST_SUCCESS: snapshot_from_text(FULL).counters[REQUEST_SUCCESS]}
    assert not snap.histograms and not snap.gauges
    with pytest.raises(ValueError, match="not samples a snapshot reads"):
        MetricsScraper(url, names=("python_gc_objects_collected_total",))


@pytest.mark.parametrize("behaviour", ["honour", "ignore", "reject"])
def test_validate_counts_finished_requests_through_the_scraper(serve, behaviour: str) -> None:  # type: ignore[no-untyped-def]
    from kimictl.runtime.evals.client import Endpoint

    url, paths = serve(behaviour)
    want = snapshot_from_text(FULL).counters[REQUEST_SUCCESS]
    assert want > 0
    assert Endpoint(url, name="cand").finished_requests() == want
    assert paths[0] == "/metrics/?" + urlencode([("name[]", _SUCCESS)])
    # a server that ignores the filter answered in full: one GET; one that rejects it: two
    assert len(paths) == (2 if behaviour == "reject" else 1)


def test_validate_finished_requests_is_none_when_metrics_cannot_be_read(serve) -> None:  # type: ignore[no-untyped-def]
    from kimictl.runtime.evals.client import Endpoint

    url, paths = serve("fail")
    assert Endpoint(url).finished_requests() is None and len(paths) == 2
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert Endpoint(dead).finished_requests() is None


@pytest.mark.slow
async def test_bench_and_validate_read_the_real_server_through_the_scraper(cpu_server) -> None:  # type: ignore[no-untyped-def]
    from kimictl.runtime.evals.client import Endpoint
    from kimictl.runtime.load.loadgen import run_load
    from kimictl.runtime.load.records import LoadPoint, LoadSettings, LoadTarget
    from kimictl.runtime.load.workloads import RandomWorkload, parse_length
    from kimictl.runtime.observe.window import compute_window

    ep = Endpoint(cpu_server.url)
    before = await asyncio.to_thread(ep.finished_requests)
    assert before is not None
    records = await run_load(
        [LoadTarget("t", cpu_server.url, cpu_server.model)],
        RandomWorkload(parse_length("16"), parse_length("8")),
        LoadSettings(points=(LoadPoint(concurrency=2),), num_prompts=3, scrape_metrics=True),
    )
    assert len(records) == 3 and all(r.ok for r in records)
    ((old, new),) = records.metrics.values()
    window = compute_window(old, new)
    assert window.requests_finished == 3
    assert window.tokens_per_s and new.histograms and new.gauges  # the monitor's whole view
    after = before
    deadline = time.monotonic() + 10  # the engine's last stats reach the API server after a reply
    while after == before and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        after = await asyncio.to_thread(ep.finished_requests)
    assert after == before + 3
