"""Files shipped inside the kimictl package (profiles, data), found the way Python finds package
data: the same from a wheel, a pipx venv, an sdist build or an editable checkout."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["package_path"]


def package_path(*parts: str) -> Path:
    """The path of a file or folder shipped in the kimictl package (kimictl is installed as
    plain files, never zipped, so the resource is a real path)."""
    return Path(str(files("kimictl").joinpath(*parts)))
