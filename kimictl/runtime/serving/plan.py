"""Launch plans: a DeploymentSpec -> vLLM argv + env (secrets kept out of argv), run folders and
ports."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimictl.core.apikeys import ENV_VAR, redact_env
from kimictl.core.apikeys import redact_argv as redact_argv
from kimictl.core.errors import InputError, Unsupported
from kimictl.runtime.serving import ray_cluster, runs

if TYPE_CHECKING:
    from kimictl.deployment.spec import DeploymentSpec

__all__ = [
    "DEFAULT_PORT",
    "LOG_NAME",
    "LaunchPlan",
    "check_nodes",
    "check_port_free",
    "plan_launch",
    "require_tcp_port",
    "run_tmp_dir",
    "is_loopback",
    "leads_other_nodes",
    "redact_argv",
]

DEFAULT_PORT = 8000
LOG_NAME = "vllm.log"


# ---------------------------------------------------------------- plans


def uses_ray(argv: list[str]) -> bool:
    """Ray places the ranks (`--distributed-executor-backend ray`)."""
    pairs = zip(argv, argv[1:], strict=False)
    return any(a == "--distributed-executor-backend" and b == "ray" for a, b in pairs)


def leads_other_nodes(argv: list[str]) -> bool:
    """The API server of ranks that may run on other hosts: rank 0 of vLLM's own multi-node
    launch, or a Ray launch (Ray places the ranks anywhere in its cluster)."""
    return ("--nnodes" in argv and "--headless" not in argv) or uses_ray(argv)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one server. `env` is what kimictl adds to the environment."""

    run_id: str
    name: str
    profile: str | None
    runtime: str  # "gpu" | "cpu"
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    model: str  # served model name
    gpus: int
    run_dir: Path
    role: str | None = None
    ab_group: str | None = None
    nice: int = 0  # the server's CPU niceness (see cpu_runtime.SERVER_NICE)
    # Commands other nodes run (multi-node mp backend): printed, never executed by kimictl. The
    # vLLM argv each rank gets, and the `kimictl serve ... --node-rank R` a person runs there.
    other_nodes: list[list[str]] = field(default_factory=list)
    other_node_commands: list[list[str]] = field(default_factory=list)
    ranks: int = 1  # vLLM's world size (TP x PP x DP): one GPU each, or one CPU process each

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def headless(self) -> bool:
        return "--headless" in self.argv

    @property
    def ray(self) -> bool:
        return uses_ray(self.argv)

    @property
    def leads_other_nodes(self) -> bool:
        return leads_other_nodes(self.argv)

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_NAME

    @property
    def api_key(self) -> str | None:
        return self.env.get(ENV_VAR)

    def redacted_env(self) -> dict[str, str]:
        return redact_env(self.env)

    def redacted_argv(self) -> list[str]:
        return redact_argv(self.argv)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "name": self.name,
            "profile": self.profile,
            "runtime": self.runtime,
            "role": self.role,
            "ab_group": self.ab_group,
            "url": self.url,
            "model": self.model,
            "gpus": self.gpus,
            "nice": self.nice,
            "argv": self.redacted_argv(),
            "env": self.redacted_env(),
            "log_path": str(self.log_path),
            "other_nodes": [redact_argv(a) for a in self.other_nodes],
            "other_node_commands": self.other_node_commands,
        }


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().exists()


