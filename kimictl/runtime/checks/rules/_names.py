"""How the hardware and fabric checks name nodes and GPUs in their messages."""

from __future__ import annotations

from collections import defaultdict

from kimictl.runtime.checks.hardware import GpuInfo, NodeReport


def _where(node: NodeReport, gpu: GpuInfo | None, multi: bool) -> str:
    g = f"GPU {gpu.index}" if gpu is not None else ""
    if multi:
        return f"{node.hostname} {g}".strip()
    return g or node.hostname


def _list(items: list[str], limit: int = 6) -> str:
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f" and {len(items) - limit} more"


def _gpus_where(items: list[tuple[NodeReport, GpuInfo]], multi: bool, limit: int = 6) -> str:
    """ "tray01 GPU 1; tray02 GPUs 0, 1, 2, 3" - one entry per node, GPU indices grouped."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for node, gpu in items:
        by_node[node.hostname].append(gpu.index)
    parts = []
    for host, indices in by_node.items():
        gpus = f"GPU {indices[0]}" if len(indices) == 1 else f"GPUs {', '.join(map(str, indices))}"
        parts.append(f"{host} {gpus}" if multi else gpus)
    return _list(parts, limit)
