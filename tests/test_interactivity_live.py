"""Proof against the real CPU server (issue 15): with the shipped cpu-demo profile's histogram
buckets the server-side windowed interactivity (the monitor's computation, observe.window) agrees
with the clients' own per-request timings over the same window; with vLLM's default buckets the
same window is marked unresolved instead of showing a number.

How close "agrees" can be: a histogram percentile at quantile q of N requests is interpolated
inside the bucket that holds the request of rank ceil(q*N) (Prometheus' rank convention), so it
pins that request's TPOT to one bucket (ratio 1.1) and says nothing finer. bench's own percentiles
interpolate between order statistics (numpy's convention): at p10 of 16 requests that is between
the 2nd and 3rd fastest, while the histogram reads the 2nd, and one request running alone at the
end of a closed loop makes those two differ by more than a bucket. So the check is per rank: the
clients' request of that rank lies in the server's bucket, give or take the clients' delivery
jitter and backlog (`CLOCK_SLACK`).
"""

from __future__ import annotations

import bisect
import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Server, run_cli_diagnosed, start_cpu_server_retrying, stop_cpu_server

from kimictl.deployment import buckets
from kimictl.deployment.profiles import load_profile

pytestmark = pytest.mark.slow

LOAD = ["--input-len", "32", "--output-len", "256", "--concurrency", "2", "--warmup", "2"]
# The clients time the first and last token on delivery, the engine on generation: a few ms of
# jitter over a ~2.5 s decode is ~0.2 %; the margin is for the API server's delivery backlog when
# the 2-core box is loaded (one spin loop beside it kept every rank inside its bucket).
CLOCK_SLACK = 0.05


@pytest.fixture(scope="module")
def demo_buckets_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    chb = load_profile("cpu-demo").spec.custom_histogram_buckets
    assert chb, "the shipped cpu-demo profile sets --custom-histogram-buckets"
    server = start_cpu_server_retrying(
        tmp_path_factory.mktemp("demo-buckets"), extra=buckets.flag_for(chb)
    )
    try:
        yield server
    finally:
        stop_cpu_server(server)


def _bench(server: Server, tmp_path: Path, prompts: int) -> dict:
    out, rows = tmp_path / "r.json", tmp_path / "r.csv"
    out.unlink(missing_ok=True)
    rows.unlink(missing_ok=True)
    args = ["bench", "-t", server.url, *LOAD, "--num-prompts", str(prompts)]
    args += ["-o", str(out), "--csv", str(rows)]
    proc = run_cli_diagnosed(args, timeout=900, server=server)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    with rows.open(newline="") as fh:
        measured = [r for r in csv.DictReader(fh) if r["warmup"] == "0" and r["ok"] == "1"]
    run["client_tpots_ms"] = sorted(float(r["tpot_ms"]) for r in measured if r["tpot_ms"])
    return run


def _bucket_ms(bounds_s: list[float], value_ms: float) -> tuple[float, float]:
    """The histogram bucket (ms) a percentile of `value_ms` was interpolated in."""
    i = bisect.bisect_left(bounds_s, value_ms / 1000.0)
    assert 0 < i < len(bounds_s), (value_ms, "outside the resolved buckets")
    return bounds_s[i - 1] * 1000.0, bounds_s[i] * 1000.0


def _burst_delivered(client: dict, server: dict) -> bool:
    """Clients saw tokens at over 3x the rate the server generated them: only a delivery burst
    does that (a client can receive tokens no faster than they are generated, on average)."""
    fast, generated = client.get("p90_fast_tail"), server.get("interactivity_p90")
    return bool(fast and generated and fast > 3 * generated)


def test_monitor_agrees_with_bench_clients_with_the_shipped_buckets(
    demo_buckets_server: Server, tmp_path: Path
) -> None:
    run = _bench(demo_buckets_server, tmp_path, prompts=16)
    client = run["kimictl"]["interactivity_tok_s_per_user"]
    server = run["kimictl"]["server_view"]
    if _burst_delivered(client, server):
        # On a loaded 2-core box the CPU server sometimes flushes whole responses at once: the
        # clients then time delivery, not generation (issue 15's stall). One rerun, never more.
        print("\nburst delivery, rerunning once:", client, server.get("interactivity_p90"))
        run = _bench(demo_buckets_server, tmp_path, prompts=16)
        client = run["kimictl"]["interactivity_tok_s_per_user"]
        server = run["kimictl"]["server_view"]
    tpots = run["client_tpots_ms"]
    # `pytest -s` shows the figures (docs/results.md quotes them)
    shown = {"server": server, "client": client, "client_tpots_ms": tpots}
    print("\nagreement", json.dumps(shown, default=str)[:4000])
    assert server["requests_finished"] == len(tpots) == 16
    bounds = load_profile("cpu-demo").spec.custom_histogram_buckets[buckets.FAMILY]
    resolves = buckets.range_of(bounds)
    assert resolves is not None
    if 1000.0 / tpots[len(tpots) // 2] < resolves[0]:
        # the box decodes slower than the buckets resolve (two busy cores beside the server
        # made it 5 tok/s/user against 80): the monitor then rightly shows bounds, not numbers
        pytest.skip(f"the CPU server ran below {resolves[0]:g} tok/s/user on this loaded box")
    compared = (("tpot_p50_ms", 0.50), ("tpot_p10_ms", 0.10))
    # the figures compared are resolved; a stall on a loaded box may put ITL p99 in the coarse
    # tail, which the monitor then rightly shows as a bound
    keys = [k for k, _ in compared] + ["interactivity_p50", "interactivity_p90"]
    assert not set(server["unresolved"]) & set(keys), server["unresolved"]
    for server_key, q in compared:
        low, high = _bucket_ms(bounds, server[server_key])
        ranked = tpots[math.ceil(q * len(tpots)) - 1]
        assert low * (1 - CLOCK_SLACK) <= ranked <= high * (1 + CLOCK_SLACK), (
            server_key,
            server[server_key],
            (low, high),
            ranked,
        )
    # the headline the monitor shows, against bench's: the median is not a tail, 10% holds
    assert server["interactivity_p50"] == pytest.approx(client["p50"], rel=0.10)


def test_default_buckets_mark_the_same_window_unresolved(
    cpu_server: Server, tmp_path: Path
) -> None:
    run = _bench(cpu_server, tmp_path, prompts=4)
    server = run["kimictl"]["server_view"]
    client = run["kimictl"]["interactivity_tok_s_per_user"]
    high = (server["unresolved"].get("interactivity_p50") or {}).get("high")
    if client["p50"] and high and client["p50"] > 3 * high:
        # a delivery burst (see _burst_delivered): one rerun, never more
        print("\nburst delivery, rerunning once:", client, high)
        run = _bench(cpu_server, tmp_path, prompts=4)
        server = run["kimictl"]["server_view"]
        client = run["kimictl"]["interactivity_tok_s_per_user"]
    assert client["p50"] is not None, (run["completed"], run["kimictl"]["errors_by_kind"])
    print("\nunresolved", json.dumps({"unresolved": server["unresolved"], "client": client}))
    for key in ("interactivity_p50", "interactivity_p90"):
        assert server[key] is None
        entry = server["unresolved"][key]
        low, high = entry["bucket_s"]
        assert high is not None and high in buckets.VLLM_DEFAULT_ITL_BUCKETS
        client = run["kimictl"]["interactivity_tok_s_per_user"]["p50"]
        # the bound is honest: the clients' figure lies inside it (within the bucket)
        assert (entry["low"] or 0) * 0.9 <= client <= (entry["high"] or float("inf")) * 1.1
