"""All-reduce latency and bus bandwidth on the GPUs of one host, for K3 decode message sizes.

Sizes: M x 7168 x 2 bytes (one BF16 hidden row per token) for M = 1..64, the DCP partial-output
messages kimictl's tuning model uses (step tokens x 96/TP heads x (512 + 1) x 4 bytes, TP 8/16,
step tokens 1/8/64, rounded up to 256 bytes), and a few large messages for the bus-bandwidth
plateau.

Methods, each one process per GPU (torch.multiprocessing, NCCL process group):
- nccl: torch.distributed.all_reduce (NCCL; NVLS off: NCCL_NVLS_ENABLE=0 is forced here);
- symm_one_shot / symm_two_shot: torch symmetric memory's one_shot_all_reduce and
  two_shot_all_reduce_ (peer loads/stores over NVLink, no multicast). Multicast stays off:
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is forced here, so rendezvous creates no multicast object.

Each measurement captures `--ops` back-to-back all-reduces in one CUDA graph (eager when capture
fails, recorded per row), replays it `--repeats` times timed by CUDA events, and takes the median
per-op time; the slowest rank's median is reported (the collective ends when the last rank does).
bus bandwidth = bytes / time x 2 (n - 1) / n (nccl-tests' definition).

    python lab/bench/allreduce.py --out lab/results/allreduce_h200x2.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Multicast must stay off on shared hosts (and is not what is measured): set before torch loads.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
HIDDEN = 7168
BF16 = 2
DECODE_M = list(range(1, 65))
DCP_STEP_TOKENS = (1, 8, 64)
DCP_TP = (8, 16)
LARGE = (1 << 20, 16 << 20, 64 << 20)
METHODS = ("nccl", "symm_one_shot", "symm_two_shot")


def message_sizes() -> list[dict[str, Any]]:
    """(bytes, label) of every message measured; bytes are multiples of 16 (BF16 x 8)."""
    sizes = [{"bytes": m * HIDDEN * BF16, "kind": "decode", "label": f"M={m}"} for m in DECODE_M]
    for tp in DCP_TP:
        for tokens in DCP_STEP_TOKENS:
            nbytes = tokens * (96 // tp) * (512 + 1) * 4
            nbytes = -(-nbytes // 256) * 256  # two-shot splits into 16-byte-aligned shares
            sizes.append({"bytes": nbytes, "kind": "dcp", "label": f"DCP TP{tp} {tokens} tok"})
    sizes += [{"bytes": b, "kind": "large", "label": f"{b >> 20} MiB"} for b in LARGE]
    return sizes


def _time_graph(fn: Any, ops: int, repeats: int, warmup: int) -> tuple[float, bool]:
    """Median microseconds per op of `ops` calls of fn: CUDA graph replay, else eager."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured = True
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            for _ in range(ops):
                fn()
        graph.replay()
        torch.cuda.synchronize()
    except Exception:  # a method that cannot be captured is timed eagerly (and says so)
        captured = False
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.distributed.barrier()
        torch.cuda.synchronize()
        start.record()
        if captured:
            graph.replay()
        else:
            for _ in range(ops):
                fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / ops)
    return statistics.median(times), captured