def plan_launch(
    spec: DeploymentSpec,
    *,
    name: str,
    profile: str | None = None,
    runtime: str = "gpu",
    host: str | None = None,
    port: int | None = None,
    api_key: str | None = None,
    role: str | None = None,
    ab_group: str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    ray: bool = False,
    ray_address: str | None = None,
    run_id: str | None = None,
) -> LaunchPlan:
    """Resolve the model, pick the executable and environment, and fix host and port.
    `ray_address`: the Ray cluster a direct Ray launch joins (ray_cluster.address_env)."""
    from kimictl.runtime.serving import cpu_runtime, tinymodel

    if runtime == "cpu" and (ray or spec.distributed_executor_backend == "ray"):
        if not cpu_runtime.ray_ready():
            raise Unsupported(ray_cluster.CPU_UNSUPPORTED + ".", hint=ray_cluster.CPU_RAY_HINT)
    host = host or spec.host or "127.0.0.1"
    port = port if port is not None else (spec.port or DEFAULT_PORT)
    require_tcp_port(port)
    run_id = run_id or runs.new_run_id(name)
    run_dir = runs.run_dir_for(run_id)

    model = spec.model
    served = spec.served_model_name
    if model.startswith(tinymodel.TINY_MODEL):
        served = served or "tiny-k2"
        if runtime == "cpu":
            cpu_runtime.require_installed()
        model = str(tinymodel.resolve_model(model))
    elif _looks_like_path(model):
        resolved = Path(model).expanduser()
        if not resolved.is_dir():
            raise InputError(
                f"model path '{model}' does not exist or is not a folder.",
                hint="pass --model with a local model folder or a Hugging Face id (org/name).",
            )
        if not (resolved / "config.json").is_file() and not (resolved / "params.json").is_file():
            raise InputError(
                f"model folder '{model}' has no config.json (nor params.json) for vLLM to load.",
                hint="point --model at the folder holding the checkpoint's config.json.",
            )
        model = str(resolved.resolve())
    elif runtime == "cpu":
        raise InputError(
            f"model '{model}' is not a local folder; the CPU runtime runs offline.",
            hint="pass --model with a local model folder, or @tiny-k2 for the built-in model.",
        )
    served = served or spec.model

    spec = spec.with_(model=model, served_model_name=served, host=host, port=port)
    if ray:
        spec = spec.with_(distributed_executor_backend="ray")
    env: dict[str, str] = {}
    if runtime == "cpu":
        if not spec.enforce_eager:
            spec = spec.with_(enforce_eager=True)  # torch.compile's cache never reloads on CPU
        env.update(cpu_runtime.server_env(run_dir, base={}, create=False))
        executable = str(cpu_runtime.venv_dir() / "bin" / "vllm")
    else:
        executable = "vllm"
    env["TMPDIR"] = str(run_tmp_dir(run_dir, run_id))
    env.update(spec.to_env())
    if ray_address and spec.distributed_executor_backend == "ray":
        env[ray_cluster.ADDRESS_ENV] = ray_address  # the run's TMPDIR hides Ray's address file
    if api_key:
        env[ENV_VAR] = api_key
    argv = spec.to_argv(executable)

    check_nodes(
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        world_size=spec.gpus_needed,
        ray=spec.distributed_executor_backend == "ray",
    )
    other_nodes: list[list[str]] = []
    if nnodes > 1 and spec.distributed_executor_backend != "ray":
        assert master_addr is not None  # check_nodes refused it otherwise
        base = [*argv, "--nnodes", str(nnodes), "--master-addr", master_addr]
        argv = [*base, "--node-rank", str(node_rank)]
        if node_rank > 0:
            argv.append("--headless")
        other_nodes = [
            [*base, "--node-rank", str(rank), "--headless"]
            for rank in range(nnodes)
            if rank != node_rank and rank > 0
        ]
    return LaunchPlan(
        run_id=run_id,
        name=name,
        profile=profile,
        runtime=runtime,
        argv=argv,
        env=env,
        host=host,
        port=port,
        model=served,
        gpus=0 if runtime == "cpu" else spec.gpus_needed,
        run_dir=run_dir,
        role=role,
        ab_group=ab_group,
        nice=cpu_runtime.SERVER_NICE if runtime == "cpu" else 0,
        other_nodes=other_nodes,
        ranks=spec.gpus_needed,
    )


def is_loopback(addr: str) -> bool:
    """True for a loopback IP or `localhost`; a host name is resolved on the nodes, not here."""
    import ipaddress

    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False  # a host name: resolved on the nodes, not here


def _allowed_nnodes(world_size: int) -> str:
    divisors = (str(n) for n in range(1, world_size + 1) if world_size % n == 0)
    return f"allowed --nnodes: {', '.join(divisors)}."


