"""`kimictl serve PROFILE --render slurm|k8s`: the same launch, written for a cluster scheduler.

Both run the argv and environment `kimictl serve --dry-run` prints, with three changes a cluster
needs: rank 0 binds 0.0.0.0 (the scheduler's address for it is not loopback), the node flags of
vLLM's mp backend (`--nnodes`, `--node-rank`, `--master-addr`, `--headless` above rank 0) come
from the scheduler, and the weights come from a volume the profile's `[cluster]` table names.
With `--ray` the ranks join a Ray cluster instead and only rank 0 runs `vllm serve` (vLLM
refuses `--nnodes` under Ray).
- slurm: an sbatch script, one task per node.
- k8s: Secret (when rendered) + ComputeDomain (IMEX channel, more than one node) +
  LeaderWorkerSet + leader Service, built in render_k8s.py.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kimictl.core.apikeys import ENV_VAR
from kimictl.core.errors import InputError
from kimictl.deployment.cluster import (
    ClusterSettings,
    JobFormat,
    check_abs_path,
    check_object_name,
    is_local_model,
    weights_problem,
)
from kimictl.runtime.checks.stack import VLLM_VERSION
from kimictl.runtime.serving.plan import LaunchPlan, is_loopback, redact_argv
from kimictl.runtime.serving.ray_cluster import ADDRESS_ENV, RAY_PORT, wait_for_nodes_code

if TYPE_CHECKING:
    from kimictl.deployment.profiles import Profile
    from kimictl.runtime.checks.rules.base import Check

__all__ = [
    "BIND_ALL",
    "FORMATS",
    "GPUS_PER_NODE",
    "IMEX_CHANNEL",
    "VLLM_IMAGE",
    "Job",
    "NodeKind",
    "job_for",
    "render",
    "render_ab",
    "render_checks",
    "to_yaml",
]

FORMATS = tuple(f.value for f in JobFormat)
GPUS_PER_NODE = 4  # one GB300 NVL72 compute tray
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
BIND_ALL = "0.0.0.0"
# The device node NVIDIA's IMEX daemon gives a process for cross-node NVLink memory (the fast
# path's multicast buffers span trays); the DRA driver's ComputeDomain injects it into pods.
IMEX_CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"
# Local to the machine that renders: meaningless on the cluster.
_LOCAL_ENV = ("TMPDIR", ADDRESS_ENV)
# Paths under the rendering host's run folder (the CPU runtime's compile caches): a Slurm job
# puts them on each node's own disk instead, under the job's id (folder name per variable).
_NODE_LOCAL = {"VLLM_CACHE_ROOT": "vllm-cache", "TORCHINDUCTOR_CACHE_DIR": "inductor"}


@dataclass(frozen=True)
class NodeKind:
    """What a node of the cluster is: the one place a render learns whether it asks for GPUs and
    checks IMEX (a GB300 tray) or neither (a CPU node of kimictl's CPU runtime)."""

    name: str
    ranks: int  # vLLM ranks a node runs: its GPUs, or one CPU process
    gpus: bool  # the ranks are GPUs the scheduler hands out
    imex: bool  # TP across nodes runs over cross-node NVLink (IMEX channels)


def node_kind(plan: LaunchPlan, gpus_per_node: int = GPUS_PER_NODE) -> NodeKind:
    if plan.runtime == "cpu":  # one rank per node, as the cpu-demo-tp2 hosts run it
        return NodeKind("CPU node", 1, gpus=False, imex=False)
    return NodeKind(f"{gpus_per_node}-GPU node (GB300 tray: 4)", gpus_per_node, True, True)


@dataclass(frozen=True)
class Job:
    """One rendered deployment: the launch, how it spreads, and where its key and weights are."""

    fmt: str
    plan: LaunchPlan
    nodes: int
    kind: NodeKind
    cluster: ClusterSettings
    key: str  # "secret" (a named one), "rendered" (value in a rendered Secret), "env", "none"
    secret: str | None = None  # the Secret the pods read the key from (k8s)
    image: str = VLLM_IMAGE

    @property
    def ray(self) -> bool:
        return self.plan.ray

    @property
    def per_node(self) -> int:
        """GPUs to ask for per node (CPU nodes: 0)."""
        return self.plan.ranks // self.nodes if self.kind.gpus else 0

    @property
    def argv(self) -> list[str]:
        """The one-node argv, bound to every interface, key redacted."""
        return _bind_all(redact_argv(self.plan.argv))

    @property
    def model(self) -> str:
        return _model(self.plan)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in self.plan.env.items() if k not in _LOCAL_ENV and k != ENV_VAR}
        if self.hf_home:  # the volume holds the checkpoints: read them, never download
            env |= {"HF_HOME": self.hf_home, "HF_HUB_OFFLINE": "1"}
        elif self.nodes > 1:  # a model path on every node (job_for refused the rest): no hub
            env["HF_HUB_OFFLINE"] = "1"
        return env

    @property
    def hf_home(self) -> str | None:
        """The Hugging Face cache every rank reads: on the shared path (Slurm) or the mounted
        volume (k8s); None when the profile names no weights volume for this format."""
        if self.fmt == "slurm":
            path = self.cluster.weights_path
            return f"{path.rstrip('/')}/hf" if path else None
        return self.cluster.hf_home

    @property
    def needs_imex(self) -> bool:
        """TP ranks on several GPU nodes: cross-node NVLink (IMEX) is what the fast path runs on."""
        return self.nodes > 1 and self.kind.imex


