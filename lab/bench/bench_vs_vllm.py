"""Same load, same server, measured by `kimictl bench` and by `vllm bench serve`: do they agree?

Runs, alternating, `vllm bench serve` (random dataset, fixed lengths, --ignore-eos, from kimictl's
CPU vLLM runtime venv) and `kimictl bench` (random workload, same lengths, same concurrency and
request count) against one server, `--rounds` times each, and prints output throughput and mean
TPOT of each tool (median over rounds) and their ratio. The target is agreement within 5%.

    python lab/bench/bench_vs_vllm.py --url http://127.0.0.1:18000 [--model tiny-k2]
        [--tokenizer ~/.cache/kimictl/models/tiny-k2-seed0] [--concurrency 4] [--num-prompts 24]

On a shared 2-core box the server's speed drifts far more than 5% between runs, so the script also
has `--emitter`: both tools measure the local paced SSE server of lab/bench/_sse_emitter.py, with
a known answer (first token after TTFT_MS, then one token every TPOT_MS): TPOT and throughput must
agree with each other and with the emitter's pacing. This isolates what the tools compute from
what the server does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _sse_emitter import running_emitter


def _vllm_bench(args: argparse.Namespace, out: Path) -> dict:
    from kimictl.runtime.serving import cpu_runtime

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
        "-o", str(out),
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
    if not args.emitter:
        _compare(args)
        return
    ttft_ms, tpot_ms = (float(x) for x in args.emitter.split(","))
    with running_emitter(ttft_ms=ttft_ms, tpot_ms=tpot_ms) as url:
        args.url, args.model = url, "m"
        print(
            f"emitter: TTFT {ttft_ms:g} ms, then one token every {tpot_ms:g} ms; "
            f"expected TPOT {tpot_ms:g} ms"
        )
        _compare(args)


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