def check_nodes(
    *,
    nnodes: int,
    node_rank: int,
    master_addr: str | None,
    world_size: int,
    ray: bool = False,
) -> None:
    """Refuse, before anything starts, the node flags vLLM's engine arguments refuse later
    (`EngineArgs.create_engine_config`: nnodes divides the world size TPxPPxDP, 0 <= node-rank <
    nnodes; `ParallelConfig`: nnodes > 1 only with the mp backend) and those it silently
    ignores (a node rank without nnodes; a loopback master the other nodes cannot reach)."""
    if nnodes < 1:
        raise InputError(f"--nnodes {nnodes} is not a node count; allowed: 1 or more.")
    if nnodes == 1:
        if node_rank != 0:
            raise InputError(
                f"--node-rank {node_rank} needs --nnodes above 1; vLLM ignores a node rank "
                "on a single node.",
                hint="pass --nnodes N (the deployment's node count) with --node-rank.",
            )
        if master_addr is not None:
            raise InputError(
                f"--master-addr {master_addr} needs --nnodes above 1; a single node has no "
                "master to reach.",
                hint="pass --nnodes N with --master-addr, or drop --master-addr.",
            )
        return
    if ray:
        # vLLM: "nnodes > 1 can only be set when distributed executor backend is mp, uni or
        # external_launcher." Ray places every rank itself from the head node.
        if node_rank != 0 or master_addr is not None:
            raise InputError(
                "--ray runs one `vllm serve` on the Ray head node and Ray places the other "
                "ranks; --node-rank and --master-addr belong to vLLM's mp backend.",
                hint="start Ray on every node (`ray start --head` / `ray start --address "
                f"HEAD:{ray_cluster.RAY_PORT}`), then run `kimictl serve PROFILE --ray "
                "--nnodes N` on the head.",
            )
        if world_size % nnodes:
            raise InputError(
                f"--nnodes {nnodes} must evenly divide the world size ({world_size} = TP x PP "
                "x DP).",
                hint=_allowed_nnodes(world_size),
            )
        return
    if world_size % nnodes:
        raise InputError(
            f"`--nnodes {nnodes}` must evenly divide the total world size ({world_size} = TP x "
            "PP x DP); vLLM refuses it at start.",
            hint=_allowed_nnodes(world_size),
        )
    if not 0 <= node_rank < nnodes:
        raise InputError(
            f"`--node-rank` must be between 0 and {nnodes - 1}; got `--node-rank {node_rank}`.",
            hint="set it to this node's zero-based index.",
        )
    if master_addr is None:
        raise InputError(
            f"--nnodes {nnodes} needs --master-addr (the address of node rank 0, reachable "
            "from every node)."
        )
    if is_loopback(master_addr):
        raise InputError(
            f"--master-addr {master_addr} is a loopback address; the other {nnodes - 1} "
            "node(s) cannot reach node rank 0 there.",
            hint="pass node rank 0's address on the network the nodes share.",
        )


# Linux limits a unix socket path to 107 bytes; vLLM names its ZMQ sockets with a 36-character
# uuid inside TMPDIR. A run folder too deep for that gets a short per-run folder in /tmp instead.
_SOCKET_PATH_MAX = 107 - 1 - 36 - 8


def run_tmp_dir(run_dir: Path, run_id: str) -> Path:
    """The run's private TMPDIR: `<run_dir>/tmp`, or `/tmp/kimictl-<id>` when that is too long."""
    inside = run_dir / "tmp"
    if len(str(inside)) <= _SOCKET_PATH_MAX:
        return inside
    import tempfile

    return Path(tempfile.gettempdir()) / f"kimictl-{run_id}"


# ---------------------------------------------------------------- ports


def require_tcp_port(port: int) -> None:
    if not 0 < port < 65536:
        raise InputError(f"--port {port} is not a TCP port; allowed: 1-65535.")


def check_port_free(host: str, port: int) -> None:
    """InputError naming who holds the port (a kimictl run if it is one) when it is taken."""
    require_tcp_port(port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Same option uvicorn sets: a port in TIME_WAIT is free, a listening one is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return
        except OSError as error:
            busy = error
    holder = next((r for r in runs.list_runs() if r.port == port), None)
    who = f" by kimictl run '{holder.id}'" if holder else ""
    raise InputError(
        f"port {port} on {host} is already in use{who} ({busy.strerror}).",
        hint=(
            f"`kimictl stop {holder.id}` frees it, or pick another with --port."
            if holder
            else "pick another with --port, or stop what listens there."
        ),
    )
