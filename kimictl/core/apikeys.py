"""API keys: read from a file or the VLLM_API_KEY environment variable (never from argv), sent as
a Bearer header, and redacted wherever argv or env is shown or recorded."""

from __future__ import annotations

import os
import re
from pathlib import Path

from kimictl.core.errors import InputError

__all__ = [
    "ENV_VAR",
    "bearer_headers",
    "env_api_key",
    "is_secret_name",
    "read_api_key",
    "redact_argv",
    "redact_env",
]

ENV_VAR = "VLLM_API_KEY"  # what vLLM itself reads
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)


def env_api_key() -> str | None:
    return os.environ.get(ENV_VAR) or None


def read_api_key(path: Path | None) -> str | None:
    """The key from `path` (first line), else from VLLM_API_KEY, else None."""
    if path is None:
        return env_api_key()
    try:
        key = path.read_text().strip().splitlines()
    except OSError as error:
        raise InputError(f"--api-key-file {path}: cannot read it ({error.strerror}).") from error
    if not key or not key[0].strip():
        raise InputError(f"--api-key-file {path} is empty; it must hold the key on its first line.")
    return key[0].strip()


def bearer_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def is_secret_name(name: str) -> bool:
    """An environment variable whose value is never shown (…KEY, …TOKEN, …SECRET, …PASSWORD)."""
    return bool(_SECRET_NAME.search(name))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if is_secret_name(k) else v) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """Hide the value after `--api-key` (kimictl never puts it there; a user's extra args might)."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif word == "--api-key":
            out.append(word)
            hide_next = True
        elif word.startswith("--api-key="):
            out.append("--api-key=***")
        else:
            out.append(word)
    return out
