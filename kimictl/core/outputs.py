"""Files kimictl writes. For a file or folder the user named: one check, run before any long work
(`check_new_file`, `check_new_folder`: the folder exists or can be made and is writable, the
target is absent unless --force), one writer that never replaces what the user has
(`write_new`), and one end-of-run save that keeps the results in the state folder when the write
still fails (`save_or_keep`, exit 1). For kimictl's own files: the one atomic write. And the one
tolerant read of a JSON object (a config or manifest that may be missing or broken)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from kimictl.core.errors import InputError, WriteFailed
from kimictl.core.paths import state_dir

T = TypeVar("T")

__all__ = [
    "atomic_write",
    "check_new_file",
    "check_new_folder",
    "keep_results",
    "read_json_input",
    "read_json_object",
    "save_or_keep",
    "write_new",
]

_EXISTS_HINT = "choose another name, or pass --force to replace it"


def _writable_folder(folder: Path, flag: str, shown: str, *, must_exist: bool) -> None:
    """`folder` (or, when kimictl makes it, its nearest existing parent) is a writable folder."""
    if must_exist and not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise InputError(f"{flag} {shown!r}: folder {str(folder)!r} {what}.")
    place = folder
    while not place.exists() and place != place.parent:
        place = place.parent
    if not place.is_dir():
        raise InputError(f"{flag} {shown!r}: {str(place)!r} is a file, not a folder.")
    if not os.access(place, os.W_OK | os.X_OK):
        raise InputError(
            f"{flag} {shown!r}: folder {str(place)!r} is not writable (read-only or not yours).",
            hint="name a file in a folder you can write",
        )


def check_new_file(
    path: str | Path,
    *,
    flag: str,
    suffix: str | None = None,
    overwrite: bool = False,
    folder_must_exist: bool = True,
    forceable: bool = True,
) -> Path:
    """The target of `flag`, checked before any work: ends in `suffix`, sits in a writable folder
    (an existing one unless the writer makes it), is not a folder, and is not an existing file
    unless `overwrite` (--force; `forceable=False` for a command without one)."""
    target = Path(path).expanduser()
    shown = str(path)
    if suffix is not None and target.suffix.lower() != suffix:
        raise InputError(f"{flag} {shown!r} must name a {suffix} file.")
    if target.is_dir():
        raise InputError(f"{flag} {shown!r} is a folder; name a {suffix or 'new'} file.")
    _writable_folder(target.parent, flag, shown, must_exist=folder_must_exist)
    if target.exists() and not overwrite:
        raise InputError(
            f"{flag} {shown!r} already exists; kimictl does not overwrite it.",
            hint=_EXISTS_HINT if forceable else "choose another name",
        )
    return target


def check_new_folder(
    path: str | Path, *, flag: str, names: Iterable[str] = (), overwrite: bool = False
) -> Path:
    """A folder `flag` writes the files `names` into, checked before any work: not a file, it or
    its nearest existing parent writable, and none of `names` in it unless `overwrite`. With no
    `names` (a run's own folder) the folder itself must not exist yet."""
    target = Path(path).expanduser()
    shown = str(path)
    if target.exists() and not target.is_dir():
        raise InputError(f"{flag} {shown!r} is a file; name a folder.")
    wanted = list(names)
    if target.is_dir() and not wanted and not overwrite:
        raise InputError(
            f"{flag} {shown!r} already exists; kimictl writes into a new folder only.",
            hint="give a new folder name",
        )
    _writable_folder(target, flag, shown, must_exist=False)
    taken = [n for n in wanted if (target / n).exists()]
    if taken and not overwrite:
        raise InputError(
            f"{flag} {shown!r} already holds {', '.join(taken)}; kimictl does not overwrite them.",
            hint="choose another folder, or move those files away",
        )
    return target


def _temp_beside(target: Path, data: str | bytes, mode: int) -> str:
    """`data` in a temp file in `target`'s folder, fsynced, with `mode`; its path."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write(path: str | Path, data: str | bytes, *, mode: int = 0o644) -> Path:
    """Write `data` whole or not at all: a temp file in the same folder, fsync, rename over `path`.
    Creates the folder. A replaced file keeps its permissions; a new one gets `mode`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    keep = target.stat().st_mode & 0o777 if target.exists() else mode
    tmp = _temp_beside(target, data, keep)
    try:
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_new(
    path: str | Path,
    data: str | bytes,
    *,
    flag: str,
    overwrite: bool = False,
    mode: int = 0o644,
    make_folder: bool = False,
) -> Path:
    """The one writer of a file the user named: whole or not at all (a temp file, fsync, then a
    hard link that fails if the name was taken meanwhile), never over an existing file unless
    `overwrite`; the folder is made only with `make_folder` (the check allowed a missing one).
    InputError when the file exists; OSError when the folder refuses the write."""
    target = Path(path).expanduser()
    if make_folder:
        target.parent.mkdir(parents=True, exist_ok=True)
    if overwrite:
        return atomic_write(target, data, mode=mode)
    tmp = _temp_beside(target, data, mode)
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise InputError(
            f"{flag} {str(path)!r} already exists (made meanwhile); kimictl does not overwrite it.",
            hint="choose another name",
        ) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def keep_results(name: str, data: str | bytes) -> Path:
    """Keep `data` in the state folder (kept/<time>-<name>, mode 0600) when the user's target
    could not take it; the path is what the user is told."""
    folder = state_dir() / "kept"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = folder / f"{stamp}-{name}"
    n = 1
    while target.exists():
        n += 1
        target = folder / f"{stamp}-{n}-{name}"
    return atomic_write(target, data, mode=0o600)


def save_or_keep(
    path: str | Path, data: str | bytes, *, flag: str, overwrite: bool = False, mode: int = 0o644
) -> Path:
    """`write_new` at the end of a run: when the write still fails (the folder turned read-only,
    the disk filled, the name was taken meanwhile) the data goes to the state folder and
    WriteFailed (exit 1) names both places. Never loses a finished run."""
    try:
        return write_new(path, data, flag=flag, overwrite=overwrite, mode=mode)
    except (OSError, InputError) as error:
        why = error.message if isinstance(error, InputError) else (error.strerror or str(error))
        kept = keep_results(Path(path).name or "output", data)
        raise WriteFailed(
            f"{flag} {str(path)!r}: cannot write it ({why.rstrip('.')}); the results are kept "
            f"in {kept}.",
            hint=f"copy them from there: cp {kept} FILE",
        ) from None


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
