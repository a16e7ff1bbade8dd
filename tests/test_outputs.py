"""The one new-file rule (core.outputs): every file a user names is checked before any work
(writable folder, not there unless --force), written by one writer that never replaces it, and a
finished run whose write still fails is kept in the state folder (exit 1, never a traceback)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_bench import _bench_proc, _wait_for_finished_requests, emitter_proc  # noqa: F401

from kimictl.cli import main
from kimictl.core.errors import InputError, WriteFailed
from kimictl.core.outputs import check_new_file, check_new_folder, save_or_keep, write_new

READ_ONLY = Path("/proc/sys/kernel")  # a read-only mount in containers, even for root
KIMICTL = Path(__file__).parent.parent / "kimictl"


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(folder))
    return folder


# ---------------------------------------------------------------- the helper


def test_check_refuses_what_cannot_or_must_not_be_written(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text("keep")
    with pytest.raises(InputError, match="already exists; kimictl does not overwrite it"):
        check_new_file(mine, flag="-o")
    assert check_new_file(mine, flag="-o", overwrite=True) == mine
    with pytest.raises(InputError, match="folder '.*nope' does not exist"):
        check_new_file(tmp_path / "nope" / "r.json", flag="-o")
    with pytest.raises(InputError, match="is a folder; name a new file"):
        check_new_file(tmp_path, flag="-o")
    with pytest.raises(InputError, match="mine.json' is a file, not a folder"):
        check_new_file(mine / "x.json", flag="-o", folder_must_exist=False)
    if os.access(READ_ONLY, os.W_OK):
        pytest.skip(f"{READ_ONLY} is writable here")
    with pytest.raises(InputError, match="is not writable"):
        check_new_file(READ_ONLY / "r.json", flag="-o")
    with pytest.raises(InputError, match="is not writable"):
        check_new_folder(READ_ONLY / "plots", flag="--plot", names=("a.png",))
    assert mine.read_text() == "keep"


def test_check_new_folder(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(InputError, match="already exists; kimictl writes into a new folder only"):
        check_new_folder(tmp_path / "run", flag="--out")
    (tmp_path / "run" / "a.png").write_text("mine")
    with pytest.raises(InputError, match="already holds a.png"):
        check_new_folder(tmp_path / "run", flag="--plot", names=("a.png", "b.png"))
    assert check_new_folder(tmp_path / "run", flag="--plot", names=("b.png",)) == tmp_path / "run"
    assert check_new_folder(tmp_path / "new" / "deeper", flag="--out").parent.name == "new"


def test_write_new_never_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    assert write_new(target, "one", flag="-o") == target
    with pytest.raises(InputError, match="already exists"):
        write_new(target, "two", flag="-o")
    assert target.read_text() == "one"
    write_new(target, b"three", flag="-o", overwrite=True)
    assert target.read_text() == "three"
    assert write_new(tmp_path / "k", "s", flag="-o", mode=0o600).stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "r.json"]


def test_a_failed_final_write_is_kept_in_the_state_folder(tmp_path: Path, state: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    check_new_file(gone / "r.json", flag="-o")  # fine before the run ...
    gone.rmdir()  # ... and gone at its end
    with pytest.raises(WriteFailed) as lost:
        save_or_keep(gone / "r.json", b'{"runs": []}', flag="-o")
    assert lost.value.exit_code == 1
    (kept,) = (state / "kept").iterdir()
    assert kept.name.endswith("-r.json") and kept.read_bytes() == b'{"runs": []}'
    assert str(kept) in lost.value.message and "No such file or directory" in lost.value.message


def test_one_writer_pinned() -> None:
    """The rule exists once: no module but core/outputs.py opens files with O_EXCL or says it
    does not overwrite; the five former implementations are gone."""
    offenders = []
    for path in KIMICTL.rglob("*.py"):
        if path == KIMICTL / "core" / "outputs.py":
            continue
        text = path.read_text()
        if "O_EXCL" in text or "does not overwrite" in text or "never overwrites" in text:
            offenders.append(str(path))
        tree = ast.parse(text)
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        offenders += [f"{path}:{n}" for n in names & {"write_private", "_check_out"}]
    assert offenders == []


# ---------------------------------------------------------------- every command, before any work


def _closed_url() -> str:
    from conftest import free_port

    return f"http://127.0.0.1:{free_port()}"  # nothing listens: any request would fail (exit 1)


@pytest.mark.parametrize(
    ("args", "taken", "needle"),
    [
        (["-o", "{d}/r.json"], "r.json", "error: --output '{d}/r.json' already exists"),
        (["--csv", "{d}/r.csv"], "r.csv", "error: --csv '{d}/r.csv' already exists"),
        (["--plot", "{d}"], "pareto.png", "error: --plot '{d}' already holds pareto.png"),
        (["--save-result", "{d}/v.json"], "v.json", "error: --save-result '{d}/v.json' already"),
        (["-o", "{d}/x/r.json"], None, "error: --output '{d}/x/r.json': folder '{d}/x' does not"),
        (["-o", "{d}/a.json", "--csv", "{d}/a.json"], None, "error: --output and --csv both"),
    ],
)
def test_bench_checks_every_output_before_sending_anything(
    args: list[str],
    taken: str | None,
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if taken:
        (tmp_path / taken).write_text("mine")
    argv = [a.replace("{d}", str(tmp_path)) for a in args]
    code = main(["bench", "--target", _closed_url(), "--num-prompts", "2", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(needle.replace("{d}", str(tmp_path))), err
    assert "Traceback" not in err and "kimictl bug" not in err
    if taken:
        assert (tmp_path / taken).read_text() == "mine"


def test_bench_into_a_read_only_mount_is_refused_before_the_run(tmp_path: Path) -> None:
    """The issue's case: -o into a read-only file system. A real one, mounted in a private mount
    namespace; the target is closed, so a check after the run's start would exit 1, not 2."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    folder = tmp_path / "ro"
    folder.mkdir()
    script = (
        f"mount -t tmpfs -o ro,size=64k tmpfs {folder} || exit 77; "
        f"exec {sys.executable} -m kimictl bench --target {_closed_url()} -o {folder}/r.json"
    )
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True)
    if done.returncode == 77 or "Operation not permitted" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a new mount namespace here: {done.stderr[-200:]}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        f"error: --output '{folder}/r.json': folder '{folder}' is not writable"
    ), done.stderr


