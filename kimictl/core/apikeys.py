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
    "auth_hint",
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
        raw = path.read_bytes()
    except OSError as error:
        raise InputError(f"--api-key-file {path}: cannot read it ({error.strerror}).") from error
    try:
        key = raw.decode("ascii").strip().splitlines()
    except UnicodeDecodeError as error:
        raise InputError(_not_ascii(path, raw, error.start)) from None
    if not key or not key[0].strip():
        raise InputError(f"--api-key-file {path} is empty; it must hold the key on its first line.")
    if not key[0].strip().isprintable():
        raise InputError(
            f"--api-key-file {path}: the key holds a control character; an API key is one line "
            "of printable ASCII."
        )
    return key[0].strip()


def _not_ascii(path: Path, raw: bytes, at: int) -> str:
    """One sentence for a key file that is not plain ASCII (what an HTTP header can carry)."""
    boms = {b"\xef\xbb\xbf": "a UTF-8 byte-order mark", b"\xff\xfe": "a UTF-16 byte-order mark"}
    boms[b"\xfe\xff"] = boms[b"\xff\xfe"]
    what = next((name for bom, name in boms.items() if raw.startswith(bom)), None)
    found = what or f"byte 0x{raw[at]:02x} at offset {at}"
    return (
        f"--api-key-file {path} starts with {found}, not plain ASCII text; save the key as one "
        "line of plain ASCII (no BOM, e.g. printf '%s' KEY > FILE)."
        if what
        else f"--api-key-file {path} holds {found}, which is not ASCII; an API key is one line "
        "of printable ASCII."
    )


def auth_hint(status: int, *, key_sent: bool) -> str | None:
    """The next step when a server answers 401/403: the key, not whether the server is up."""
    if status not in (401, 403):
        return None
    if not key_sent:
        return (
            f"the server wants an API key: set {ENV_VAR} or pass --api-key-file FILE "
            "(the key the server was started with)"
        )
    return (
        f"the server refused the key sent: check that {ENV_VAR} or --api-key-file holds the "
        "key the server was started with"
    )


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
