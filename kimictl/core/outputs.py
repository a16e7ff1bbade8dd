"""Files kimictl writes: one check that nothing the user has is replaced silently (run before any
long work), and the one atomic write every writer uses; and the one tolerant read of a JSON object
(a config or manifest that may be missing or broken)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kimictl.core.errors import InputError

T = TypeVar("T")

__all__ = ["atomic_write", "check_new_file", "read_json_input", "read_json_object"]


def check_new_file(
    path: str | Path,
    *,
    flag: str,
    suffix: str | None = None,
    overwrite: bool = False,
    folder_must_exist: bool = True,
) -> Path:
    """The target of `flag`: ends in `suffix`, sits in an existing folder (unless the writer makes
    it), is not a folder, and is not an existing file unless `overwrite` (--force)."""
    target = Path(path).expanduser()
    shown = str(path)
    if suffix is not None and target.suffix.lower() != suffix:
        raise InputError(f"{flag} {shown!r} must name a {suffix} file.")
    if folder_must_exist and not target.parent.is_dir():
        raise InputError(f"{flag} {shown!r}: folder {str(target.parent)!r} does not exist.")
    if target.is_dir():
        raise InputError(f"{flag} {shown!r} is a folder; name a {suffix or 'new'} file.")
    if target.exists() and not overwrite:
        raise InputError(
            f"{flag} {shown!r} already exists; kimictl does not overwrite it.",
            hint="choose another name, or pass --force to replace it",
        )
    return target


def atomic_write(path: str | Path, data: str | bytes, *, mode: int = 0o644) -> Path:
    """Write `data` whole or not at all: a temp file in the same folder, fsync, rename over `path`.
    Creates the folder. A replaced file keeps its permissions; a new one gets `mode`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, target.stat().st_mode & 0o777 if target.exists() else mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_json_input(path: Path, what: str, parse: Callable[[Any], T]) -> T:
    """`parse` of the JSON in `path`, a file the user named; InputError (one sentence) when it
    cannot be read, is not JSON, or `parse` rejects it (`what` says what it should have been)."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}.") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not JSON (line {exc.lineno}: {exc.msg}).") from None
    try:
        return parse(raw)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InputError(f"{path} is not {what}.") from None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when the file is missing, unreadable, not JSON or not an
    object (callers report what that means for them)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
