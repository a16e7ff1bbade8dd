"""`kimictl serve PROFILE --render slurm|k8s`: the same launch, written for a cluster scheduler.

Both use vLLM's own multi-node mechanism (the mp backend: `--nnodes`, `--node-rank`,
`--master-addr`, and `--headless` on ranks above 0), so a rendered job runs exactly the argv and
environment `kimictl serve --dry-run` prints, plus the three node flags.
- slurm: an sbatch script, one task per node; `srun` starts every rank, rank 0 serves the API.
- k8s: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): the leader is rank 0, workers take their
  rank from LWS_WORKER_INDEX; Kubernetes expands `$(VAR)` in container args.
Secrets never land in the file: VLLM_API_KEY comes from the job's environment (slurm) or a
Secret (k8s).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any

from kimictl.runtime.apikeys import ENV_VAR
from kimictl.runtime.checks.stack import VLLM_VERSION
from kimictl.runtime.errors import InputError
from kimictl.runtime.serving.plan import LaunchPlan, redact_argv

__all__ = ["FORMATS", "GPUS_PER_NODE", "VLLM_IMAGE", "render", "to_yaml"]

FORMATS = ("slurm", "k8s")
GPUS_PER_NODE = 4  # one GB300 NVL72 compute tray
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
# Local to the machine that renders: meaningless on the cluster.
_LOCAL_ENV = ("TMPDIR",)


def _env(plan: LaunchPlan) -> dict[str, str]:
    return {k: v for k, v in plan.env.items() if k not in _LOCAL_ENV and k != ENV_VAR}


def _nodes(plan: LaunchPlan, nnodes: int | None, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node): TP8 on 4-GPU trays spans 2 nodes, TP16 spans 4."""
    gpus = max(plan.gpus, 1)
    nodes = nnodes if nnodes and nnodes > 1 else max(1, math.ceil(gpus / gpus_per_node))
    if gpus % nodes:
        raise InputError(
            f"{plan.gpus} GPUs do not split evenly over {nodes} nodes; allowed --nnodes: "
            + ", ".join(str(n) for n in range(1, gpus + 1) if gpus % n == 0)
            + "."
        )
    return nodes, gpus // nodes


def render(
    plan: LaunchPlan,
    fmt: str,
    *,
    nnodes: int | None = None,
    gpus_per_node: int = GPUS_PER_NODE,
    api_key: bool = False,
    image: str = VLLM_IMAGE,
) -> str:
    """The job file for `plan` (a single-node plan: the node flags are added here)."""
    if fmt not in FORMATS:
        raise InputError(f"--render {fmt!r} is not a format; allowed: {', '.join(FORMATS)}.")
    nodes, per_node = _nodes(plan, nnodes, gpus_per_node)
    if fmt == "slurm":
        return _slurm(plan, nodes, per_node, api_key)
    return to_yaml(_lws(plan, nodes, per_node, api_key, image))


# ---------------------------------------------------------------- slurm


def _slurm(plan: LaunchPlan, nodes: int, per_node: int, api_key: bool) -> str:
    argv = redact_argv(plan.argv)
    lines = [
        "#!/usr/bin/env bash",
        f"# Rendered by kimictl from profile {plan.profile}: "
        f"vLLM on {nodes} node(s) x {per_node} GPU(s).",
        "# Rank 0 serves the OpenAI API; ranks above 0 run headless (vLLM's mp backend).",
        f"#SBATCH --job-name={plan.name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={per_node}",
        "#SBATCH --exclusive",
        "set -euo pipefail",
        "",
    ]
    for key, value in _env(plan).items():
        lines.append(f"export {key}={shlex.quote(value)}")
    if api_key:
        lines.append('export VLLM_API_KEY="${VLLM_API_KEY:?set VLLM_API_KEY before sbatch}"')
    lines += [
        "",
        "VLLM_ARGV=(",
        *(f"  {shlex.quote(word)}" for word in argv),
        ")",
        "",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "export MASTER_ADDR",
        f'echo "API: http://$MASTER_ADDR:{plan.port} (model {plan.model})"',
        "",
        "# One task per node; each picks its rank from SLURM_NODEID.",
        "srun --ntasks-per-node=1 bash -c '",
        '  rank="$SLURM_NODEID"',
        '  extra=(--node-rank "$rank")',
        '  if [ "$rank" -gt 0 ]; then extra+=(--headless); fi',
        f'  exec "$0" "$@" --nnodes {nodes} --master-addr "$MASTER_ADDR" "${{extra[@]}}"',
        '\' "${VLLM_ARGV[@]}"',
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- k8s LeaderWorkerSet


def _container(
    plan: LaunchPlan, nodes: int, per_node: int, api_key: bool, image: str, leader: bool
) -> dict[str, Any]:
    rank = "0" if leader else "$(LWS_WORKER_INDEX)"
    args = [*redact_argv(plan.argv)]
    if nodes > 1:
        args += ["--nnodes", str(nodes), "--master-addr", "$(LWS_LEADER_ADDRESS)"]
        args += ["--node-rank", rank]
        if not leader:
            args.append("--headless")
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in _env(plan).items()]
    if api_key:
        env.append(
            {
                "name": ENV_VAR,
                "valueFrom": {"secretKeyRef": {"name": f"{plan.name}-api-key", "key": "key"}},
            }
        )
    container: dict[str, Any] = {
        "name": "vllm-leader" if leader else "vllm-worker",
        "image": image,
        "command": args[:1],
        "args": args[1:],
        "env": env,
        "resources": {"limits": {"nvidia.com/gpu": per_node}},
    }
    if leader:
        container["ports"] = [{"containerPort": plan.port, "name": "http"}]
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": plan.port},
            "periodSeconds": 10,
            "failureThreshold": 360,
        }
    return container


def _lws(plan: LaunchPlan, nodes: int, per_node: int, api_key: bool, image: str) -> dict[str, Any]:
    def template(leader: bool) -> dict[str, Any]:
        return {
            "metadata": {"labels": {"app": plan.name, "role": "leader" if leader else "worker"}},
            "spec": {
                "containers": [_container(plan, nodes, per_node, api_key, image, leader)],
            },
        }

    worker_set: dict[str, Any] = {
        "size": nodes,
        "leaderTemplate": template(True),
        "workerTemplate": template(nodes == 1),
    }
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": plan.name,
            "annotations": {"kimictl/profile": str(plan.profile), "kimictl/model": plan.model},
        },
        "spec": {"replicas": 1, "leaderWorkerTemplate": worker_set},
    }


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists and scalars. Strings are JSON-quoted (valid YAML), so
    values such as "on", "1" or "$(VAR)" keep their type and text."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                out.append(f"{pad}{_key(key)}:\n{to_yaml(item, indent + 1)}")
            else:
                out.append(f"{pad}{_key(key)}: {_scalar(item)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            if isinstance(item, dict | list) and item:
                body = to_yaml(item, indent + 1)
                out.append(f"{pad}- {body.lstrip()}")
            else:
                out.append(f"{pad}- {_scalar(item)}\n")
        return "".join(out)
    return pad + _scalar(value) + "\n"


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
# Words YAML 1.1 parsers read as booleans or null when bare.
_RESERVED = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"}


def _key(key: Any) -> str:
    text = str(key)
    if _PLAIN_KEY.fullmatch(text) and text.lower() not in _RESERVED:
        return text
    return _quote(text)


def _quote(text: str) -> str:
    """A YAML double-quoted scalar: printable ASCII as is, everything else escaped by code point."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, dict | list):
        return json.dumps(value)
    return _quote(str(value))
