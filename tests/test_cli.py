"""The root command: every bad command line ends in one `error:` sentence on stderr and exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _kimictl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kimictl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


# (argv, the sentence's text, the command whose help the hint names, None: no hint).
# `--dry-run` keeps serve from launching anything should the parser ever accept the line.
BAD_LINES = [
    (
        ["serve", "cpu-demo", "--dry-run", "--port", "abc"],
        "error: '--port' got 'abc': input should be a valid integer",
        "kimictl serve -h",
    ),
    (
        ["serve", "cpu-demo", "--dry-run", "--bogus"],
        "error: no such option: --bogus",
        "kimictl serve -h",
    ),
    (
        ["serve", "cpu-demo", "--dry-run", "--timeout", "-1"],
        "error: --timeout -1 must be more than 0 seconds",
        None,
    ),
    (
        ["serve", "cpu-demo", "--dry-run", "--timeout", "0"],
        "error: --timeout 0 must be more than 0 seconds",
        None,
    ),
    (["stop", "--all", "--grace", "-1"], "error: --grace -1 must be 0 or more seconds", None),
    (["stop", "--all", "--grace", "nan"], "error: --grace nan must be 0 or more seconds", None),
    (["frobnicate"], "error: no such command 'frobnicate'", "kimictl -h"),
    (["profiles", "frobnicate"], "error: no such command 'frobnicate'", "kimictl profiles -h"),
    (["profiles", "show"], "error: missing argument 'NAME|FILE'", "kimictl profiles show -h"),
]


@pytest.mark.parametrize(("argv", "sentence", "help_page"), BAD_LINES, ids=lambda v: str(v))
def test_bad_command_line_is_one_error_line(argv: list[str], sentence: str, help_page: str) -> None:
    done = _kimictl(*argv)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(sentence), done.stderr
    if help_page is None:  # a value the parser takes but the command refuses: one sentence
        assert lines[1:] == [], done.stderr
    else:
        assert lines[1:] == [f"hint: '{help_page}' lists the commands and options"], done.stderr
    assert "Usage:" not in done.stderr and "Error:" not in done.stderr
    assert done.stdout == ""


def _command_lines() -> list[list[str]]:
    from kimictl.cli import COMMANDS

    lines = [[name] for name in COMMANDS]
    return [*lines, ["profiles", "show"], ["kernels", "verify"]]


@pytest.mark.parametrize("argv", _command_lines(), ids=" ".join)
def test_help_shows_no_type_on_plain_switches(argv: list[str]) -> None:
    """A switch (--json, --all, --help) takes no value; `<bool>` beside it reads as if it did."""
    done = _kimictl(*argv, "--help")
    assert done.returncode == 0, done.stderr
    assert "<bool>" not in done.stdout, done.stdout
    assert "--help" in done.stdout


@pytest.mark.parametrize(
    ("command", "text"),
    [
        ("serve", "the profile's [metrics] traces"),
        ("bench", "servers sending there: [metrics] traces"),
        ("monitor", "with a profile's [metrics] traces"),
        ("validate", "this profile's [provenance]"),
    ],
)
def test_help_keeps_profile_table_names(command: str, text: str) -> None:
    """`[metrics]` in a help text is a profile table, not Rich markup to swallow."""
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "kimictl", command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 0
    flat = " ".join(done.stdout.replace("│", " ").split())
    assert text in flat, flat[:2000]
