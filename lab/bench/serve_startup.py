"""Start-up time of `kimictl serve` on the embedded CPU demo: time to each phase and to ready.

Ready = /health 200 AND a one-token completion succeeded (kimictl's readiness). Each repeat starts
the cpu-demo profile on a free port, waits until ready, then stops it and measures the stop too.

    python lab/bench/serve_startup.py --repeats 3 [--profile cpu-demo] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_run(profile: str) -> dict[str, object]:
    from kimictl.runtime.serving import launcher, workflow

    prepared = workflow.prepare_serve(workflow.ServeRequest(profile=profile, port=_free_port()))
    workflow.refuse_if_blocked(prepared)
    (plan,) = prepared.plans
    phases: dict[str, float] = {}
    launch = launcher.start(plan)
    try:
        launcher.wait_ready(
            [launch], timeout=900, on_phase=lambda _l, p, t: phases.setdefault(p, round(t, 1))
        )
    finally:
        begin = time.monotonic()
        launcher.stop_launches([launch], grace=20)
        stop_s = time.monotonic() - begin
    return {"phases": phases, "ready_s": phases.get("ready"), "stop_s": round(stop_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", default="cpu-demo")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs = [one_run(args.profile) for _ in range(args.repeats)]
    ready = [float(r["ready_s"]) for r in runs if r["ready_s"] is not None]  # type: ignore[arg-type]
    result = {
        "profile": args.profile,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "loadavg_before": [round(x, 1) for x in load_before],
        "loadavg_after": [round(x, 1) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "ready_s": ready,
        "ready_median_s": statistics.median(ready) if ready else None,
        "runs": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
