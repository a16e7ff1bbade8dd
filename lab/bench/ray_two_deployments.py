"""Two `kimictl serve --ray` deployments on one Ray cluster: `kimictl stop` of one leaves the
other serving (the Ray cluster is the operator's; stop ends this deployment's actors only).

Two hosts (tests/netns.py: network namespaces, each with its own PID namespace), one Ray 2.58.0
cluster (head on A, B joined, two CPUs each for Ray, a temp folder each). Deployment 1 is served
from host A and deployment 2 from host B, `cpu-demo-tp2 --ray --detach` each: vLLM puts its first
rank's bundle on the serving node, so each one's two ranks pack onto its own host. Then `kimictl
stop` of deployment 1 on A; deployment 2 must answer /health and completions throughout, and
keep both its rank actors. Too heavy for CI (two TP2 deployments on 2 cores): its figure is a
row of docs/results.md; CI checks the same boundary with another job's detached actor
(tests/test_multihost_ray.py).

    flock /tmp/kimictl-vllm.lock nice python lab/bench/ray_two_deployments.py [--json out.json]

Needs root (ip netns) and `kimictl setup cpu-runtime --ray`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from netns import MASTER, Host, two_hosts

from kimictl.runtime.serving import cpu_runtime
from kimictl.runtime.serving.ray_cluster import ADDRESS_ENV, RAY_PORT

ADDRESS = f"{MASTER}:{RAY_PORT}"
PORT = 8100
WATCH_S = 20.0  # deployment 2 is asked this long after deployment 1's stop


def _run(h: Host, *argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {"RAY_USAGE_STATS_ENABLED": "0", ADDRESS_ENV: ADDRESS}
    return subprocess.run(h.cmd(*argv, env=env), capture_output=True, text=True, timeout=timeout)


def _ray(h: Host, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(h, str(cpu_runtime.venv_dir() / "bin" / "ray"), *args, timeout=180)


def _kimictl(h: Host, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(h, sys.executable, "-m", "kimictl", *args)


def _ask(h: Host, path: str) -> int:
    """HTTP status of GET /health or a one-token completion on h's own server (0: no answer)."""
    body = '{"model": "tiny-k2", "prompt": "Hi", "max_tokens": 1}' if path != "/health" else ""
    code = (
        "import sys, urllib.request\n"
        f"req = urllib.request.Request('http://127.0.0.1:{PORT}{path}', "
        f"data={body.encode()!r} or None, headers={{'Content-Type': 'application/json'}})\n"
        "try: print(urllib.request.urlopen(req, timeout=30).status)\n"
        "except Exception as exc: print(getattr(exc, 'code', 0))"
    )
    out = _run(h, sys.executable, "-c", code, timeout=60).stdout.strip()
    return int(out) if out.isdigit() else 0


def _ranks(h: Host) -> int:
    found = 0
    for pid in h.pids():
        try:
            found += b"RayWorkerProc" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    return found


def _vllm(h: Host) -> int:
    found = 0
    for pid in h.pids():
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        found += b"/vllm " in args and b" serve " in args
    return found


def study() -> dict[str, object]:
    out: dict[str, object] = {}
    with two_hosts(Path(tempfile.mkdtemp(prefix="ray2d-")), own_pids=True) as (a, b):
        common = ["--num-cpus=2", "--disable-usage-stats"]
        head = _ray(a, "start", "--head", f"--node-ip-address={a.addr}",
                    f"--port={RAY_PORT}", "--include-dashboard=false",
                    f"--temp-dir=/tmp/{a.ns}-ray", *common)  # fmt: skip
        assert head.returncode == 0, head.stderr[-2000:]
        join = _ray(b, "start", f"--address={ADDRESS}", f"--node-ip-address={b.addr}",
                    f"--temp-dir=/tmp/{b.ns}-ray", *common)  # fmt: skip
        assert join.returncode == 0, join.stderr[-2000:]
        try:
            ids = {}
            for name, h in (("deployment 1 (host A)", a), ("deployment 2 (host B)", b)):
                t0 = time.monotonic()
                served = _kimictl(h, "serve", "cpu-demo-tp2", "--ray", "--detach",
                                  "--port", str(PORT), "--timeout", "800")  # fmt: skip
                assert served.returncode == 0, served.stdout[-2000:] + served.stderr[-2000:]
                (record,) = json.loads(_kimictl(h, "ps", "--json").stdout)
                ids[h.ns] = record["id"]
                out[f"{name}: ready_s"] = round(time.monotonic() - t0, 1)
                print(f"{name} ready in {out[f'{name}: ready_s']} s", flush=True)
            out["rank actors before (A, B)"] = [_ranks(a), _ranks(b)]
            out["completions before (A, B)"] = [
                _ask(a, "/v1/completions"),
                _ask(b, "/v1/completions"),
            ]
            t0 = time.monotonic()
            stop = _kimictl(a, "stop", ids[a.ns])
            assert stop.returncode == 0, stop.stdout + stop.stderr
            while (_ranks(a) or _vllm(a)) and time.monotonic() - t0 < 60:
                time.sleep(0.5)
            out["stop of 1: nothing of it left_s"] = round(time.monotonic() - t0, 1)
            out["left of 1 (ranks, vllm)"] = [_ranks(a), _vllm(a)]
            answers = []
            t0 = time.monotonic()
            while time.monotonic() - t0 < WATCH_S:
                answers.append((_ask(b, "/health"), _ask(b, "/v1/completions")))
            out["deployment 2 after the stop (health, completion) all 200"] = all(
                x == (200, 200) for x in answers
            )
            out["deployment 2 answers asked"] = len(answers)
            out["deployment 2 rank actors after"] = _ranks(b)
            out["ray nodes alive after"] = _run(
                a, str(cpu_runtime.python_path()), "-c",
                "import ray; ray.init(logging_level='ERROR'); "
                "print(sum(n['Alive'] for n in ray.nodes()))",
            ).stdout.split()[-1:]  # fmt: skip
            _kimictl(b, "stop", ids[b.ns])
        finally:
            for h in (b, a):
                _ray(h, "stop")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = study()
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
