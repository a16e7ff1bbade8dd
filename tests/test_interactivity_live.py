"""Proof against the real CPU server (issue 15): with the shipped cpu-demo profile's histogram
buckets the server-side windowed interactivity (the monitor's computation, observe.metrics) agrees
with bench's client-side percentiles over the same window; with vLLM's default buckets the same
window is marked unresolved instead of showing a number."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Server, run_cli_diagnosed, start_cpu_server_retrying, stop_cpu_server

from kimictl.runtime.deployment import buckets
from kimictl.runtime.deployment.profiles import load_profile

pytestmark = pytest.mark.slow

LOAD = ["--input-len", "32", "--output-len", "256", "--concurrency", "2", "--warmup", "2"]


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
    out = tmp_path / "r.json"
    args = ["bench", "-t", server.url, *LOAD, "--num-prompts", str(prompts), "--json", str(out)]
    proc = run_cli_diagnosed(args, timeout=900, server=server)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    return run


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
    # `pytest -s` shows the figures (benchmarks/RESULTS.md quotes them)
    print("\nagreement", json.dumps({"server": server, "client": client}, default=str)[:4000])
    assert server["requests_finished"] == 16 and server["unresolved"] == {}
    for server_key, client_key in (
        ("interactivity_p50", "p50"),
        ("interactivity_p90", "p90_fast_tail"),
    ):
        assert server[server_key] == pytest.approx(client[client_key], rel=0.10), (
            server_key,
            server[server_key],
            client[client_key],
        )


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
