"""How a failed child process is reported: its exception line and its log, never a slice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kimictl.core.errors import child_failure


def test_child_failure_names_the_exception_of_a_real_traceback(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    script = "import json\nprint('working...')\nimport no_such_module_for_kimictl\n"
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-I", "-c", script], stdout=out, stderr=subprocess.STDOUT, check=False
        )
    assert done.returncode == 1
    line = child_failure(log)
    assert line == "ModuleNotFoundError: No module named 'no_such_module_for_kimictl'"


def test_child_failure_without_a_traceback_gives_the_last_line(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("step 1\nstep 2: disk full\n\n")
    assert child_failure(log) == "step 2: disk full"
    (tmp_path / "empty.log").write_text("")
    assert child_failure(tmp_path / "empty.log") == "(it printed nothing)"
    assert "cannot be read" in child_failure(tmp_path / "missing.log")
