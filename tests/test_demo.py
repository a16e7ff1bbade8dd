"""`kimictl demo`: bad input, the planned pair, and the whole job on real CPU servers (slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kimictl.cli import main
from kimictl.runtime.serving import runs

if TYPE_CHECKING:
    from kimictl.runtime.demo.tune import Measured

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
        f"error: --out '{out}' is a file; name a folder."
        if kind == "file"
        else f"error: --out '{out}' already exists; kimictl writes into a new folder only."
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
        (["--tune-prompts", "1"], "error: --tune-prompts 1 must be >= 2."),
        (
            ["--port", "65533"],
            "error: --port 65533 leaves no room for 4 servers (PORT..PORT+3); allowed: 1-65531.",
        ),
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
        f"error: --out '{blocker / 'sub' / 'out'}': '{blocker}' is a file, not a folder."
    )


def test_default_out_is_new_and_under_the_base(tmp_path: Path) -> None:
    from kimictl.runtime.demo.run import default_out_dir

    first = default_out_dir(tmp_path)
    assert first.parent == tmp_path and first.name.startswith("kimictl-demo-")
    first.mkdir()
    second = default_out_dir(tmp_path)  # same second: a suffix, never the existing folder
    assert second != first and not second.exists()


# ---------------------------------------------------------------- the choice rule (pure)


def _m(name: str, p10: float | None, tput: float, **kw: object) -> Measured:
    from kimictl.runtime.demo.tune import Measured

    fields: dict[str, object] = {
        "completed": 16,
        "failed": 0,
        "interactivity_p10": p10,
        "interactivity_p50": None if p10 is None else p10 * 1.5,
        "ttft_mean_ms": 300.0,
        "ttft_p99_ms": 900.0,
        "output_throughput": tput,
    }
    # the bench's A/B agrees with the point estimate unless a test says otherwise
    beside = kw.get("baseline_p10") or 10.0
    fields["p10_faster"] = name != "vllm-defaults" and p10 is not None and p10 > beside  # type: ignore[operator]
    fields.update(kw)
    return Measured(name=name, **fields)  # type: ignore[arg-type]


def test_choice_highest_throughput_among_those_meeting_the_slo() -> None:
    from kimictl.runtime.demo.tune import DEFAULTS, SLO_MARGIN, choose

    measured = [
        _m(DEFAULTS, 10.0, 50.0),
        _m("fast-but-narrow", 30.0, 20.0),
        _m("fast-and-wide", 13.0, 35.0),  # meets 1.2 x 10 = 12 with more throughput
        _m("wide-but-slow", 11.0, 60.0),  # most throughput, misses the SLO
    ]
    choice = choose(measured)
    assert choice.threshold == pytest.approx(SLO_MARGIN * 10.0)
    assert choice.chosen == "fast-and-wide"
    assert choice.met == {
        DEFAULTS: False,
        "fast-but-narrow": True,
        "fast-and-wide": True,
        "wide-but-slow": False,
    }
    assert choice.slo_text == "interactivity_p10>=12.0"
    assert "highest output throughput of the 2" in choice.reason
    assert choice.to_json()["beats_defaults"] is True


def test_choice_best_slow_tail_when_none_meets_the_slo() -> None:
    from kimictl.runtime.demo.tune import DEFAULTS, choose

    choice = choose([_m(DEFAULTS, 10.0, 50.0), _m("a", 11.0, 40.0), _m("b", 10.5, 70.0)])
    assert choice.chosen == "a" and not any(choice.met.values())
    assert "no configuration met the SLO" in choice.reason


def test_choice_keeps_the_defaults_when_nothing_beats_them() -> None:
    from kimictl.runtime.demo.tune import DEFAULTS, choose

    choice = choose([_m(DEFAULTS, 10.0, 50.0), _m("a", 9.0, 80.0), _m("b", 4.0, 90.0)])
    assert choice.chosen == DEFAULTS and choice.is_defaults
    assert "kimictl keeps the defaults" in choice.reason
    assert choice.to_json()["beats_defaults"] is False


def test_choice_ignores_failed_and_unmeasured_candidates() -> None:
    from kimictl.runtime.demo.tune import DEFAULTS, choose

    measured = [
        _m(DEFAULTS, 10.0, 50.0),
        _m("had-failures", 40.0, 90.0, failed=2),
        _m("did-not-start", None, 0.0, completed=0, error="did not start: boom"),
        _m("ok", 12.5, 30.0),
    ]
    choice = choose(measured)
    assert choice.chosen == "ok"
    assert choice.met["had-failures"] is False and choice.met["did-not-start"] is False


def test_choice_judges_each_candidate_against_the_defaults_beside_it() -> None:
    """The machine got faster between benches: a candidate that looks 2x faster than the first
    (solo) bench of the defaults but only 1.1x the defaults benched right beside it misses."""
    from kimictl.runtime.demo.tune import DEFAULTS, choose

    measured = [
        _m(DEFAULTS, 10.0, 50.0),
        _m("drifted", 20.0, 90.0, baseline_p10=18.0),
        _m("real", 15.0, 40.0, baseline_p10=11.0),
    ]
    choice = choose(measured)
    assert choice.thresholds == pytest.approx({DEFAULTS: 12.0, "drifted": 21.6, "real": 13.2})
    assert choice.met == {DEFAULTS: False, "drifted": False, "real": True}
    assert choice.chosen == "real" and choice.slo_text == "interactivity_p10>=13.2"
    # none meets: the best gain over the defaults beside it, not the best raw p10
    choice = choose(
        [
            _m(DEFAULTS, 10.0, 50.0),
            *[_m(n, p, 1.0, baseline_p10=b) for n, p, b in (("x", 20.0, 19.0), ("y", 11.5, 10.0))],
        ]
    )
    assert choice.chosen == "y" and "1.15x" in choice.reason


def test_choice_needs_a_measured_baseline() -> None:
    from kimictl.core.errors import EndpointError
    from kimictl.runtime.demo.tune import DEFAULTS, choose

    with pytest.raises(EndpointError, match="no baseline"):
        choose([_m("a", 12.0, 30.0)])
    with pytest.raises(EndpointError, match="no baseline"):
        choose([_m(DEFAULTS, None, 0.0, completed=0), _m("a", 12.0, 30.0)])


def test_defaults_with_a_failed_request_stay_the_baseline() -> None:
    from kimictl.runtime.demo.tune import DEFAULTS, choose

    base = _m(DEFAULTS, 10.0, 20.0, failed=1)
    assert choose([base, _m("a", 12.0, 30.0)]).chosen == "a"
    kept = choose([base, _m("a", 9.0, 30.0, failed=2)])
    assert kept.chosen == DEFAULTS and "keeps the defaults" in kept.reason


def test_adding_a_candidate_moves_the_choice_only_to_it() -> None:
    """What lets the demo keep only the current choice's server: choose(S + [x]) is in
    {choose(S), x} for every order of a mixed set."""
    import itertools

    from kimictl.runtime.demo.tune import DEFAULTS, choose

    others = [_m("a", 11.0, 70.0), _m("b", 13.0, 30.0), _m("c", 25.0, 20.0), _m("d", 9.0, 99.0)]
    for order in itertools.permutations(others):
        seen = [_m(DEFAULTS, 10.0, 50.0)]
        before = choose(seen).chosen
        for x in order:
            seen.append(x)
            after = choose(seen).chosen
            assert after in (before, x.name)
            before = after
        assert before == "b"  # meets 12.0 with more throughput than c


def test_a_candidate_its_own_ab_cannot_tell_from_the_defaults_is_not_crowned() -> None:
    """2.45x on the point estimate, but the tune bench's A/B interval reaches below 1: the
    defaults stay and the reason says "not distinguishable" with the interval."""
    from kimictl.runtime.demo.tune import DEFAULTS, choose

    measured = [
        _m(DEFAULTS, 10.0, 50.0),
        _m("lucky", 24.5, 60.0, baseline_p10=10.0, p10_ratio_ci=(0.93, 4.1), p10_faster=False),
    ]
    choice = choose(measured)
    assert choice.chosen == DEFAULTS and choice.met["lucky"] is False
    assert choice.reason.startswith("not distinguishable: lucky reads 2.45x")
    assert "95% CI 0.93-4.10" in choice.reason
    no_interval = [_m(DEFAULTS, 10.0, 50.0), _m("few", 24.5, 60.0, p10_faster=None)]
    few = choose(no_interval)
    assert few.chosen == DEFAULTS and "too few requests for a p10" in few.reason


def test_a_load_spike_in_one_reading_of_the_defaults_marks_it_unreliable() -> None:
    from kimictl.runtime.demo.tune import DEFAULTS, choose, flag_suspects

    measured = flag_suspects(
        [
            _m(DEFAULTS, 1.1, 5.0),  # the first row: a load spike
            _m("a", 12.0, 50.0, baseline_p10=10.0),
            _m("b", 30.0, 50.0, baseline_p10=3.0),  # its defaults beside it read low too
            _m("c", 9.5, 50.0, baseline_p10=10.5),
        ]
    )
    by = {m.name: m for m in measured}
    assert by[DEFAULTS].suspect and "p10 1.1 here" in by[DEFAULTS].suspect
    assert by["b"].suspect and by["a"].suspect is None and by["c"].suspect is None
    choice = choose(measured)
    assert choice.chosen == "a"  # b's 10x is the spike's, not b's
    assert choice.met["b"] is False


def test_decision_deploys_only_what_the_ab_confirmed() -> None:
    from kimictl.runtime.demo.tune import DEFAULTS, choose, decide

    measured = [_m(DEFAULTS, 10.0, 50.0), _m("x", 13.0, 40.0, p10_ratio_ci=(1.1, 1.5))]
    choice = choose(measured)
    assert choice.chosen == "x"
    head = {
        "metric": "interactivity p10 (slow tail) tok/s/user",
        "role": "primary",
        "ratio": 1.09,
        "ci95": [0.93, 1.75],
        "p": 0.31,
        "better": None,
    }
    kw = {
        "a": "x",
        "describe": {"x": "max_num_seqs 2", DEFAULTS: "vLLM's defaults"},
        "argv": {"x": ["vllm", "serve"], DEFAULTS: ["vllm", "serve"]},
        "profile": "cpu-demo",
        "tune_prompts": 32,
        "num_prompts": 32,
    }
    d = decide(choice, measured, [head], **kw)
    assert d["deploy"] == DEFAULTS and d["confidence"].startswith("not confirmed")
    assert "1.09x" in d["ab"] and "95% CI 0.93-1.75" in d["ab"]
    assert any("--candidates vllm-defaults,x --num-prompts 128" in n for n in d["next"])
    head.update(better="x", ci95=[1.2, 1.6], ratio=1.4, p=0.001)
    d = decide(choice, measured, [head], **kw)
    assert d["deploy"] == "x" and d["config"] == "max_num_seqs 2"
    assert d["confidence"].startswith("high")
    # a control run (the defaults chosen) that finds the same server's turns different
    control = choose([_m(DEFAULTS, 10.0, 50.0), _m("y", 9.0, 40.0)])
    head.update(better=DEFAULTS, ci95=[0.44, 0.75], ratio=0.6, p=0.01)
    d = decide(control, measured, [head], **{**kw, "a": "defaults-control"})
    assert d["deploy"] == DEFAULTS and d["ab"].startswith("control run")
    assert any("less certain than its interval says" in s for s in d["suspect"])
    assert any("--warmup" in n for n in d["next"])


def test_measured_from_a_bench_summary() -> None:
    from kimictl.runtime.demo.tune import measured_from

    summary = {
        "completed": 7,
        "failed": 1,
        "mean_ttft_ms": 120.5,
        "p99_ttft_ms": 400.0,
        "output_throughput": 33.3,
        "spec_decode_acceptance_length": 1.4,
        "kimictl": {"interactivity_tok_s_per_user": {"p10_slow_tail": 8.0, "p50": 20.0}},
    }
    m = measured_from("x", summary)
    assert (m.completed, m.failed, m.interactivity_p10, m.interactivity_p50) == (7, 1, 8.0, 20.0)
    assert (m.ttft_mean_ms, m.output_throughput, m.acceptance_length) == (120.5, 33.3, 1.4)
    assert not m.usable  # a failed request disqualifies it
    assert m.baseline_p10 is None
    beside = {"kimictl": {"interactivity_tok_s_per_user": {"p10_slow_tail": 6.5}}}
    assert measured_from("x", summary, baseline=beside).baseline_p10 == 6.5


def test_measured_from_carries_its_ab_interval_and_a_starved_client() -> None:
    from kimictl.runtime.demo.tune import P10, measured_from

    summary = {
        "completed": 32,
        "failed": 0,
        "output_throughput": 50.0,
        "kimictl": {
            "interactivity_tok_s_per_user": {"p10_slow_tail": 12.0, "p50": 20.0},
            "client_warning": "the bench client was starved of CPU: ...",
        },
    }
    rows = [{"metric": P10, "role": "primary", "ci95": [1.1, 1.6], "better": "x"}]
    m = measured_from("x", summary, ab=rows)
    assert m.p10_ratio_ci == (1.1, 1.6) and m.p10_faster is True and m.distinguishable
    assert m.suspect == "unreliable: machine load (the bench client was starved of CPU: ...)"
    rows[0].update(ci95=None, better=None)
    del summary["kimictl"]["client_warning"]
    m = measured_from("x", summary, ab=rows)
    assert m.p10_ratio_ci is None and m.p10_faster is False and m.suspect is None


def _ab(metric: str, ratio: float, ci: list[float] | None, better: str | None) -> dict[str, object]:
    return {"metric": metric, "ratio": ratio, "ci95": ci, "better": better}


def test_verdict_tells_the_slo_metric_first_and_what_it_costs() -> None:
    from kimictl.runtime.demo.tune import DEFAULTS, verdict

    rows = [
        _ab("interactivity p10 (slow tail) tok/s/user", 2.5, [2.0, 3.1], "x"),
        _ab("interactivity p50 tok/s/user", 1.6, [1.3, 1.9], "x"),
        _ab("output tokens/s", 0.7, None, None),
        _ab("TTFT mean ms", 3.0, [2.2, 4.0], DEFAULTS),
    ]
    text = verdict(rows, chosen="x", defaults=DEFAULTS)
    assert text.startswith("x (kimictl's choice) is faster per user than vLLM's defaults: ")
    assert "2.50x the slow-tail interactivity (p10) (95% CI 2.00-3.10)" in text
    assert "0.70x the output throughput;" in text
    rows[0]["better"] = DEFAULTS
    assert "did not hold up" in verdict(rows, chosen="x", defaults=DEFAULTS)
    rows[0]["better"] = None
    assert "no significant" in verdict(rows, chosen="x", defaults=DEFAULTS)
    same = verdict(rows, chosen=DEFAULTS, defaults=DEFAULTS)
    assert "nothing that beats vLLM's defaults" in same


# ---------------------------------------------------------------- the plan (no server)


def _flags(argv: list[str]) -> dict[str, str]:
    pairs = zip(argv[2:], [*argv[3:], ""], strict=True)
    return {k: (v if not v.startswith("--") else "") for k, v in pairs if k.startswith("--")}


def test_plan_defaults_are_vllms_and_each_candidate_changes_one_knob(
    tmp_path: Path, state: Path
) -> None:
    _cpu_runtime_or_skip()
    from kimictl.runtime.demo.run import DemoRequest, prepare_demo
    from kimictl.runtime.demo.tune import CANDIDATES, DEFAULTS
    from kimictl.runtime.serving.plan import check_port_free

    plan = prepare_demo(DemoRequest(out=tmp_path / "out"))
    assert [c.name for c, _ in plan.candidates] == [c.name for c in CANDIDATES]
    plans = [p for _, p in plan.candidates]
    assert [p.port for p in plans] == [plans[0].port + i for i in range(len(plans))]
    for p in plans:  # chosen free (the profile's 8100.. may be taken on a shared box)
        check_port_free(p.host, p.port)
    base = _flags(plans[0].argv)
    assert plan.candidates[0][0].name == DEFAULTS and plans[0].role == "stock"
    knobs = {"--max-num-seqs", "--max-num-batched-tokens", "--speculative-config"}
    assert not knobs & set(base)  # vLLM decides: none of the tuning knobs is passed
    assert base["--max-model-len"] == "768" and "--enforce-eager" in base  # the CPU build's needs
    for cand, p in plan.candidates[1:]:
        mine = _flags(p.argv)
        changed = {k for k in set(mine) | set(base) if mine.get(k) != base.get(k)}
        assert changed - {"--port"} and changed - {"--port"} <= knobs, (cand.name, changed)
        assert len(changed - {"--port"}) == 1
        assert p.role is None and p.ab_group is None  # the role comes with the choice
    ngram = next(p for c, p in plan.candidates if c.name.startswith("ngram"))
    spec = json.loads(_flags(ngram.argv)["--speculative-config"])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 3
    assert any("max_model_len 768 and enforce_eager stay" in n for n in plan.notes)
    assert [c.id for c in plan.prepared.checks] and not plan.prepared.blocking  # the gate ran
    assert not (tmp_path / "out").exists()  # planning writes nothing


def test_unknown_candidate_is_refused_with_the_allowed_names(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["demo", "--candidates", "max-num-seqs-2,turbo", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[0] == (
        "error: --candidates: unknown candidate turbo; allowed: vllm-defaults, max-num-seqs-2, "
        "batched-tokens-128, ngram-spec-3."
    )


def test_named_candidates_always_include_the_defaults(tmp_path: Path, state: Path) -> None:
    _cpu_runtime_or_skip()
    from kimictl.runtime.demo.run import DemoRequest, prepare_demo

    plan = prepare_demo(DemoRequest(out=tmp_path / "o", candidates=("ngram-spec-3",)))
    assert [c.name for c, _ in plan.candidates] == ["vllm-defaults", "ngram-spec-3"]


# ---------------------------------------------------------------- the whole job (real servers)


def _measured_back(doc: dict[str, Any]) -> Measured:
    from kimictl.runtime.demo.tune import Measured

    renamed = {
        "spec_decode_acceptance_length": "acceptance_length",
        "p10_ratio_ci95": "p10_ratio_ci",
        "p10_faster_than_defaults": "p10_faster",
    }
    fields = {renamed.get(k, k): v for k, v in doc.items()}
    if fields["p10_ratio_ci"] is not None:
        fields["p10_ratio_ci"] = tuple(fields["p10_ratio_ci"])
    return Measured(**fields)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_demo_end_to_end_tunes_ab_tests_and_stops_everything(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole main job on real CPU servers: 4 candidates served and measured in turn, the
    choice by the rule, the A/B with CIs, the report and plots, and no process left."""
    _cpu_runtime_or_skip()
    from kimictl.runtime.demo.run import CONTROL
    from kimictl.runtime.demo.tune import CANDIDATES, DEFAULTS, choose

    out = tmp_path / "demo-out"
    args = ["demo", "--sessions", "2", "--tune-prompts", "4", "--num-prompts", "6"]
    code = main([*args, "--warmup", "0", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    doc = json.loads(captured.out)
    saved = json.loads((out / "demo.json").read_text())
    assert saved["measured"] == doc["measured"] and saved["choice"] == doc["choice"]
    assert saved["interrupted"] is False and saved["kept_running"] is False
    assert [g["status"] for g in saved["gate"]] and all(
        g["status"] != "fail" for g in saved["gate"]
    )

    # the tune: every candidate served and measured (ngram speculation serves on this CPU build)
    measured = saved["measured"]
    assert [m["name"] for m in measured] == [c.name for c in CANDIDATES]
    for m in measured:
        assert m["error"] is None, m
        assert m["completed"] >= 4 and m["failed"] == 0 and m["interactivity_p10"] > 0
    tune_runs = saved["tune_bench"]["runs"]
    paired = [x for c in CANDIDATES[1:] for x in (c.name, DEFAULTS)]  # back to back
    assert [r["kimictl"]["target"] for r in tune_runs] == [DEFAULTS, *paired]
    for m in measured[1:]:
        assert m["baseline_p10"] > 0
    # the choice is the rule's, recomputed from the measurements
    choice = choose([_measured_back(m) for m in measured])
    assert saved["choice"]["chosen"] == choice.chosen
    assert saved["choice"]["slo"] == choice.slo_text
    assert saved["choice"]["slo_met"] == choice.met

    # the A/B: kimictl's choice (or a control of the defaults) vs vLLM's defaults
    a = CONTROL if choice.is_defaults else choice.chosen
    assert (saved["a"], saved["b"]) == (a, DEFAULTS)
    bench = saved["bench"]
    assert bench["stop_reason"] is None
    assert [r["kimictl"]["target"] for r in bench["runs"]] == [a, DEFAULTS]
    for run in bench["runs"]:
        assert run["completed"] >= 6 and run["failed"] == 0 and run["output_throughput"] > 0
    p10 = next(r for r in bench["ab"] if r["metric"].startswith("interactivity p10"))
    assert p10["role"] == "primary"  # the SLO's metric carries the demo's A/B verdict
    assert p10["ratio"] == pytest.approx(p10[a] / p10[DEFAULTS])
    # 6 requests a side: too few for a p10 interval, so no side is called better
    assert p10["ci95"] is None and p10["better"] is None
    decision = saved["decision"]
    assert decision["deploy"] == DEFAULTS and decision["next"]
    assert decision["confidence"].startswith(("no configuration", "not confirmed"))
    assert [r["metric"] for r in saved["takeaway"]] == [
        "output tokens/s",
        "interactivity p10 (slow tail) tok/s/user",
        "interactivity p50 tok/s/user",
        "TTFT mean ms",
    ]
    assert saved["verdict"] and (choice.chosen in saved["verdict"] or choice.is_defaults)

    # 5/6: phase 2's own traffic (the defaults' first bench, captured from their spans) replayed
    # paired to the A/B pair; the capture checked against the client's own totals
    first = tune_runs[0]
    trace = [json.loads(x) for x in (out / "capture.jsonl").read_text().splitlines()]
    assert saved["capture"]["rows"] == len(trace) == first["completed"]
    assert sum(r["input_length"] for r in trace) == first["total_input_tokens"]
    assert sum(r["output_length"] for r in trace) == first["total_output_tokens"]
    replay = saved["paired_replay"]
    joins = replay["span_joins"]
    assert joins["rows"] == len(trace)
    assert [joins[k] for k in joins if k.endswith("_joined")] == [len(trace)] * 2
    if replay["verdict"] is None:  # a client too busy to keep the trace's clock says so
        assert "schedule" in replay["withheld"]
    else:
        assert replay["verdict"]["aa"] == choice.is_defaults

    plots = sorted(str(Path(p).relative_to(out)) for p in saved["plots"])
    assert plots == sorted(
        ["plots/ab.png"]
        + [
            f"plots/{sub}{name}.png"
            for sub in ("", "tune/")
            for name in ("latency_cdf", "pareto", "throughput_time")
        ]
    )
    for name in plots:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC

    assert runs.list_runs() == []  # nothing live is left
    finished = runs.list_runs(include_finished=True)
    assert sorted(r.id for r in finished) == sorted(r["id"] for r in saved["runs"])
    assert len(finished) == len(CANDIDATES)
    for record in finished:
        assert record.state is runs.RunState.STOPPED
        # zombies reparented to PID 1 are not live: the product's own (zombie-aware) check
        assert not runs.is_alive(record)
    roles = {r.name: r.role for r in finished}
    assert roles[DEFAULTS] == "stock"
    if not choice.is_defaults:
        assert roles[choice.chosen] == "tuned"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_demo_keep_leaves_the_ab_pair_serving_until_stopped(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import httpx

    _cpu_runtime_or_skip()
    from kimictl.runtime.demo.tune import DEFAULTS

    out = tmp_path / "kept"
    args = ["demo", "--keep", "--candidates", "max-num-seqs-2", "--sessions", "2"]
    args += ["--tune-prompts", "4", "--num-prompts", "4", "--warmup", "0"]
    try:
        code = main([*args, "--out", str(out), "--json"])
        captured = capsys.readouterr()
        assert code == 0, captured.err[-3000:]
        saved = json.loads((out / "demo.json").read_text())
        assert saved["kept_running"] is True and saved["interrupted"] is False
        pair = {DEFAULTS, saved["choice"]["chosen"]}
        live = runs.list_runs()
        assert sorted(r.name for r in live) == sorted(pair)
        for record in live:  # still serving after the demo returned: real HTTP
            reply = httpx.get(f"{record.url}/v1/models", timeout=30)
            assert reply.status_code == 200
            assert [m["id"] for m in reply.json()["data"]] == [record.model]
        for record in runs.list_runs(include_finished=True):
            if record.name not in pair:  # the candidate not chosen was stopped
                assert record.state is runs.RunState.STOPPED and not runs.is_alive(record)
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
def test_ctrl_c_during_start_up_stops_every_server(tmp_path: Path, state: Path) -> None:
    _cpu_runtime_or_skip()
    out = tmp_path / "never"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kimictl.cli", "demo", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "KIMICTL_STATE_DIR": str(state)},
    )
    deadline = time.monotonic() + 120
    while not runs.list_runs() and time.monotonic() < deadline:
        time.sleep(0.2)
    started = runs.list_runs()
    assert len(started) == 1, proc.stderr.read().decode() if proc.poll() is not None else ""
    time.sleep(2)  # into vLLM's start-up
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "interrupted: every server stopped" in err.decode()
    assert runs.list_runs() == []
    for record in runs.list_runs(include_finished=True):
        # zombies reparented to PID 1 are not live: the product's own (zombie-aware) check
        assert not runs.is_alive(record)
    assert not out.exists()  # nothing measured, nothing written