def test_validate_save_responses_never_replaces(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    mine = tmp_path / "responses.json"
    mine.write_text("mine")
    url = _closed_url()
    code = main(["validate", "--candidate", url, "--reference", url, "--save-responses", str(mine)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: --save-responses '{mine}' already exists"), err
    assert mine.read_text() == "mine"


def test_render_output_never_replaces(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    mine = tmp_path / "job.sbatch"
    mine.write_text("mine")
    code = main(["serve", "cpu-demo", "--render", "slurm", "--output", str(mine)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: --output '{mine}' already exists"), err
    assert mine.read_text() == "mine"


# ---------------------------------------------------------------- a finished run is never lost


def test_bench_whose_folder_vanished_keeps_the_report_and_exits_1(
    emitter_proc,  # noqa: F811
    tmp_path: Path,
    state: Path,
) -> None:
    """The folder is fine when bench starts and gone when it ends: the table is still printed,
    the report and the CSV are kept in the state folder (paths printed), exit 1, no traceback."""
    proc, url = emitter_proc
    out = tmp_path / "out"
    out.mkdir()
    bench = _bench_proc(url, out)  # inherits KIMICTL_STATE_DIR
    _wait_for_finished_requests(proc, 2)
    shutil.rmtree(out)
    bench.send_signal(signal.SIGINT)  # ends the run with the finished requests
    stdout, err = bench.communicate(timeout=60)
    assert bench.returncode == 1, err
    assert "kimictl bug" not in err and "Traceback" not in err
    kept = {p.name.split("-", 2)[2]: p for p in (state / "kept").iterdir()}
    assert set(kept) == {"r.json", "r.csv"}
    assert f"error: --output '{out}/r.json': cannot write it" in err.replace("\n", "")
    assert str(kept["r.json"]) in err.replace("\n", "")
    doc = json.loads(kept["r.json"].read_text())
    assert doc["runs"][0]["completed"] >= 1
    assert "interactivity" in stdout  # the table was printed
