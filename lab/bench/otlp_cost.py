"""What exporting one trace span per request costs the vLLM server: paired A/B, export vs none.

Two CPU vLLM servers with the tiny model, identical but for `--otlp-traces-endpoint` (and the
environment `[metrics] traces = "kimictl"` renders), the traced one sending to a receiver in this
process (`kimictl monitor`'s OtlpReceiver). Pairs of short blocks of one fixed load
(`kimictl bench`: C streams x N prompts, fixed input/output lengths, no /metrics scrapes), one
block on each server, the order alternating pair by pair so the box's drift hits both arms alike.
Tracing cannot be switched on a running server, so each arm is its own server: the pairs share
the machine, not the process.

Per block: output tokens/s, TPOT and TTFT medians (client), and the API-server process's CPU
seconds per request (where vLLM builds and exports the spans). Printed: per-pair ratios traced /
untraced, their geometric mean with a 95 % t-interval over pairs, and the CPU ms per request of
each arm.

    python lab/bench/otlp_cost.py [--pairs 8] [--prompts 16] [--concurrency 4] [--output-len 64]
        [--warmup-pairs 1] [--json FILE]

`--micro N` measures the span itself instead, without a vLLM server: in the CPU runtime's Python
(the OpenTelemetry SDK and exporter vLLM uses), N spans shaped as vLLM's `llm_request` are
created and ended as `do_tracing` does (`tracer.start_span` + `set_attributes` + `end`), with the
batch processor and OTLP/HTTP exporter vLLM configures, sending to this process's receiver; the
child's CPU time per span (all its threads: creating, batching, encoding, POSTing) is the cost
one traced request adds to the API server, against the same loop with tracing off (a no-op
tracer).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

FIGURES = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "api_cpu_ms_per_request")
# t quantiles (two-sided 95 %) by degrees of freedom
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 19: 2.09, 29: 2.05}  # fmt: skip


def _t95(df: int) -> float:
    return _T95.get(df) or _T95[max(k for k in _T95 if k <= df)]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _block(url: str, pid: int, args: argparse.Namespace) -> dict[str, float]:
    argv = [sys.executable, "-m", "kimictl", "bench", "-t", url, "--input-len", "32",
            "--output-len", str(args.output_len), "--concurrency", str(args.concurrency),
            "--num-prompts", str(args.prompts), "--warmup", "0", "--no-metrics",
            "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cpu0 = _cpu_s(pid)
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900, env=env)
    cpu = _cpu_s(pid) - cpu0
    (run,) = json.loads(out.stdout)["runs"]
    return {
        "output_throughput": run["output_throughput"],
        "median_tpot_ms": run["median_tpot_ms"],
        "median_ttft_ms": run["median_ttft_ms"],
        "api_cpu_ms_per_request": cpu * 1000 / max(1, run["completed"]),
        "completed": run["completed"],
    }


def _interval(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of the ratios and its 95 % t-interval (on the logs)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    half = _t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


_MICRO_CHILD = r"""
import os, sys, time
n, endpoint, mode, rate = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.trace import SpanKind
if mode == "traced":
    provider = TracerProvider(resource=Resource.create({"service.instance.id": "127.0.0.1:1"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("vllm.llm_engine")
else:
    provider, tracer = None, trace.NoOpTracer()
attrs = {
    "gen_ai.latency.time_to_first_token": 0.041, "gen_ai.latency.e2e": 0.61,
    "gen_ai.latency.time_in_queue": 3e-05, "gen_ai.usage.prompt_tokens": 32,
    "gen_ai.usage.completion_tokens": 48, "gen_ai.latency.time_in_model_prefill": 0.03,
    "gen_ai.latency.time_in_model_decode": 0.55, "gen_ai.latency.time_in_model_inference": 0.58,
    "gen_ai.request.id": "cmpl-0123456789abcdef-0", "gen_ai.request.max_tokens": 48,
    "gen_ai.request.top_p": 1.0, "gen_ai.request.temperature": 1.0, "gen_ai.request.n": 1,
}
cpu0, wall0 = time.process_time(), time.monotonic()
for i in range(n):
    span = tracer.start_span("llm_request", start_time=time.time_ns() - 610_000_000,
                             kind=SpanKind.SERVER)
    span.set_attributes(attrs)
    span.end()
    if rate:
        time.sleep(1 / rate)  # requests ending at `rate` a second: batches of rate / 2 spans
    elif i % 50 == 49:
        time.sleep(0.05)  # bursts: batches of up to 512 spans
if provider is not None:
    provider.shutdown()  # flush: every span exported
print(time.process_time() - cpu0, time.monotonic() - wall0)
"""


def micro(n: int, repeats: int, rate: float) -> dict[str, Any]:
    """CPU seconds per span in the exporting process, traced vs a no-op tracer (see module doc)."""
    from kimictl.deployment.traces import tracing_env
    from kimictl.runtime.observe.otlp import OtlpReceiver
    from kimictl.runtime.serving import cpu_runtime

    py = str(cpu_runtime.python_path())
    rows: dict[str, list[float]] = {"traced": [], "none": []}
    with OtlpReceiver(port=0) as receiver:
        for _ in range(repeats):
            for mode in ("traced", "none"):
                out = subprocess.run(
                    [py, "-c", _MICRO_CHILD, str(n), receiver.url, mode, str(rate)],
                    capture_output=True, text=True, check=True, timeout=900,
                    # the batch delay `[metrics] traces` sets (deployment.traces)
                    env={**os.environ, **tracing_env(receiver.url, host="127.0.0.1", port=1)},
                )  # fmt: skip
                cpu_s, _wall = map(float, out.stdout.split())
                rows[mode].append(cpu_s / n * 1e6)
        received = receiver.store.received
    per_span = [t - z for t, z in zip(rows["traced"], rows["none"], strict=True)]
    mean = statistics.fmean(per_span)
    half = _t95(len(per_span) - 1) * statistics.stdev(per_span) / math.sqrt(len(per_span))
    return {
        "spans_per_run": n,
        "spans_per_s": rate or None,
        "runs": repeats,
        "spans_received": received,
        "cpu_us_per_span_traced": rows["traced"],
        "cpu_us_per_span_none": rows["none"],
        "added_cpu_us_per_span": mean,
        "ci95_us": [mean - half, mean + half],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--warmup-pairs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the raw blocks here")
    parser.add_argument("--micro", type=int, default=0, help="N spans per run: span cost only")
    parser.add_argument("--micro-runs", type=int, default=5)
    parser.add_argument("--micro-rate", type=float, default=0, help="spans/s (0: bursts)")
    args = parser.parse_args()
    if args.micro:
        result = micro(args.micro, args.micro_runs, args.micro_rate)
        result |= {
            "command": "python " + " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": f"{platform.machine()} {os.cpu_count()} cores",
        }
        lo, hi = result["ci95_us"]
        print(f"{result['added_cpu_us_per_span']:.0f} us of CPU per span [{lo:.0f}, {hi:.0f}] "
              f"(95 %), {result['spans_received']} spans received")  # fmt: skip
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2))
        return

    from conftest import free_port, start_cpu_server_retrying, stop_cpu_server

    from kimictl.deployment.traces import kimictl_endpoint, tracing_env
    from kimictl.runtime.observe.otlp import OtlpReceiver

    run_dir = Path(tempfile.mkdtemp(prefix="kimictl-otlp-cost-"))
    receiver = OtlpReceiver(port=free_port()).start()
    endpoint = kimictl_endpoint(receiver.port)
    servers: dict[str, Any] = {}
    try:
        port = free_port()
        servers["traced"] = start_cpu_server_retrying(
            run_dir / "traced",
            port=port,
            max_model_len=768,
            extra=["--otlp-traces-endpoint", endpoint],
            env=tracing_env(endpoint, host="127.0.0.1", port=port),
        )
        servers["none"] = start_cpu_server_retrying(run_dir / "none", max_model_len=768)
        for arm in ("traced", "none") * args.warmup_pairs:  # first blocks run slow: not counted
            _block(servers[arm].url, servers[arm].process.pid, args)
        blocks: list[dict[str, Any]] = []
        for i in range(args.pairs):
            order = ("traced", "none") if i % 2 == 0 else ("none", "traced")
            pair: dict[str, Any] = {"pair": i, "order": order}
            for arm in order:
                s = servers[arm]
                pair[arm] = _block(s.url, s.process.pid, args)
            blocks.append(pair)
            print(f"pair {i}: " + ", ".join(
                f"{arm} {pair[arm]['output_throughput']:.1f} tok/s "
                f"TPOT {pair[arm]['median_tpot_ms']:.1f} ms "
                f"API CPU {pair[arm]['api_cpu_ms_per_request']:.2f} ms/req"
                for arm in ("traced", "none")), flush=True)  # fmt: skip
        time.sleep(1.5)  # the last spans
        spans = receiver.store.received
    finally:
        for s in servers.values():
            stop_cpu_server(s)
        receiver.close()

    summary: dict[str, Any] = {}
    for fig in FIGURES:
        ratios = [b["traced"][fig] / b["none"][fig] for b in blocks if b["none"][fig]]
        gm, lo, hi = _interval(ratios)
        summary[fig] = {
            "ratio": gm,
            "ci95": [lo, hi],
            "traced_median": statistics.median(b["traced"][fig] for b in blocks),
            "none_median": statistics.median(b["none"][fig] for b in blocks),
        }
    requests = sum(b["traced"]["completed"] for b in blocks)
    result = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "spans_received": spans,
        "traced_requests": requests,
        "summary": summary,
        "blocks": blocks,
    }
    print(f"\n{args.pairs} pairs; spans received {spans} for {requests} traced requests")
    print(f"{'figure':28} {'traced/none':>11}  95 % interval      traced    none")
    for fig, s in summary.items():
        print(f"{fig:28} {s['ratio']:11.3f}  [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"
              f"  {s['traced_median']:8.2f} {s['none_median']:7.2f}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
