"""Same load, same server, measured by `kimictl bench` and by `vllm bench serve`: do they agree?

Runs, alternating, `vllm bench serve` (random dataset, fixed lengths, --ignore-eos, from kimictl's
CPU vLLM runtime venv) and `kimictl bench` (random workload, same lengths, same concurrency and
request count) against one server, `--rounds` times each, and prints output throughput and mean
TPOT of each tool (median over rounds) and their ratio. The target is agreement within 5%.

    python benchmarks/bench_vs_vllm.py --url http://127.0.0.1:18000 [--model tiny-k2]
        [--tokenizer ~/.cache/kimictl/models/tiny-k2-seed0] [--concurrency 4] [--num-prompts 24]

On a shared 2-core box the server's speed drifts far more than 5% between runs, so the script also
has `--emitter`: both tools measure a local paced SSE server with a known answer (first token after
TTFT_MS, then one token every TPOT_MS): TPOT and throughput must agree with each other and with
the emitter's pacing. This isolates what the tools compute from what the server does.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

EMITTER = r"""
import asyncio, json, sys, time
TTFT, TPOT = float(sys.argv[2]) / 1000, float(sys.argv[3]) / 1000
def ev(d):
    d = b"data: " + d + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(d), d)
def reply(writer, status, body):
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n" % status
    writer.write(head + b"content-length: %d\r\n\r\n%s" % (len(body), body))
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":")[1])
            body = json.loads(await reader.readexactly(n)) if n else {}
            if head.startswith(b"GET /v1/models"):
                reply(writer, b"200 OK", b'{"object":"list","data":[{"id":"m","object":"model"}]}')
                continue
            if head.startswith(b"GET"):
                reply(writer, b"404 Not Found", b"{}")
                continue
            out = int(body.get("max_tokens") or 16)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            t = time.perf_counter() + TTFT
            for i in range(out):
                await asyncio.sleep(max(0.0, t - time.perf_counter()))
                writer.write(ev(b'{"object":"text_completion","model":"m","choices":[{"index":0,'
                                b'"text":" tok","finish_reason":null}],"usage":null}'))
                t += TPOT
            writer.write(ev(b'{"object":"text_completion","model":"m","choices":[],'
                            b'"usage":{"prompt_tokens":8,"completion_tokens":%d}}' % out)
                         + ev(b"[DONE]") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


def _vllm_bench(args: argparse.Namespace, out: Path) -> dict:
    from kimictl.runtime import cpu_runtime

    vllm = cpu_runtime.venv_dir() / "bin" / "vllm"
    cmd = [
        str(vllm), "bench", "serve", "--backend", "openai", "--base-url", args.url,
        "--model", args.model, "--tokenizer", args.tokenizer, "--dataset-name", "random",
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
        "--ignore-eos", "--disable-tqdm", "--save-result", "--result-dir", str(out.parent),
        "--result-filename", out.name, "--percentile-metrics", "ttft,tpot,itl,e2el",
    ]  # fmt: skip
    env = cpu_runtime.server_env(out.parent)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed: {proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def _kimictl_bench(args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "kimictl", "bench", "--target", args.url, "--model", args.model,
        "--input-len", str(args.input_len), "--output-len", str(args.output_len),
        "--num-prompts", str(args.num_prompts), "--concurrency", str(args.concurrency),
        "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"kimictl bench failed: {proc.stderr[-2000:]}")
    return json.loads(out.read_text())["runs"][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:18000")
    ap.add_argument("--model", default="tiny-k2")
    ap.add_argument("--tokenizer", default=str(Path.home() / ".cache/kimictl/models/tiny-k2-seed0"))
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--emitter",
        metavar="TTFT_MS,TPOT_MS",
        default=None,
        help="measure a local paced SSE server instead of --url, e.g. 100,20",
    )
    args = ap.parse_args()
    emitter = None
    if args.emitter:
        ttft_ms, tpot_ms = (float(x) for x in args.emitter.split(","))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        src = Path(tempfile.mkdtemp()) / "emitter.py"
        src.write_text(EMITTER)
        emitter = subprocess.Popen(
            [sys.executable, str(src), str(port), str(ttft_ms), str(tpot_ms)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert emitter.stdout is not None and emitter.stdout.readline().strip() == "ready"
        args.url, args.model = f"http://127.0.0.1:{port}", "m"
        print(
            f"emitter: TTFT {ttft_ms:g} ms, then one token every {tpot_ms:g} ms; "
            f"expected TPOT {tpot_ms:g} ms"
        )
    try:
        _compare(args)
    finally:
        if emitter is not None:
            emitter.kill()
            emitter.wait()


def _compare(args: argparse.Namespace) -> None:
    rows: dict[str, list[tuple[float, float]]] = {"vllm bench serve": [], "kimictl bench": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.rounds):
            v = _vllm_bench(args, Path(d) / f"vllm{i}.json")
            k = _kimictl_bench(args, Path(d) / f"kimictl{i}.json")
            rows["vllm bench serve"].append((v["output_throughput"], v["mean_tpot_ms"]))
            rows["kimictl bench"].append((k["output_throughput"], k["mean_tpot_ms"]))
            print(
                f"round {i + 1}: vllm {v['output_throughput']:.1f} tok/s, TPOT "
                f"{v['mean_tpot_ms']:.2f} ms | kimictl {k['output_throughput']:.1f} tok/s, TPOT "
                f"{k['mean_tpot_ms']:.2f} ms",
                flush=True,
            )
    med = {
        n: (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r))
        for n, r in rows.items()
    }
    print(
        f"\n{args.num_prompts} requests x {args.input_len} in / {args.output_len} out, "
        f"concurrency {args.concurrency}, {args.rounds} alternating rounds, medians:"
    )
    print(f"{'tool':20s} {'output tok/s':>12s} {'mean TPOT ms':>13s}")
    for n, (thr, tpot) in med.items():
        print(f"{n:20s} {thr:12.1f} {tpot:13.2f}")
    k, v = med["kimictl bench"], med["vllm bench serve"]
    print(f"{'kimictl / vllm':20s} {k[0] / v[0]:12.3f} {k[1] / v[1]:13.3f}")


if __name__ == "__main__":
    main()