def _worker(rank: int, world: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(SAFE_ENV)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        device_id=torch.device("cuda", rank),
    )
    group = dist.group.WORLD
    device = torch.device("cuda", rank)
    sizes = message_sizes()
    biggest = max(s["bytes"] for s in sizes)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []

    symm: Any = None
    symm_buf: Any = None
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group.group_name)
        symm_buf = symm_mem.empty(biggest // BF16, dtype=torch.bfloat16, device=device)
        handle = symm_mem.rendezvous(symm_buf, group)
        try:
            backend = symm_mem.get_backend(device)
        except Exception as error:  # older torch: no get_backend
            backend = f"? ({type(error).__name__})"
        notes.append(
            f"symm_mem rendezvous ok: backend {backend}, multicast_ptr {handle.multicast_ptr} "
            "(0 = none, as forced by TORCH_SYMM_MEM_DISABLE_MULTICAST=1)"
        )
        symm = torch.ops.symm_mem
    except Exception as error:  # recorded: the JSON then holds NCCL only
        notes.append(f"torch symmetric memory unavailable: {type(error).__name__}: {error}")

    nccl_buf = torch.empty(biggest // BF16, dtype=torch.bfloat16, device=device)
    dist.all_reduce(nccl_buf[:8])  # NCCL communicator up before any capture
    torch.cuda.synchronize()

    # correctness once per method: rank r holds r + 1; the sum is world (world + 1) / 2
    expect = world * (world + 1) / 2
    checks: dict[str, Any] = {}
    for method in METHODS:
        if method != "nccl" and symm is None:
            continue
        n = HIDDEN * 4
        if method == "nccl":
            t = nccl_buf[:n]
            t.fill_(rank + 1)
            dist.all_reduce(t)
            got = t
        else:
            t = symm_buf[:n]
            t.fill_(rank + 1)
            dist.barrier()
            if method == "symm_one_shot":
                got = symm.one_shot_all_reduce(t, "sum", group.group_name)
            else:
                symm.two_shot_all_reduce_(t, "sum", group.group_name)
                got = t
        torch.cuda.synchronize()
        checks[method] = bool(torch.all(got == expect).item())

    for size in sizes:
        n = size["bytes"] // BF16
        for method in METHODS:
            if method != "nccl" and symm is None:
                continue
            ops = args.ops if size["bytes"] < (8 << 20) else max(2, args.ops // 10)
            if method == "nccl":
                t = nccl_buf[:n]

                def fn(t: Any = t) -> None:
                    dist.all_reduce(t)
            elif method == "symm_one_shot":
                t = symm_buf[:n]

                def fn(t: Any = t) -> None:
                    symm.one_shot_all_reduce(t, "sum", group.group_name)
            else:
                t = symm_buf[:n]

                def fn(t: Any = t) -> None:
                    symm.two_shot_all_reduce_(t, "sum", group.group_name)

            try:
                us, captured = _time_graph(fn, ops, args.repeats, args.warmup)
                rows.append({**size, "method": method, "us": us, "graph": captured})
            except Exception as error:
                rows.append({**size, "method": method, "us": None, "error": f"{error}"[:200]})
                torch.cuda.synchronize()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"rows": rows, "notes": notes, "checks": checks})
    if rank == 0:
        _write(args, world, gathered)
    dist.barrier()
    dist.destroy_process_group()


def _write(args: argparse.Namespace, world: int, per_rank: list[Any]) -> None:
    import torch

    merged = []
    for i, row in enumerate(per_rank[0]["rows"]):
        others = [r["rows"][i] for r in per_rank]
        times = [o["us"] for o in others]
        entry = {k: v for k, v in row.items() if k != "us"}
        if all(t is not None for t in times):
            us = max(times)
            algbw = row["bytes"] / (us * 1e-6) / 1e9
            entry.update(
                us=round(us, 2),
                us_per_rank=[round(t, 2) for t in times],
                algbw_gb_s=round(algbw, 2),
                busbw_gb_s=round(algbw * 2 * (world - 1) / world, 2),
                graph=all(o.get("graph") for o in others),
            )
        merged.append(entry)
    doc = {
        "what": "all-reduce latency and bus bandwidth, one process per GPU",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "host": platform.node(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(world)],
            "world": world,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        },
        "env": {k: os.environ.get(k) for k in SAFE_ENV},
        "method": (
            f"{args.ops} all-reduces per CUDA graph (ops/10 from 8 MiB), {args.repeats} timed "
            f"replays after {args.warmup} warm-up calls; median per op; slowest rank"
        ),
        "correct": per_rank[0]["checks"],
        "notes": per_rank[0]["notes"],
        "rows": merged,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    for row in merged:
        if row.get("us") is not None and (row["kind"] != "decode" or row["label"] in _SHOWN):
            print(
                f"{row['label']:>18} {row['bytes']:>10} B {row['method']:>14} "
                f"{row['us']:9.2f} us {row['busbw_gb_s']:8.2f} GB/s graph={row['graph']}"
            )


_SHOWN = {f"M={m}" for m in (1, 2, 4, 8, 16, 32, 64)}


def plot(runs: list[Path], png: Path) -> None:
    """Latency vs message size per method: the median run's line, the range over runs shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [json.loads(r.read_text(encoding="utf-8")) for r in runs]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"nccl": "tab:blue", "symm_one_shot": "tab:orange", "symm_two_shot": "tab:green"}
    for method, color in colors.items():
        rows = [
            sorted(
                (r for r in d["rows"] if r["method"] == method and r.get("us")),
                key=lambda r: r["bytes"],
            )
            for d in docs
        ]
        xs = [r["bytes"] for r in rows[0]]
        per = [[run[i]["us"] for run in rows] for i in range(len(xs))]
        mid = [statistics.median(p) for p in per]
        for axis, keep in ((ax, lambda x: x <= 2 << 20), (bx, lambda x: True)):
            idx = [i for i, x in enumerate(xs) if keep(x)]
            axis.plot([xs[i] for i in idx], [mid[i] for i in idx], color=color, label=method)
            axis.fill_between(
                [xs[i] for i in idx],
                [min(per[i]) for i in idx],
                [max(per[i]) for i in idx],
                color=color,
                alpha=0.2,
            )
    ax.set(xlabel="message bytes (decode: M x 7168 x 2)", ylabel="us per all-reduce")
    ax.set_title("decode sizes (<= 2 MiB)")
    bx.set(xscale="log", yscale="log", xlabel="message bytes", ylabel="us per all-reduce")
    bx.set_title("all sizes")
    machine = docs[0]["machine"]
    fig.suptitle(
        f"all-reduce on {machine['world']} x {machine['gpus'][0]}, multicast off, CUDA graphs; "
        f"median of {len(docs)} runs, range shaded"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="lab/results/allreduce.json")
    parser.add_argument("--world", type=int, default=0, help="GPUs (default: all visible)")
    parser.add_argument("--ops", type=int, default=50, help="all-reduces per CUDA graph")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--plot", type=Path, help="Only plot these result JSONs to --png.")
    parser.add_argument("--runs", type=Path, nargs="+", default=[])
    args = parser.parse_args(argv)
    if args.plot is not None:
        plot(args.runs, args.plot)
        print(f"wrote {args.plot}")
        return 0
    os.environ.update(SAFE_ENV)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("error: torch is not installed; run this on a GPU machine.", file=sys.stderr)
        return 2
    world = args.world or torch.cuda.device_count()
    if world < 2:
        print(f"error: {world} GPU(s) visible; an all-reduce needs 2 or more.", file=sys.stderr)
        return 2
    port = 29500 + int(time.time()) % 1000
    mp.spawn(_worker, args=(world, args, port), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
