"""Where kimictl keeps its files. One place decides every folder; each can be overridden by env."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "state_dir", "runs_dir"]


def cache_dir() -> Path:
    """Rebuildable things: the CPU runtime venv, the tiny model, kernel builds."""
    env = os.environ.get("KIMICTL_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kimictl"


def state_dir() -> Path:
    """Run records and logs of launched servers (must survive kimictl being killed)."""
    env = os.environ.get("KIMICTL_STATE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "kimictl"


def runs_dir() -> Path:
    return state_dir() / "runs"
