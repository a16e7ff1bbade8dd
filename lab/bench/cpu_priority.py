"""Why clients on the embedded default saw whole responses at once, and what the server's niceness
(cpu_runtime.SERVER_NICE) changes. One CPU server, ABBA pairs of the same fixed load (the A/B
blocks of observer_effect.py: 2 streams x 4 requests x 256 tokens) with every thread of the
server and its autogroup at niceness SERVER_NICE ("niced") or 0 ("plain"), reniced between
blocks. Per block: the client's TTFT, TPOT and throughput, whether it stalled, the server's own
mean TTFT for the same requests (from its /metrics sum and count), which tells a starved client
from a starved server, and the time the client's threads waited runnable for a CPU (schedstat).

    flock /tmp/kimictl-vllm.lock python lab/bench/cpu_priority.py [--pairs 40] [--json FILE]

Going back to niceness 0 needs root (or CAP_SYS_NICE). Figures: docs/results.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from conftest import start_cpu_server_retrying, stop_cpu_server
from observer_effect import _block, ab_summary, server_means, server_sums, stalled, tree_threads

from kimictl.deployment import buckets
from kimictl.deployment.profiles import load_profile
from kimictl.runtime.serving.cpu_runtime import SERVER_NICE


def _renice(pid: int, nice: int) -> None:
    """Every thread's nice, and the nice of the server's autogroup (its own session), which is
    what weighs it against the client's session when the kernel's autogroup is on."""
    for tid in (t for tids in tree_threads(pid).values() for t in tids):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue
    with contextlib.suppress(FileNotFoundError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def _runq_wait_ms() -> float:
    """Time this process's threads spent runnable but not running (schedstat), in ms."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=4, help="requests per block")
    ap.add_argument("--json", type=Path, help="write the whole result here")
    args = ap.parse_args()

    chb = load_profile("cpu-demo").spec.custom_histogram_buckets
    run_dir = Path(tempfile.mkdtemp(prefix="kimictl-nice-"))
    server = start_cpu_server_retrying(
        run_dir, max_model_len=768, extra=buckets.flag_for(chb or {})
    )
    pid = server.process.pid
    blocks: dict[str, list[dict[str, Any]]] = {"niced": [], "plain": []}
    try:
        try:
            _renice(pid, 0)
        except PermissionError:
            sys.exit("cpu_priority: raising the server back to niceness 0 needs root.")
        _block(server.url, server.model, args.prompts)  # warm-up
        for i in range(args.pairs):
            for arm in ("plain", "niced") if i % 2 == 0 else ("niced", "plain"):
                _renice(pid, SERVER_NICE if arm == "niced" else 0)
                before = server_sums(server.url)
                q0 = _runq_wait_ms()
                blk = _block(server.url, server.model, args.prompts)
                blk["client_runq_wait_ms"] = _runq_wait_ms() - q0
                blk |= server_means(before, server_sums(server.url))
                blocks[arm].append(
                    {k: v for k, v in blk.items() if k not in ("token_times", "ttft_windows")}
                )
    finally:
        stop_cpu_server(server)

    def arm_figures(bs: list[dict[str, Any]]) -> dict[str, Any]:
        fine = [b for b in bs if not stalled(b)]
        return {
            "blocks": len(bs),
            "stalled": len(bs) - len(fine),
            "client_ttft_p50_ms_median": statistics.median(b["ttft_p50_ms"] for b in bs),
            "client_ttft_p50_ms_max": max(b["ttft_p50_ms"] for b in bs),
            "server_ttft_mean_ms_median": statistics.median(b["server_ttft_mean_ms"] for b in bs),
            "server_ttft_mean_ms_max": max(b["server_ttft_mean_ms"] for b in bs),
            "client_runq_wait_ms_median": statistics.median(b["client_runq_wait_ms"] for b in bs),
            "client_runq_wait_ms_max": max(b["client_runq_wait_ms"] for b in bs),
            "output_tok_s_median": statistics.median(b["output_tok_s"] for b in bs),
            "tpot_p50_ms_median": statistics.median(b["tpot_p50_ms"] for b in fine or bs),
        }

    result = {
        "server_nice": SERVER_NICE,
        "pairs": args.pairs,
        "prompts_per_block": args.prompts,
        "arms": {arm: arm_figures(bs) for arm, bs in blocks.items()},
        # ab_summary's "on" is the niced arm: ratios niced / plain
        "niced_over_plain": ab_summary(list(zip(blocks["niced"], blocks["plain"], strict=True))),
        "blocks": blocks,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "load_average_end": os.getloadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for arm, fig in result["arms"].items():
        print(
            f"{arm:6} stalled {fig['stalled']}/{fig['blocks']}  client TTFT p50 median "
            f"{fig['client_ttft_p50_ms_median']:.1f} ms (max {fig['client_ttft_p50_ms_max']:.0f})"
            f"  server TTFT mean median {fig['server_ttft_mean_ms_median']:.1f} ms (max "
            f"{fig['server_ttft_mean_ms_max']:.0f})  client run-queue wait median "
            f"{fig['client_runq_wait_ms_median']:.0f} ms (max {fig['client_runq_wait_ms_max']:.0f})"
            f"  tok/s {fig['output_tok_s_median']:.1f}"
            f"  TPOT {fig['tpot_p50_ms_median']:.2f} ms"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