def _model(plan: LaunchPlan) -> str:
    """The model `vllm serve` loads: a hub id, or a path on the nodes."""
    return plan.argv[2] if len(plan.argv) > 2 else plan.model


def _bind_all(argv: list[str]) -> list[str]:
    out = list(argv)
    if "--host" in out:
        out[out.index("--host") + 1] = BIND_ALL
    else:
        out += ["--host", BIND_ALL]
    return out


def _nodes(plan: LaunchPlan, nnodes: int | None, kind: NodeKind) -> int:
    """TP8 on 4-GPU trays spans 2 nodes, TP16 spans 4; TP2 on CPU nodes spans 2."""
    ranks = max(plan.ranks, 1)
    nodes = nnodes if nnodes and nnodes > 1 else max(1, math.ceil(ranks / kind.ranks))
    if ranks % nodes:
        what = "GPUs" if kind.gpus else "ranks"
        raise InputError(
            f"{plan.ranks} {what} do not split evenly over {nodes} nodes; allowed --nnodes: "
            + ", ".join(str(n) for n in range(1, ranks + 1) if ranks % n == 0)
            + "."
        )
    return nodes


def _checked(flag: str, value: str, check: Any) -> str:
    try:
        return str(check(value))
    except ValueError as exc:
        raise InputError(f"{flag} {value!r} is not allowed; it must be {exc}.") from None


