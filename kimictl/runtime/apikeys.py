"""API keys: from a file or the VLLM_API_KEY environment variable, never from argv."""

from __future__ import annotations

import os
from pathlib import Path

from kimictl.runtime.errors import InputError

__all__ = ["read_api_key"]


def read_api_key(path: Path | None) -> str | None:
    """The key from `path` (first line), else from VLLM_API_KEY, else None."""
    if path is None:
        return os.environ.get("VLLM_API_KEY") or None
    try:
        key = path.read_text().strip().splitlines()
    except OSError as error:
        raise InputError(f"--api-key-file {path}: cannot read it ({error.strerror}).") from error
    if not key or not key[0].strip():
        raise InputError(f"--api-key-file {path} is empty; it must hold the key on its first line.")
    return key[0].strip()
