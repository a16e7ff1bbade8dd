"""Client CPU per streamed token: kimictl's loadgen vs `vllm bench serve`'s client vs plain httpx.

The local SSE emitter (lab/bench/_sse_emitter.py, a separate process on loopback, so its CPU is
not counted) streams vLLM-shaped /v1/completions chunks, one token per chunk, paced so every chunk
arrives in its own TCP read (the expensive case, as with a real server). Each client runs in its
own fresh process and reports the CPU time (user + sys, `time.process_time`) of its request phase
only, imports excluded; we divide by the tokens it received. All clients run in the same
invocation, at the same concurrencies, against the same emitter, one after another.

    python lab/bench/client_overhead.py [--streams 64,256] [--tokens 200] [--rounds 2]

vllm bench's client (aiohttp, `async_request_openai_completions`) is imported from kimictl's CPU
vLLM runtime venv (`kimictl setup cpu-runtime`); without it that row is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _sse_emitter import running_emitter

KIMICTL_CLIENT = r"""
import asyncio, json, sys, time
from kimictl.runtime.load.loadgen import LoadPoint, LoadSettings, LoadTarget, run_load
from kimictl.runtime.load.workloads import RandomWorkload, parse_length
url, streams, tokens, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = RandomWorkload(parse_length(8), parse_length(tokens))
c0, t0 = time.process_time(), time.perf_counter()
recs = asyncio.run(run_load([LoadTarget("e", url, "m")], w,
                            LoadSettings(points=(LoadPoint(concurrency=streams),), num_prompts=n)))
cpu, wall = time.process_time() - c0, time.perf_counter() - t0
toks = sum(r.output_tokens for r in recs if r.ok)
chunks = sum(len(r.chunk_times) for r in recs if r.ok)
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "tokens": toks, "chunks": chunks,
                  "failed": sum(not r.ok for r in recs)}))
"""

VLLM_CLIENT = r"""
import asyncio, json, sys, time
import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import (
    RequestFuncInput, async_request_openai_completions)
url, streams, tokens, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
async def main():
    connector = aiohttp.TCPConnector(limit=streams, limit_per_host=streams, ttl_dns_cache=300,
                                     use_dns_cache=True, keepalive_timeout=60,
                                     enable_cleanup_closed=True, force_close=False)
    session = aiohttp.ClientSession(connector=connector, trust_env=True,
                                    timeout=aiohttp.ClientTimeout(total=6 * 60 * 60))
    todo = list(range(n))
    outs = []
    async def worker():
        while todo:
            todo.pop()
            inp = RequestFuncInput(prompt=[1] * 8, api_url=url + "/v1/completions", prompt_len=8,
                                   output_len=tokens, model="m", ignore_eos=True)
            outs.append(await async_request_openai_completions(inp, session))
    await asyncio.gather(*(worker() for _ in range(streams)))
    await session.close()
    return outs
c0, t0 = time.process_time(), time.perf_counter()
outs = asyncio.run(main())
cpu, wall = time.process_time() - c0, time.perf_counter() - t0
ok = [o for o in outs if o.success]
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "tokens": sum(o.output_tokens or 0 for o in ok),
                  "chunks": sum(len(o.itl) + 1 for o in ok), "failed": len(outs) - len(ok)}))
"""

HTTPX_CLIENT = r"""
import asyncio, json, sys, time
import httpx
url, streams, tokens, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
async def main():
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    toks = chunks = failed = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
        todo = list(range(n))
        async def worker():
            nonlocal toks, chunks, failed
            while todo:
                todo.pop()
                body = {"model": "m", "prompt": [1] * 8, "max_tokens": tokens, "stream": True,
                        "stream_options": {"include_usage": True}}
                try:
                    async with client.stream("POST", "/v1/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            d = json.loads(line[6:])
                            if d.get("choices"):
                                chunks += 1
                                time.perf_counter()
                            elif d.get("usage"):
                                toks += d["usage"]["completion_tokens"]
                except httpx.HTTPError:
                    failed += 1
        await asyncio.gather(*(worker() for _ in range(streams)))
    return toks, chunks, failed
c0, t0 = time.process_time(), time.perf_counter()
toks, chunks, failed = asyncio.run(main())
print(json.dumps({"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0,
                  "tokens": toks, "chunks": chunks, "failed": failed}))
"""


def _vllm_python() -> Path | None:
    from kimictl.runtime.serving import cpu_runtime

    return cpu_runtime.python_path() if cpu_runtime.is_installed() else None


def _run_client(
    python: str, src: str, url: str, streams: int, tokens: int, n: int, tmp: Path
) -> dict:
    script = tmp / f"client_{abs(hash(src))}.py"
    script.write_text(src)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    out = subprocess.run(
        [python, str(script), url, str(streams), str(tokens), str(n)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="64,256")
    ap.add_argument("--tokens", type=int, default=200, help="tokens per request")
    ap.add_argument("--requests-per-stream", type=int, default=3)
    ap.add_argument(
        "--rate", type=float, default=8000.0, help="total tokens/s the emitter paces to"
    )
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best is kept")
    args = ap.parse_args()
    vllm_py = _vllm_python()
    clients = [("kimictl loadgen", sys.executable, KIMICTL_CLIENT)]
    if vllm_py is not None:
        clients.append(("vllm bench serve client (aiohttp)", str(vllm_py), VLLM_CLIENT))
    else:
        print("vllm bench's client skipped: kimictl's CPU vLLM runtime is not installed")
    clients.append(("plain httpx aiter_lines", sys.executable, HTTPX_CLIENT))
    print(f"machine: {os.cpu_count()} cores, {sys.platform}, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for streams in [int(s) for s in args.streams.split(",")]:
            interval = streams / args.rate  # per-stream token interval for the asked total rate
            with running_emitter(tpot_ms=interval * 1000) as url:
                n = streams * args.requests_per_stream
                best: dict[str, dict] = {}
                for _ in range(args.rounds):
                    for name, py, src in clients:
                        r = _run_client(py, src, url, streams, args.tokens, n, tmp)
                        if "error" in r:
                            print(f"{name}: failed: {r['error']}")
                            continue
                        r["us_per_token"] = r["cpu_s"] / max(r["chunks"], 1) * 1e6
                        if name not in best or r["us_per_token"] < best[name]["us_per_token"]:
                            best[name] = r
                print(
                    f"\n{streams} concurrent streams, {args.tokens} tokens/request, {n} requests, "
                    f"emitter paced to {args.rate:.0f} tokens/s (one chunk per token)"
                )
                print(
                    f"{'client':36s} {'CPU us/token':>12s} {'tokens/s per core':>18s} "
                    f"{'wall s':>7s} {'chunks':>8s} {'failed':>6s}"
                )
                for name, r in best.items():
                    per_core = 1e6 / r["us_per_token"]
                    print(
                        f"{name:36s} {r['us_per_token']:12.1f} {per_core:18,.0f} "
                        f"{r['wall_s']:7.1f} {r['chunks']:8d} {r['failed']:6d}"
                    )


if __name__ == "__main__":
    main()