def job_for(
    plan: LaunchPlan,
    fmt: str,
    *,
    nnodes: int | None = None,
    gpus_per_node: int = GPUS_PER_NODE,
    cluster: ClusterSettings | None = None,
    api_key_secret: str | None = None,
    weights_path: str | None = None,
    insecure: bool = False,
    image: str = VLLM_IMAGE,
) -> Job:
    """Check what the cluster needs that a local launch does not, and fix node count and key.
    `api_key_secret` and `weights_path` go through the rules of their `[cluster]` keys."""
    if fmt not in FORMATS:
        raise InputError(f"--render {fmt!r} is not a format; allowed: {', '.join(FORMATS)}.")
    cluster = cluster or ClusterSettings()
    if api_key_secret is not None:
        api_key_secret = _checked("--api-key-secret", api_key_secret, check_object_name)
    if weights_path is not None:  # this render's weights: the path, instead of the profile's
        weights_path = _checked("--weights-path", weights_path, check_abs_path)
        cluster = replace(cluster, weights_path=weights_path, weights_pvc=None)
    if "--otlp-traces-endpoint" in plan.argv:
        endpoint = plan.argv[plan.argv.index("--otlp-traces-endpoint") + 1]
        if is_loopback(urlsplit(endpoint).hostname or ""):
            # inside a pod or a Slurm step, loopback is that node: no kimictl monitor listens there
            raise InputError(
                f"traces go to {endpoint}, the job's own node, where no monitor listens.",
                hint="render with --traces off, or set [metrics] traces to a collector URL "
                "the nodes reach (http://HOST:PORT/v1/traces).",
            )
    kind = node_kind(plan, gpus_per_node)
    nodes = _nodes(plan, nnodes, kind)
    model = _model(plan)
    missing = weights_problem(cluster, fmt=fmt, nodes=nodes, model=model)
    if missing:
        raise InputError(
            f"a {fmt} job on {nodes} nodes would have every node download {model} itself; "
            f"it needs {missing}.",
            hint="pass --weights-path PATH (a folder every node mounts, holding hf/ as "
            "HF_HOME) or set it in a copy of the profile; fill it once with "
            f"`HF_HOME=PATH/hf hf download {model}`.",
        )
    secret = api_key_secret if api_key_secret is not None else cluster.api_key_secret
    if secret is not None:
        if fmt != "k8s":
            raise InputError(
                f"--api-key-secret {secret} names a Kubernetes Secret; a Slurm job reads "
                f"{ENV_VAR} from the environment sbatch runs in.",
                hint=f"export {ENV_VAR} before sbatch, and drop --api-key-secret.",
            )
        key = "secret"
    elif fmt == "slurm":
        key = "none" if insecure else "env"  # sbatch's environment at submit time
    elif plan.api_key:
        key = "rendered"
    elif insecure:
        key = "none"
    else:
        raise InputError(
            f"the rendered pods bind {BIND_ALL} (the kubelet probes and the Service reach the "
            "pod IP), so the API needs a key and none was given.",
            hint=f"set {ENV_VAR} or pass --api-key-file (rendered into a Secret), name an "
            "existing Secret with --api-key-secret (or [cluster] api_key_secret), or pass "
            "--insecure.",
        )
    if key == "rendered":
        secret = f"{plan.name}-api-key"
    return Job(fmt, plan, nodes, kind, cluster, key, secret, image)


def render(
    plan: LaunchPlan,
    fmt: str,
    *,
    nnodes: int | None = None,
    gpus_per_node: int = GPUS_PER_NODE,
    cluster: ClusterSettings | None = None,
    api_key_secret: str | None = None,
    weights_path: str | None = None,
    insecure: bool = False,
    image: str = VLLM_IMAGE,
) -> str:
    """The job file for `plan` (a one-node plan: the node flags are added here)."""
    job = job_for(
        plan,
        fmt,
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
        cluster=cluster,
        api_key_secret=api_key_secret,
        weights_path=weights_path,
        insecure=insecure,
        image=image,
    )
    if fmt == "slurm":
        return _slurm(job)
    from kimictl.runtime.serving.render_k8s import k8s_objects

    return "---\n".join(to_yaml(obj) for obj in k8s_objects(job))


def render_checks(profile: Profile) -> list[Check]:
    """`profiles validate`: would a render of `profile` over its default nodes have every node
    download the model? One check per format (the rule `job_for` refuses by), multi-node only."""
    from kimictl.runtime.checks.rules.base import Check, Section, Status

    ranks = max(profile.spec.gpus_needed, 1)
    nodes = ranks if profile.runtime == "cpu" else math.ceil(ranks / GPUS_PER_NODE)
    model = profile.spec.model
    if nodes < 2 or is_local_model(model):
        return []
    checks = []
    for fmt in FORMATS:
        missing = weights_problem(profile.cluster, fmt=fmt, nodes=nodes, model=model)
        cid = f"render.{fmt}.weights"
        if missing:
            message = f"--render {fmt}: {nodes} nodes would each download {model}; needs {missing}"
            remedy = f"kimictl serve {profile.name} --render {fmt} --weights-path PATH"
            checks.append(Check(cid, Section.DEPLOYMENT, Status.WARN, message, remedy))
        else:
            pvc = profile.cluster.weights_pvc
            where = f"PVC {pvc}" if fmt == "k8s" and pvc else profile.cluster.weights_path
            message = f"--render {fmt}: {nodes} nodes read {model} from {where}, offline"
            checks.append(Check(cid, Section.DEPLOYMENT, Status.PASS, message))
    return checks


