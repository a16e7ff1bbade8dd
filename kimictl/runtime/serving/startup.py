"""vLLM's start-up log: the phases it shows and the likely cause of a failed start."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from kimictl.runtime.serving.ray_cluster import ADDRESS_ENV, RAY_PORT

__all__ = [
    "LOG_TAIL_LINES",
    "CAUSES",
    "PHASES",
    "LOST_MEMBER",
    "likely_cause",
    "log_tail",
    "lost_member_line",
    "read_phases",
]


# ---------------------------------------------------------------- start-up phases


LOG_TAIL_LINES = 40

# (pattern in vLLM's log, phase shown). Order = the order they happen in.
PHASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"non-default args|vLLM API server version|version \d"), "starting API server"),
    (re.compile(r"Resolved architecture"), "reading model config"),
    (re.compile(r"Initializing a V1 LLM engine|EngineCore"), "starting engine"),
    # The engine core's executor starts its worker processes (each imports vLLM and torch again).
    (re.compile(r"DP group leader|Starting worker|VllmWorker"), "starting workers"),
    (re.compile(r"Starting to load model|Loading safetensors|Loading weights"), "loading weights"),
    (re.compile(r"Compiling a graph|Dynamo bytecode transform|torch\.compile takes"), "compiling"),
    (re.compile(r"KV cache size|Available KV cache memory|init engine"), "allocating KV cache"),
    (
        re.compile(r"Capturing CUDA graph|Capturing cudagraph|Graph capturing"),
        "capturing CUDA graphs",
    ),
    (re.compile(r"Starting vLLM server on|Application startup complete"), "API up, warming"),
)


def read_phases(text: str) -> list[str]:
    """The start-up phases that `text` (a chunk of vLLM's log) shows, in log order."""
    found: list[str] = []
    for line in text.splitlines():
        for pattern, phase in PHASES:
            if pattern.search(line) and phase not in found:
                found.append(phase)
    return found


def log_tail(
    path: Path | str, lines: int = LOG_TAIL_LINES, scan_bytes: int = 64 * 1024
) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - scan_bytes))
            data = handle.read().decode(errors="replace")
    except OSError:
        return []
    return data.splitlines()[-lines:]


# (pattern in the log, likely cause). First match wins; most specific first.
CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Kimi K3 specialized decode does not support (.+?)[\"')]*$", re.M),
        "the K3 fast path refused this deployment: {0} (run `kimictl doctor --profile ...`)",
    ),
    (
        re.compile(r"Supported decode_backend values are"),
        "decode_backend must be auto or latency_specialized",
    ),
    (
        re.compile(r"Address already in use"),
        "the port was taken between kimictl's check and vLLM's bind; pick another --port",
    ),
    (
        re.compile(r"Head dimension \d+ is not supported by MLA"),
        "the CPU MLA kernel needs kv_lora_rank + qk_rope_head_dim == 576",
    ),
    (
        re.compile(r"(OutOfMemoryError|CUDA out of memory|No available memory for the cache)"),
        "out of memory: lower --gpu-memory-utilization, --max-model-len or --max-num-seqs",
    ),
    (
        re.compile(r"VLLM_CPU_KVCACHE_SPACE"),
        "the CPU KV cache does not fit: set VLLM_CPU_KVCACHE_SPACE (GiB) lower",
    ),
    (
        re.compile(r"(unrecognized arguments|error: argument|invalid choice)"),
        "a flag this vLLM version does not accept (see the log line above)",
    ),
    (
        re.compile(
            r"(does not appear to have a file named config\.json|HFValidationError|"
            r"Repo id must be|Invalid repository ID or local directory|is not a local folder)"
        ),
        "the model path or id cannot be read (offline, or the folder is missing files)",
    ),
    (
        re.compile(r"(Unrecognized model|does not recognize this architecture|model type `)"),
        "the model's config.json names an architecture this vLLM/transformers cannot load",
    ),
    (
        re.compile(r"Worker proc (\S+) died unexpectedly \(exit code: (-?\d+)\)"),
        "vLLM's worker process {0} died (exit code {1})",
    ),
    (
        re.compile(r"RayWorkerProc rank=\[[\d, ]+\] died unexpectedly"),
        "a rank's Ray actor died (its process on that node exited or was killed; that "
        "node's Ray logs say why)",
    ),
    (
        re.compile(r"RuntimeError: Executor failed\."),
        "the executor lost a rank (a worker process, or under Ray a rank's actor on some node; "
        "the lines above name it)",
    ),
    (
        re.compile(r"Could not find any running Ray instance"),
        "no Ray cluster to join: `ray start --head` on this node (and `ray start --address "
        f"HEAD:{RAY_PORT}` on the others), or set {ADDRESS_ENV}=HEAD:{RAY_PORT}",
    ),
    (
        re.compile(r"(ModuleNotFoundError|ImportError|PackageNotFoundError)"),
        "the vLLM install is broken or incomplete: re-run `kimictl setup cpu-runtime` "
        "(CPU) or reinstall vLLM",
    ),
)


# vLLM's own line naming the member it lost, as its executors log it (vLLM 0.32:
# ray_executor_v2.py "RayWorkerProc rank=%s died unexpectedly, shutting down executor.",
# multiproc_executor.py "Worker proc %s died unexpectedly (exit code: %s), ...", v1/utils.py
# "Engine core process %s died unexpectedly."). The traceback that follows can push it out of
# the tail, so it is looked for in the whole recent log.
LOST_MEMBER = re.compile(
    r"RayWorkerProc rank=\[[\d, ]+\] died unexpectedly|Worker proc \S+ died unexpectedly|"
    r"Engine core process \S+ died unexpectedly"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SCAN_BYTES = 1024 * 1024
# Where one of vLLM's log records begins: its process prefixes ("(EngineCore pid=554) ",
# "(RayWorkerProc pid=193, ip=10.77.0.2) (Worker_TP1 pid=193) "), if any, then the level and date.
# Processes share the log file, so a record can start mid-line after another's unfinished write.
_RECORD_START = re.compile(
    r"(?:\(\w+ pid=\d+[^()]*\)\s*)*(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:"
)


def lost_member_line(path: Path | str) -> str | None:
    """The last line of vLLM's log (its last MiB) in which vLLM names the rank or process it
    lost, without colour codes; None when vLLM named none."""
    for raw in reversed(log_tail(path, lines=100_000, scan_bytes=_SCAN_BYTES)):
        line = _ANSI.sub("", raw)
        match = LOST_MEMBER.search(line)
        if match:
            starts = [m.start() for m in _RECORD_START.finditer(line, 0, match.start())]
            return line[starts[-1] if starts else 0 :].strip()
    return None


def likely_cause(lines: list[str], returncode: int | None) -> str:
    text = "\n".join(lines)
    for pattern, cause in CAUSES:
        match = pattern.search(text)
        if match:
            return cause.format(*(g.strip() for g in match.groups()))
    if returncode is not None and returncode in (-9, 137):
        return "killed by SIGKILL (often the kernel's out-of-memory killer: see `dmesg`)"
    if returncode is not None and returncode < 0:
        return f"killed by signal {signal.Signals(-returncode).name}"
    return "not recognised: read the log lines above"
