"""`kimictl tune --comm-curve`: the measured 2 x H200 all-reduce curve as the model's
communication term (issue 18). The curve is the committed lab/bench/allreduce.py result."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.core.errors import InputError
from kimictl.runtime.tuning import model as m
from kimictl.runtime.tuning.commcurve import load_comm_curve
from kimictl.runtime.tuning.systems import SYSTEMS

CURVE = Path(__file__).parents[1] / "tests" / "fixtures" / "runs" / "allreduce_h200x2.json"
ROWS = json.loads(CURVE.read_text())["rows"]


def measured(label: str, methods: tuple[str, ...]) -> tuple[int, float]:
    rows = [r for r in ROWS if r["label"] == label and r["method"] in methods]
    return rows[0]["bytes"], min(r["us"] for r in rows)


def test_same_gpu_and_tp_reads_the_measurement() -> None:
    h200 = replace(SYSTEMS["h200"], comm=load_comm_curve(CURVE))
    for label in ("M=1", "M=17", "M=64"):
        nbytes, symm = measured(label, ("symm_one_shot", "symm_two_shot"))
        assert m._allreduce_us(h200, 2, nbytes, "specialized") == pytest.approx(symm)
        _, best = measured(label, ("nccl", "symm_one_shot", "symm_two_shot"))
        assert m._allreduce_us(h200, 2, nbytes, "stock") == pytest.approx(best)


def test_between_measured_sizes_is_interpolated() -> None:
    h200 = replace(SYSTEMS["h200"], comm=load_comm_curve(CURVE))
    lo_b, lo = measured("M=8", ("symm_one_shot", "symm_two_shot"))
    hi_b, hi = measured("M=9", ("symm_one_shot", "symm_two_shot"))
    mid = m._allreduce_us(h200, 2, (lo_b + hi_b) / 2, "specialized")
    assert min(lo, hi) <= mid <= max(lo, hi)


def test_tp8_is_extrapolated_with_the_model_forms_from_the_tp2_fit() -> None:
    curve = load_comm_curve(CURVE)
    a, b = curve.fit("specialized")
    assert 0 < a < 20 and b > 0  # a few microseconds fixed, a positive per-byte cost
    h200 = replace(SYSTEMS["h200"], comm=curve)
    msg = 64 * 7168 * 2
    expect = min(a + 7 * b * msg, 2 * a + 2 * 7 / 8 * b * msg)
    assert m._allreduce_us(h200, 8, msg, "specialized") == pytest.approx(expect)
    # another GPU: only the per-byte cost is scaled, by the spec-sheet NVLink ratio (450 / 900)
    gb300 = replace(SYSTEMS["gb300"], comm=curve)
    ratio = SYSTEMS["h200"].nvlink_gb_s / SYSTEMS["gb300"].nvlink_gb_s
    expect = min(a + 7 * b * ratio * msg, 2 * a + 2 * 7 / 8 * b * ratio * msg)
    assert m._allreduce_us(gb300, 8, msg, "specialized") == pytest.approx(expect)


def test_predict_says_which_term_and_shows_the_spec_sheet_difference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["tune", "predict", "--system", "gb300", "--gpus", "8", "--tp", "8", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["communication"].startswith("spec-sheet constants")
    assert plain["spec_sheet_communication"] is None
    assert main([*argv, "--comm-curve", str(CURVE)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "measured all-reduce curve" in doc["communication"]
    assert "extrapolated from TP2" in doc["communication"]
    same = doc["spec_sheet_communication"]["specialized"]["tokens_per_s_per_user"]
    assert same == plain["specialized"]["tokens_per_s_per_user"]
    measured_comm = doc["specialized"]["detail"]["breakdown_us"]["comm"]
    assert measured_comm != plain["specialized"]["detail"]["breakdown_us"]["comm"]
    assert main(argv[:-1] + ["--comm-curve", str(CURVE)]) == 0
    text = capsys.readouterr().out
    assert "all-reduce term: measured" in text and "with the spec-sheet constants instead" in text


def test_search_output_names_the_term(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--system", "gb300", "--gpus", "16", "--comm-curve", str(CURVE), "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "measured all-reduce curve" in doc["communication"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{", "not a readable JSON file"),
        ('{"rows": []}', "not an all-reduce curve"),
        ('{"machine": {"gpus": ["NVIDIA H200"], "world": 2}, "rows": []}', "no method"),
    ],
)
def test_bad_curve_is_one_sentence(tmp_path: Path, content: str, fragment: str) -> None:
    bad = tmp_path / "curve.json"
    bad.write_text(content)
    with pytest.raises(InputError, match=fragment):
        load_comm_curve(bad)


def test_bad_curve_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "predict", "--system", "gb300", "--gpus", "8"]
    assert main([*argv, "--comm-curve", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --comm-curve") and "no such file" in err
