"""Does `kimictl validate` cry wolf, and does it catch a subtly wrong twin?

On the CPU embedded runtime, one server at a time (the machine has 2 cores):
  1. start identically built tiny-model servers one after another (runs + 1 processes) and record
     every check's raw responses from each; each consecutive pair (i-1, i) is one identical run;
  2. start the perturbed twin (last decoder layer scaled by 1+1e-2) and record it `runs` times;
     perturbed run i compares it with identical server i;
  3. score every pair with the shipped thresholds and print/write the table.

    python lab/bench/validate_false_alarms.py --runs 5 [--quick] [--json out.json]
        [--capture tests/fixtures/evals]   # also writes the fixtures tests/test_evals.py scores

Results: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from kimictl.runtime.evals.client import Endpoint
from kimictl.runtime.evals.plan import CHECKS, Thresholds, plan_for
from kimictl.runtime.evals.runner import collect, prepare, score_check
from kimictl.runtime.serving import cpu_runtime, tinymodel

PERTURB = "scale:1e-2"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(perturb: str | None, run_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    model = tinymodel.build(0, perturb)
    port = _free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "vllm.log").open("wb") as log:
        proc = subprocess.Popen(
            cpu_runtime.server_argv(model, port=port),
            env=cpu_runtime.server_env(run_dir),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited: {(run_dir / 'vllm.log').read_text()[-1500:]}")
        try:
            reply = httpx.post(
                f"{url}/v1/completions",
                json={"model": "tiny-k2", "prompt": "hi", "max_tokens": 1},
                timeout=10,
            )
            if reply.status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(proc)
    raise SystemExit("vLLM not ready after 600 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def record(
    url: str, prepared: dict[str, Any] | None, quick: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    plan = plan_for(quick)
    raw: dict[str, Any] = {}
    with Endpoint(url, name=url) as ep:
        if prepared is None:
            prepared = {name: prepare(ep, name, plan, ep.max_model_len) for name in CHECKS}
        for name in CHECKS:
            raw[name] = collect(ep, name, prepared[name], plan)
    return prepared, raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--capture", type=Path, default=None)
    args = parser.parse_args()
    cpu_runtime.require_installed()
    plan = plan_for(args.quick)
    limits = Thresholds()
    work = Path(tempfile.mkdtemp(prefix="kimictl-validate-bench-"))
    prepared: dict[str, Any] | None = None
    identical: list[dict[str, Any]] = []
    timings: dict[str, list[float]] = {"start_s": [], "record_s": []}
    for i in range(args.runs + 1):
        t0 = time.monotonic()
        proc, url = start(None, work / f"identical-{i}")
        t1 = time.monotonic()
        try:
            prepared, raw = record(url, prepared, args.quick)
        finally:
            stop(proc)
        timings["start_s"].append(t1 - t0)
        timings["record_s"].append(time.monotonic() - t1)
        identical.append(raw)
        print(
            f"identical server {i}: up in {t1 - t0:.0f} s, "
            f"recorded in {time.monotonic() - t1:.0f} s",
            flush=True,
        )
    perturbed: list[dict[str, Any]] = []
    proc, url = start(PERTURB, work / "perturbed")
    try:
        for i in range(args.runs):
            t1 = time.monotonic()
            perturbed.append(record(url, prepared, args.quick)[1])
            print(f"perturbed run {i}: recorded in {time.monotonic() - t1:.0f} s", flush=True)
    finally:
        stop(proc)
    rows = []
    for kind, pairs in (
        ("identical", [(identical[i], identical[i - 1]) for i in range(1, args.runs + 1)]),
        ("perturbed", [(perturbed[i], identical[i + 1]) for i in range(args.runs)]),
    ):
        for run, (cand, ref) in enumerate(pairs, 1):
            results = {
                name: score_check(name, cand[name], ref[name], limits, plan) for name in CHECKS
            }
            rows.append(
                {
                    "pair": kind,
                    "run": run,
                    "verdicts": {n: r.status.value for n, r in results.items()},
                    "summaries": {n: r.summary for n, r in results.items()},
                    "failures": {n: r.failures for n, r in results.items() if r.failures},
                }
            )
    for row in rows:
        cells = "  ".join(f"{n}={v.upper()}" for n, v in row["verdicts"].items())
        print(f"{row['pair']:9s} run {row['run']}: {cells}")
    false_alarms = sum(
        v != "pass" for r in rows if r["pair"] == "identical" for v in r["verdicts"].values()
    )
    missed = sum(
        r["verdicts"][n] == "pass"
        for r in rows
        if r["pair"] == "perturbed"
        for n in ("greedy", "long_context")
    )
    print(
        f"false alarms (identical pairs, any check): {false_alarms}; "
        f"perturbed runs where greedy or long_context passed: {missed}"
    )
    doc = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "mode": "quick" if args.quick else "full",
        "perturbation": PERTURB,
        "thresholds": limits.to_json(),
        "timings": timings,
        "rows": rows,
        "false_alarms": false_alarms,
        "perturbed_greedy_or_long_context_passes": missed,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    if args.capture:
        args.capture.mkdir(parents=True, exist_ok=True)
        meta = {"mode": doc["mode"], "date": doc["date"], "perturbation": PERTURB}
        for name, raw in (
            ("identical_a", identical[0]),
            ("identical_b", identical[1]),
            ("perturbed", perturbed[0]),
        ):
            (args.capture / f"{name}.json").write_text(json.dumps({**meta, "responses": raw}))
    return 0 if false_alarms == 0 and missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
