"""README and docs examples are the tool's real output: `scripts/examples --check` re-runs every
marked example and fails when a block differs from what the command prints now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_marked_examples_match_a_fresh_run() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "examples"), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    readme = (ROOT / "README.md").read_text()
    assert "<!-- example: kimictl doctor" in readme  # the doctor example is one of them
    assert "Fast path: NOT READY (5 blocking)" in readme
