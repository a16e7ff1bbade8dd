"""Start-up time of kimictl, measured beside `import torch` in the same run.

Targets: `kimictl --help` median <= 0.3 s; `kimictl doctor --json` on a machine with no
GPU <= 1.0 s. Each command runs in a fresh process; the median of N runs is reported.

    python lab/bench/startup.py [--runs 15] [--torch-python /path/to/python-with-torch] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

TARGETS = {"kimictl --help": 0.3, "kimictl doctor --json": 1.0}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str], runs: int, ok_codes: tuple[int, ...]) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds user+sys) per run. CPU time is the work the command does; wall
    time also counts waiting for a core, which dominates on a shared, loaded machine."""
    walls, cpus = [], []
    subprocess.run(argv, capture_output=True, check=False)  # warm the page cache once
    for _ in range(runs):
        cpu0 = _cpu()
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=False)
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu0)
        if done.returncode not in ok_codes:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-400:]!r}")
    return walls, cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument(
        "--torch-python",
        default=sys.executable,
        help="interpreter that has torch installed (default: this one)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    exe = shutil.which("kimictl")
    kimictl = [exe] if exe else [sys.executable, "-m", "kimictl"]
    cases: list[tuple[str, list[str], tuple[int, ...]]] = [
        ("python -c pass", [sys.executable, "-c", "pass"], (0,)),
        ("kimictl --help", [*kimictl, "--help"], (0,)),
        # exit 1 = "not ready", the expected answer on a machine without a GPU
        ("kimictl doctor --json", [*kimictl, "doctor", "--json"], (0, 1)),
        ('python -c "import torch"', [args.torch_python, "-c", "import torch"], (0,)),
    ]
    rows = []
    for name, argv, ok in cases:
        runs = max(3, args.runs // 3) if "torch" in name else args.runs
        times, cpus = _time(argv, runs, ok)
        rows.append(
            {
                "command": name,
                "runs": runs,
                "median_s": round(statistics.median(times), 3),
                "min_s": round(min(times), 3),
                "max_s": round(max(times), 3),
                "median_cpu_s": round(statistics.median(cpus), 3),
                "target_s": TARGETS.get(name),
            }
        )
    torch_version = subprocess.run(
        [args.torch_python, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "torch": torch_version or "not installed",
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
    else:
        print(
            f"{meta['date']}  {meta['machine']}  torch {meta['torch']}  "
            f"load average {meta['load_average_1m']}"
        )
        print(
            f"{'command':<28}{'runs':>5}{'median s':>10}{'min s':>8}{'max s':>8}"
            f"{'CPU s':>8}  target (median wall)"
        )
        for r in rows:
            target = r["target_s"]
            verdict = (
                ""
                if target is None
                else (f"<= {target} {'ok' if r['median_s'] <= target else 'MISSED'}")
            )
            print(
                f"{r['command']:<28}{r['runs']:>5}{r['median_s']:>10.3f}"
                f"{r['min_s']:>8.3f}{r['max_s']:>8.3f}{r['median_cpu_s']:>8.3f}  {verdict}"
            )
    missed = [r for r in rows if r["target_s"] is not None and r["median_s"] > r["target_s"]]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
