"""`kimictl --help` and `kimictl <cmd> --help` must stay light: no torch, vllm, cutlass, pynvml or
textual in sys.modules. Each case runs in a fresh interpreter (subprocess)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kimictl.cli import COMMANDS

HEAVY = ("torch", "vllm", "cutlass", "pynvml", "textual")

_PROBE = f"""
import json, sys
from kimictl.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r})
print("@@" + json.dumps({{"code": code, "heavy": heavy}}))
"""


def _run(argv: list[str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    marker = [line for line in done.stdout.splitlines() if line.startswith("@@")]
    assert marker, f"no result from kimictl {' '.join(argv)}: {done.stderr[-2000:]}"
    result: dict[str, object] = json.loads(marker[-1][2:])
    result["stderr"] = done.stderr
    result["stdout"] = done.stdout
    return result


def test_root_help_imports_nothing_heavy() -> None:
    result = _run(["--help"])
    assert result["code"] == 0, result["stderr"]
    assert result["heavy"] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_help_imports_nothing_heavy(name: str) -> None:
    result = _run([name, "--help"])
    assert result["code"] == 0, result["stderr"]
    assert "Usage:" in str(result["stdout"]), result["stderr"]
    assert result["heavy"] == [], f"kimictl {name} --help imported {result['heavy']}"


def test_every_command_module_exists() -> None:
    missing = [m for m, _, _ in COMMANDS.values() if importlib.util.find_spec(m) is None]
    assert missing == []


def test_no_module_carries_a_standard_library_name() -> None:
    """A script run from a kimictl folder puts that folder first on sys.path: a module there named
    like the stdlib (once `secrets.py`) shadows it for every library the script imports."""
    root = Path(__file__).resolve().parent.parent / "kimictl"
    clashes = sorted(
        str(path.relative_to(root.parent))
        for path in root.rglob("*")
        if (path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()))
        and path.stem in sys.stdlib_module_names
    )
    assert clashes == []
