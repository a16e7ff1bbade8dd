"""Snapshots: a HardwareReport saved as JSON on one node and loaded (merged) anywhere."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from kimictl.core.errors import InputError
from kimictl.core.jsondoc import dumps
from kimictl.core.outputs import write_new
from kimictl.runtime.checks.hardware._types import HardwareReport, Source

__all__ = [
    "check_snapshot_target",
    "load_snapshot",
    "load_snapshots",
    "merge",
    "save_snapshot",
]


def check_snapshot_target(path: str | Path, *, overwrite: bool = False) -> Path:
    """Refuse a --save-snapshot target that is a folder, or an existing file without overwrite
    (missing folders are made when it is written)."""
    from kimictl.core.outputs import check_new_file

    return check_new_file(
        path, flag="--save-snapshot", overwrite=overwrite, folder_must_exist=False
    )


def save_snapshot(report: HardwareReport, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write atomically (temp file + rename). A live report is stored as "recorded"."""
    target = check_snapshot_target(path, overwrite=overwrite)
    source: Source = "recorded" if report.source == "live" else report.source
    text = dumps(report.with_source(source).to_json())
    try:
        return write_new(
            target, text, flag="--save-snapshot", overwrite=overwrite, mode=0o600, make_folder=True
        )
    except OSError as error:
        blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is a file, not a folder" if blocker else error.strerror or str(error)
        raise InputError(f"--save-snapshot {target}: cannot write there ({reason}).") from None


def load_snapshot(path: str | Path) -> HardwareReport:
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"snapshot {p}: no such file") from None
    except OSError as error:
        raise InputError(f"snapshot {p}: cannot read it ({error.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(
            f"snapshot {p}: not JSON (not UTF-8 text)",
            hint="pass a file written by `kimictl doctor --save-snapshot`",
        ) from None
    except json.JSONDecodeError as error:
        raise InputError(
            f"snapshot {p}: not JSON (line {error.lineno}: {error.msg})",
            hint="pass a file written by `kimictl doctor --save-snapshot`",
        ) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
        raise InputError(
            f"snapshot {p}: missing the 'nodes' list",
            hint="pass a file written by `kimictl doctor --save-snapshot`",
        )
    try:
        report = HardwareReport.from_json(raw)
    except KeyError as error:
        raise InputError(f"snapshot {p}: malformed (missing the key {error})") from None
    except (TypeError, ValueError, IndexError) as error:
        raise InputError(f"snapshot {p}: malformed ({type(error).__name__}: {error})") from None
    if not report.nodes:  # nothing recorded must not read as a healthy cluster
        raise InputError(
            f"snapshot {p}: the 'nodes' list is empty",
            hint="pass a file written by `kimictl doctor --save-snapshot` on a node",
        )
    return report if report.source == "simulated" else report.with_source("recorded")


def merge(reports: Iterable[HardwareReport]) -> HardwareReport:
    """All nodes of all reports as one TP group; simulated if any part is simulated."""
    items = list(reports)
    nodes = [node for r in items for node in r.nodes]
    source: Source = "simulated" if any(r.source == "simulated" for r in items) else "recorded"
    if items and all(r.source == "live" for r in items):
        source = "live"
    return HardwareReport(nodes=nodes, source=source)


def load_snapshots(paths: Iterable[str | Path]) -> HardwareReport:
    """Load one or more snapshot files (one per node) and merge them. Bad files raise InputError."""
    items = [load_snapshot(p) for p in paths]
    if not items:
        raise InputError("no snapshot file given")
    return merge(items)
