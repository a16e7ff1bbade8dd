"""`kimictl demo`: bad input, the planned pair, and the whole job on real CPU servers (slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.runtime.serving import runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run records in a private state folder, so only this test's runs are seen."""
    folder = tmp_path / "state"
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(folder))
    return folder


def _cpu_runtime_or_skip() -> None:
    from kimictl.runtime.serving import cpu_runtime

    if not cpu_runtime.is_installed():
        pytest.skip("kimictl's CPU vLLM runtime is missing: run `kimictl setup cpu-runtime`")


# ---------------------------------------------------------------- bad input (no server)


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_out_that_exists_is_refused_untouched(
    kind: str, tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "taken"
    if kind == "file":
        out.write_text("keep me\n")
    else:
        out.mkdir()
        (out / "mine.txt").write_text("keep me\n")
    code = main(["demo", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[0] == (
        f"error: --out {out} already exists (a {kind}); the demo never overwrites: give a new "
        "folder name, or leave --out out for a fresh one."
    )
    assert "Traceback" not in err
    kept = out if kind == "file" else out / "mine.txt"
    assert kept.read_text() == "keep me\n"
    assert not (state / "runs").exists() or not any((state / "runs").iterdir())


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["--sessions", "0"], "error: --sessions 0 must be >= 1."),
        (["--num-prompts", "1"], "error: --num-prompts 1 must be >= 2."),
        (["--warmup", "-1"], "error: --warmup -1 must be >= 0."),
        (["--port", "65535"], "error: --port 65535 is not a TCP port pair; allowed: 1-65534."),
    ],
)
def test_bad_sizes_exit_2_with_one_sentence(
    args: list[str], sentence: str, tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["demo", "--out", str(tmp_path / "new"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[0] == sentence
    assert not (tmp_path / "new").exists()


def test_out_under_a_file_is_refused(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["demo", "--out", str(blocker / "sub" / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[0] == (
        f"error: --out {blocker / 'sub' / 'out'}: cannot create it ({blocker} is not a writable "
        "folder)."
    )


def test_default_out_is_new_and_under_the_base(tmp_path: Path) -> None:
    from kimictl.runtime.demo import default_out_dir

    first = default_out_dir(tmp_path)
    assert first.parent == tmp_path and first.name.startswith("kimictl-demo-")
    first.mkdir()
    second = default_out_dir(tmp_path)  # same second: a suffix, never the existing folder
    assert second != first and not second.exists()


# ---------------------------------------------------------------- the planned pair (no server)


def test_plan_twin_differs_only_in_max_num_seqs_and_port(tmp_path: Path, state: Path) -> None:
    _cpu_runtime_or_skip()
    from kimictl.runtime.demo import TWIN_MAX_NUM_SEQS, DemoRequest, prepare_demo
    from kimictl.runtime.serving import launcher

    plan = prepare_demo(DemoRequest(out=tmp_path / "out"))
    a, b = plan.prepared.plans
    assert b.port == a.port + 1
    for p in (a, b):  # chosen free (the profile's 8100/8101 may be taken on a shared box)
        launcher.check_port_free(p.host, p.port)

    def flags(argv: list[str]) -> dict[str, str]:
        pairs = zip(argv[2:], [*argv[3:], ""], strict=True)
        return {k: v for k, v in pairs if k.startswith("--")}

    fa, fb = flags(a.argv), flags(b.argv)
    assert fb["--max-num-seqs"] == str(TWIN_MAX_NUM_SEQS) != fa["--max-num-seqs"]
    assert {k for k in fa if fa[k] != fb.get(k)} == {"--max-num-seqs", "--port"}
    assert (a.role, b.role) == ("tuned", "stock") and a.ab_group == b.ab_group is not None
    assert plan.difference[plan.names[1]] == TWIN_MAX_NUM_SEQS
    assert any("no specialized K3 decode path" in n for n in plan.notes)
    assert not (tmp_path / "out").exists()  # planning writes nothing


# ---------------------------------------------------------------- the whole job (real servers)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_demo_end_to_end_stops_everything(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _cpu_runtime_or_skip()
    out = tmp_path / "demo-out"
    args = ["demo", "--sessions", "2", "--num-prompts", "4", "--warmup", "0", "--out", str(out)]
    code = main([*args, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    doc = json.loads(captured.out)

    saved = json.loads((out / "demo.json").read_text())
    expected = {"kimictl_demo", "a", "b", "difference", "notes", "workload", "interrupted"}
    expected |= {"kept_running", "wall_s", "ready_s", "runs", "bench", "plots", "plots_error"}
    expected |= {"takeaway"}
    assert expected <= set(saved) and expected <= set(doc)
    assert saved["interrupted"] is False and saved["kept_running"] is False
    assert saved["difference"]["setting"] == "max_num_seqs"

    names = [saved["a"]["name"], saved["b"]["name"]]
    bench = saved["bench"]
    assert bench["stop_reason"] is None
    assert [r["kimictl"]["target"] for r in bench["runs"]] == names
    for run in bench["runs"]:  # vllm-bench-compatible keys, real measurements
        assert run["completed"] >= 4 and run["failed"] == 0
        assert run["output_throughput"] > 0 and run["mean_tpot_ms"] > 0
    headline = [r for r in bench["ab"] if r["metric"] == "interactivity p50 tok/s/user"]
    assert len(headline) == 1
    row = headline[0]
    assert row["verdict"] in ("faster", "slower", "no significant difference")
    assert row["ratio"] == pytest.approx(row[names[0]] / row[names[1]])
    assert [r["metric"] for r in saved["takeaway"]] == [
        "output tokens/s",
        "interactivity p50 tok/s/user",
        "TTFT mean ms",
    ]

    plots = sorted(Path(p).name for p in saved["plots"])
    assert plots == ["latency_cdf.png", "pareto.png", "throughput_time.png"]
    for name in plots:
        assert (out / "plots" / name).read_bytes()[:8] == PNG_MAGIC

    assert runs.list_runs() == []  # nothing live is left
    finished = runs.list_runs(include_finished=True)
    assert sorted(r.id for r in finished) == sorted(r["id"] for r in saved["runs"])
    for record in finished:
        assert record.state is runs.RunState.STOPPED
        # zombies reparented to PID 1 are not live: the product's own (zombie-aware) check
        assert not runs.is_alive(record)
    twin = next(r for r in finished if r.role == "stock")
    assert "--max-num-seqs" in twin.argv_redacted
    assert twin.argv_redacted[twin.argv_redacted.index("--max-num-seqs") + 1] == "1"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_demo_keep_leaves_both_servers_serving_until_stopped(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import httpx

    _cpu_runtime_or_skip()
    out = tmp_path / "kept"
    args = ["demo", "--keep", "--sessions", "2", "--num-prompts", "4", "--warmup", "0"]
    try:
        code = main([*args, "--out", str(out), "--json"])
        captured = capsys.readouterr()
        assert code == 0, captured.err[-3000:]
        saved = json.loads((out / "demo.json").read_text())
        assert saved["kept_running"] is True and saved["interrupted"] is False
        live = runs.list_runs()
        assert sorted(r.id for r in live) == sorted(r["id"] for r in saved["runs"])
        for record in live:  # still serving after the demo returned: real HTTP
            reply = httpx.get(f"{record.url}/v1/models", timeout=30)
            assert reply.status_code == 200
            assert [m["id"] for m in reply.json()["data"]] == [record.model]
        assert main(["stop", "--all", "--json"]) == 0
        capsys.readouterr()
        assert runs.list_runs() == []
        for record in runs.list_runs(include_finished=True):
            assert record.state is runs.RunState.STOPPED and not runs.is_alive(record)
    finally:  # never leave servers behind, whatever failed above
        if runs.list_runs():
            main(["stop", "--all", "--grace", "2"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_during_start_up_stops_both_servers(tmp_path: Path, state: Path) -> None:
    _cpu_runtime_or_skip()
    out = tmp_path / "never"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kimictl.cli", "demo", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "KIMICTL_STATE_DIR": str(state)},
    )
    deadline = time.monotonic() + 120
    while len(runs.list_runs()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    started = runs.list_runs()
    assert len(started) == 2, proc.stderr.read().decode() if proc.poll() is not None else ""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "interrupted: both servers stopped" in err.decode()
    assert runs.list_runs() == []
    for record in started:
        # zombies reparented to PID 1 are not live: the product's own (zombie-aware) check
        assert not runs.is_alive(record)
    assert not out.exists()  # nothing measured, nothing written