def render_ab(
    plans: list[LaunchPlan],
    fmt: str,
    *,
    canary: float | None,
    shadow: float | None,
    gateway: str,
    cluster: ClusterSettings | None = None,
    api_key_secret: str | None = None,
    weights_path: str | None = None,
    insecure: bool = False,
) -> str:
    """`serve --ab --canary PCT|--shadow PCT --render k8s`: both deployments (tuned, stock) and
    the HTTPRoute in front of them, from the same edge plan as the local nginx edge. Each arm's
    spans carry its role as service.instance.id (and its profile as service.name), so a collector
    or `kimictl monitor tuned=... stock=...` tells them apart."""
    from dataclasses import replace

    from kimictl.deployment.traces import INSTANCE_ATTRIBUTE
    from kimictl.runtime.serving.proxy import plan_edge
    from kimictl.runtime.serving.render_k8s import http_route, leader_service

    if fmt != "k8s":
        raise InputError(
            "--canary/--shadow render as a Kubernetes HTTPRoute (--render k8s); on this machine "
            "`kimictl serve --ab --canary PCT` runs an nginx edge instead."
        )
    tuned, stock = plans
    edge = plan_edge(
        canary=canary,
        shadow=shadow,
        host="0.0.0.0",
        port=tuned.port,
        tuned=f"http://{leader_service(tuned.name)}:{tuned.port}",
        stock=f"http://{leader_service(stock.name)}:{stock.port}",
    )
    texts = []
    for plan in plans:
        if "OTEL_SERVICE_NAME" in plan.env:
            env = plan.env | {
                "OTEL_SERVICE_NAME": plan.name,
                "OTEL_RESOURCE_ATTRIBUTES": f"{INSTANCE_ATTRIBUTE}={plan.role}",
            }
            plan = replace(plan, env=env)
        texts.append(
            render(
                plan,
                fmt,
                cluster=cluster,
                api_key_secret=api_key_secret,
                weights_path=weights_path,
                insecure=insecure,
            )
        )
    route = http_route(edge, name=f"{tuned.name}-{edge.mode}", gateway=gateway)
    return "---\n".join([*texts, to_yaml(route)])


# ---------------------------------------------------------------- slurm


