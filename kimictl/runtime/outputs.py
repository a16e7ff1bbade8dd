"""Files kimictl writes at the user's request (--save-snapshot, --write, --plot): one check that
nothing the user has is replaced silently, run before any long work."""

from __future__ import annotations

from pathlib import Path

from kimictl.runtime.errors import InputError

__all__ = ["check_new_file"]


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
