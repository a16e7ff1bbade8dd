"""`kimictl validate` end to end: bad input (exit 2, one sentence), unreachable endpoints (exit 1),
and on real vLLM CPU servers: an identically built twin passes every check, a twin with its last
decoder layer scaled by 1+1e-2 fails greedy and long-context (exit 1). The 5-run version of the
last two is lab/bench/validate_false_alarms.py (results in docs/results.md)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from kimictl.cli import main

PROFILES = Path(__file__).resolve().parent.parent / "profiles"


@pytest.fixture(autouse=True)
def _private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no run records: the default A/B pair lookup finds nothing
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["validate", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (
            [
                "--checks",
                "greedy,bogus",
                "--candidate",
                "http://127.0.0.1:9",
                "--reference",
                "http://127.0.0.1:9",
            ],
            "unknown check 'bogus'; allowed: greedy, long_context, sampling, structured, "
            "full_context",
        ),
        (
            [
                "--checks",
                ",",
                "--candidate",
                "http://127.0.0.1:9",
                "--reference",
                "http://127.0.0.1:9",
            ],
            "names no check",
        ),
        (["--candidate", "http://127.0.0.1:9"], "--reference is missing"),
        (["--reference", "http://127.0.0.1:9"], "--candidate is missing"),
        ([], "no live A/B pair launched by kimictl"),
        (
            [
                "--threshold",
                "nonsense=1",
                "--candidate",
                "http://127.0.0.1:9",
                "--reference",
                "http://127.0.0.1:9",
            ],
            "expected NAME=VALUE with NAME one of",
        ),
        (
            [
                "--threshold",
                "lc_max_abs_dlogprob=abc",
                "--candidate",
                "http://127.0.0.1:9",
                "--reference",
                "http://127.0.0.1:9",
            ],
            "'abc' is not a number",
        ),
        (["--candidate", "ftp://x", "--reference", "http://127.0.0.1:9"], "is not a target"),
        (["--candidate", "no-such-run", "--reference", "http://127.0.0.1:9"], "no-such-run"),
        (
            [
                "--gate",
                "no-such-profile",
                "--candidate",
                "http://127.0.0.1:9",
                "--reference",
                "http://127.0.0.1:9",
            ],
            "no-such-profile",
        ),
    ],
)
def test_bad_input_exits_2_with_one_sentence(
    args: list[str], sentence: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(args, capsys)
    assert code == 2
    assert sentence in err
    assert err.startswith("error: ")
    assert "Traceback" not in err and out == ""


def test_unreachable_endpoint_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    # port 9 (discard) on loopback: nothing listens there
    code, out, err = _run(
        ["--candidate", "http://127.0.0.1:9", "--reference", "http://127.0.0.1:9", "--json"], capsys
    )
    assert code == 1
    assert "cannot reach http://127.0.0.1:9/v1/models" in err
    assert out == ""


def _report(out: str) -> dict[str, dict[str, object]]:
    doc = json.loads(out)
    return {c["name"]: c for c in doc["checks"]}


@pytest.mark.slow
@pytest.mark.timeout(1500)  # 3 servers (the shared one, 2 twins): 3-5 min a start at load 40
def test_identical_twin_passes_and_perturbed_twin_fails(
    cpu_server: object,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    from conftest import start_cpu_server, stop_cpu_server

    reference = cpu_server.url  # type: ignore[attr-defined]
    profile = tmp_path / "cpu-demo.toml"
    shutil.copy(PROFILES / "cpu-demo.toml", profile)
    # vLLM binds zmq sockets under the run folder's tmp/: keep it under 107 characters
    runs = Path(tempfile.mkdtemp(prefix="kv-"))
    request.addfinalizer(lambda: shutil.rmtree(runs, ignore_errors=True))

    # the twin serves cpu-demo's 768 tokens against the 2048-token reference: one server shows
    # that identical weights pass AND that every check fits a shorter candidate context
    twin = start_cpu_server(runs / "twin", max_model_len=768)
    try:
        code, out, err = _run(
            [
                "--candidate",
                twin.url,
                "--reference",
                reference,
                "--quick",
                "--json",
                "--gate",
                str(profile),
            ],
            capsys,
        )
    finally:
        stop_cpu_server(twin)
    checks = _report(out)
    assert code == 0, err
    assert list(checks) == ["greedy", "long_context", "sampling", "structured", "full_context"]
    assert all(c["status"] == "pass" for c in checks.values()), checks
    greedy = checks["greedy"]["metrics"]
    assert greedy["token_agreement"] == 1.0  # type: ignore[index]
    _assert_fits_the_candidate_context(json.loads(out), 768)
    text = profile.read_text()
    assert 'validation = "pass"' in text and "validated_at" in text
    assert "cpu-demo: the embedded default" in text  # the profile's comments survive

    wrong = start_cpu_server(runs / "perturbed", perturb="scale:1e-2")
    try:
        code, out, err = _run(
            [
                "--candidate",
                wrong.url,
                "--reference",
                reference,
                "--quick",
                "--json",
                "--checks",
                "greedy,long_context",
            ],
            capsys,
        )
    finally:
        stop_cpu_server(wrong)
    checks = _report(out)
    assert code == 1
    assert "validation failed: greedy, long_context" in err
    assert checks["greedy"]["status"] == "fail" and checks["long_context"]["status"] == "fail"
    assert checks["long_context"]["metrics"]["max_abs_dlogprob"] > 0.02  # type: ignore[index]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_checks_fit_a_short_context_or_skip_with_the_reason(
    cpu_server: object,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    """A candidate serving 256 tokens against the 2048-token shared server (768, cpu-demo's own,
    is the twin above): every check runs at the shorter context or says why it cannot; the
    answer is a verdict (exit 0 or 1), never a crash (exit 3)."""
    from conftest import start_cpu_server, stop_cpu_server

    max_model_len = 256
    runs = Path(tempfile.mkdtemp(prefix="kv-"))
    request.addfinalizer(lambda: shutil.rmtree(runs, ignore_errors=True))
    short = start_cpu_server(runs / "short", max_model_len=max_model_len)
    try:
        code, out, err = _run(
            [
                "--candidate",
                short.url,
                "--reference",
                cpu_server.url,  # type: ignore[attr-defined]
                "--quick",
                "--json",
            ],
            capsys,
        )
    finally:
        stop_cpu_server(short)
    assert code == 0, err
    _assert_fits_the_candidate_context(json.loads(out), max_model_len)


def _assert_fits_the_candidate_context(doc: dict, max_model_len: int) -> None:
    assert doc["candidate"]["max_model_len"] == max_model_len
    checks = {c["name"]: c for c in doc["checks"]}
    assert all(c["status"] in ("pass", "skip") for c in checks.values()), checks
    long_ctx = checks["long_context"]
    assert long_ctx["status"] == "pass"
    assert max(long_ctx["metrics"]["lengths"]) <= max_model_len
    # MRCR prompts need a few hundred tokens: at 256 and at 25% of 768 they are left out, by name
    skipped = long_ctx["metrics"]["retrieval_skipped"]
    assert any(s.startswith("mrcr at ") for s in skipped), skipped
    assert all(" tokens (needs " in s for s in skipped), skipped
    assert checks["full_context"]["metrics"]  # ran at the candidate's full context