def _slurm(job: Job) -> str:
    plan, nodes = job.plan, job.nodes
    lines = [
        "#!/usr/bin/env bash",
        f"# Rendered by kimictl from profile {plan.profile}: vLLM on {nodes} node(s)"
        + (f" x {job.per_node} GPU(s)." if job.per_node else " (CPU)."),
        "# Rank 0 serves the OpenAI API on every interface; "
        + (
            "the other nodes join its Ray cluster."
            if job.ray
            else "ranks above 0 run headless (vLLM's mp backend)."
        ),
        f"#SBATCH --job-name={plan.name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if job.per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.per_node}")
    lines += [
        "#SBATCH --exclusive",
        "#SBATCH --mem=0",  # all of each node's memory: vLLM sizes its buffers from what it sees
        "set -euo pipefail",
        "",
    ]
    for key, value in job.env.items():
        if key in _NODE_LOCAL:  # the rendering host's run folder means nothing on the nodes
            continue
        lines.append(f"export {key}={shlex.quote(value)}")
    local = [key for key in _NODE_LOCAL if key in job.env]
    if local:
        lines.append(
            "# Compile caches on each node's own disk, one folder per job (docs/serve.md)."
        )
        lines += [
            f'export {key}="${{TMPDIR:-/tmp}}/kimictl-job-$SLURM_JOB_ID/{_NODE_LOCAL[key]}"'
            for key in local
        ]
    if job.key == "env":
        lines.append(f'export {ENV_VAR}="${{{ENV_VAR}:?set {ENV_VAR} before sbatch}}"')
    if not job.hf_home and is_local_model(job.model):
        lines.append(f"# The model is read from {job.model} on every node (the same path on each).")
    elif not job.hf_home:  # one node (job_for refuses more without a shared path)
        lines.append("# No [cluster] weights_path: the node fills its own Hugging Face cache.")
    lines += [
        "",
        "VLLM_ARGV=(",
        *(f"  {shlex.quote(word)}" for word in job.argv),
        ")",
        "",
        "# The first node's address as Slurm itself reaches it (NodeAddr, or the node's name when",
        "# none is set): a node name need not resolve on the other nodes. sed reads to the end:",
        "# under pipefail, head closing the pipe early can end the job with SIGPIPE.",
        'MASTER_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
        'MASTER_ADDR="$(sinfo -h -N -n "$MASTER_NODE" -o %o | sed -n 1p)"',
        "export MASTER_NODE MASTER_ADDR",
        f'echo "API: http://$MASTER_ADDR:{plan.port} (model {plan.model})"',
        "",
    ]
    # One step per phase; --kill-on-bad-exit=1 ends every task of a step when one fails, and
    # set -e then ends the job: one dead rank never leaves a half-alive server.
    step = f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1"
    if job.needs_imex:
        lines += [
            "# Cross-node NVLink: every node needs its IMEX channel (nvidia-imex running).",
            f"{step} bash -c '"
            f'test -e {IMEX_CHANNEL} || {{ echo "$(hostname): no IMEX channel {IMEX_CHANNEL}; '
            "start nvidia-imex on every node of the NVLink domain\" >&2; exit 1; }'",
            "",
        ]
    # the CPU runtime's server runs at kimictl's own launch niceness (cpu_runtime.SERVER_NICE)
    nice = f"nice -n {plan.nice} " if plan.nice else ""
    if job.ray:
        lines += _slurm_ray(job, step)
    else:
        lines += [
            "# One task per node; each picks its rank from SLURM_NODEID.",
            f"{step} bash -c '",
            '  rank="$SLURM_NODEID"',
            '  extra=(--node-rank "$rank")',
            '  if [ "$rank" -gt 0 ]; then extra+=(--headless); fi',
            f'  exec {nice}"$0" "$@" --nnodes {nodes} --master-addr "$MASTER_ADDR" "${{extra[@]}}"',
            '\' "${VLLM_ARGV[@]}"',
            "",
        ]
    return "\n".join(lines)


def _slurm_ray(job: Job, step: str) -> list[str]:
    """Ray head on the first node, one Ray worker per other node, then `vllm serve` (Ray backend,
    no node flags) on the head. The job ends when the server or any Ray node ends."""
    nodes = job.nodes
    wait = wait_for_nodes_code(nodes)  # the head starts in the background
    one = "srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1"
    # A CPU node's Ray is the CPU runtime's (Ray and kimictl's fix-ups live in that venv), and it
    # offers Ray one CPU per rank: vLLM packs one {"CPU": 1} bundle per rank, so a node offering
    # more would take the other nodes' ranks.
    bindir = "" if job.kind.gpus else f"{Path(job.plan.argv[0]).parent}/"
    python = "python3" if job.kind.gpus else f"{bindir}python"
    nice = f"nice -n {job.plan.nice} " if job.plan.nice else ""
    cpus = "" if job.kind.gpus else f" --num-cpus={job.kind.ranks}"
    lines = [
        f'{one} -w "$MASTER_NODE" {bindir}ray start --head --node-ip-address="$MASTER_ADDR" '
        f"--port={RAY_PORT}{cpus} --block &",
    ]
    if nodes > 1:
        lines += [
            "sleep 5",
            f"srun --nodes={nodes - 1} --ntasks-per-node=1 --kill-on-bad-exit=1 "
            f'--exclude="$MASTER_NODE" {bindir}ray start --address="$MASTER_ADDR:{RAY_PORT}"'
            f"{cpus} --block &",
        ]
    lines += [
        f"{python} -c {shlex.quote(wait)}",
        f'export {ADDRESS_ENV}="$MASTER_ADDR:{RAY_PORT}"  # the cluster vLLM joins',
        f'{one} -w "$MASTER_NODE" --overlap {nice}"${{VLLM_ARGV[@]}}" &',
        "wait -n  # the server or a Ray node ended: end the job (its other steps with it)",
        "exit 1",
        "",
    ]
    return lines


# ---------------------------------------------------------------- YAML


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
