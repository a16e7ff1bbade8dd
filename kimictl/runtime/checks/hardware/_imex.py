"""IMEX channels: the device files cross-tray NVLink memory export/import needs inside a process."""

from __future__ import annotations

import os
from pathlib import Path

from kimictl.runtime.checks.hardware._types import Unavailable

__all__ = ["IMEX_CHANNEL_DIR", "list_imex_channels"]

IMEX_CHANNEL_DIR = Path("/dev/nvidia-caps-imex-channels")


def list_imex_channels(root: Path = IMEX_CHANNEL_DIR) -> list[str] | Unavailable:
    """Names of the channel device files (`channel0`, ...), or why there are none to list."""
    if not root.exists():
        return Unavailable(f"{root} does not exist (no IMEX channel created on this node)")
    try:
        names = sorted(os.listdir(root))
    except OSError as error:
        return Unavailable(f"cannot list {root}: {error.strerror}")
    return [n for n in names if n.startswith("channel")]
