"""The measured dense-layer record (issue 17): read from the real H200 run's JSON
(tests/fixtures/kernels/layer_h200.json, lab/bench/layer_h200.py on the lent H200), shown by
`kimictl kernels layer`, saved as the node's, and used by `kimictl tune` in place of the fitted
per-kernel overheads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.kernels.toolchain.layer_record import KIMICTL_VARIANTS, LayerRecord, read_layer_record
from kimictl.runtime.errors import InputError
from kimictl.runtime.tuning.layer_overhead import measured_overheads, overheads_applied
from kimictl.runtime.tuning.params import PARAMS, param
from kimictl.runtime.tuning.systems import get_system

FIXTURE = Path(__file__).parent / "fixtures" / "kernels" / "layer_h200.json"


@pytest.fixture
def raw() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_each_point_is_the_fastest_checked_kimictl_variant(raw):
    record = read_layer_record(FIXTURE)
    assert record.device == raw["device"]
    rows = [(kind, row) for kind, layer in raw["layers"].items() for row in layer["rows"]]
    assert len(record.points) == len(rows) == 14
    for kind, row in rows:
        p = record.point(kind, row["m"])
        assert p is not None
        ours = {v: row[v]["us"] for v in KIMICTL_VARIANTS if v in row and row[v]["ok"]}
        assert p.best == min(ours, key=lambda v: ours[v])
        assert p.best_us == ours[p.best]
        assert p.stock_us == row["stock"]["us"]
        assert p.vllm_us == row["vllm_plan"]["us"]
        assert p.best_kernels == row[p.best]["nodes"]["kernel"]
        assert p.vs_stock == pytest.approx(ours[p.best] / row["stock"]["us"])
        wb = raw["layers"][kind]["weight_bytes"]
        assert p.tbps == pytest.approx(wb / ours[p.best] / 1e6)


def test_a_variant_that_failed_its_checks_is_never_the_best(raw):
    before = LayerRecord.from_json(raw).point("mla", 1)
    assert before is not None
    raw["layers"]["mla"]["rows"][0][before.best]["ok"] = False
    after = LayerRecord.from_json(raw).point("mla", 1)
    assert after is not None and after.best != before.best and after.best_us > before.best_us


def test_a_file_that_is_not_a_layer_record_is_bad_input(tmp_path, capsys):
    table = FIXTURE.parent / "bench_h200_table.json"  # real JSON, wrong kind
    with pytest.raises(InputError):
        read_layer_record(table)
    assert main(["kernels", "layer", "--from", str(table)]) == 2
    assert "is not a layer record" in capsys.readouterr().err
    assert main(["kernels", "layer", "--from", str(tmp_path / "absent.json")]) == 2


def test_save_then_show_the_node_record(cache, capsys, raw):
    assert main(["kernels", "layer", "--save"]) == 2  # --save needs --from
    capsys.readouterr()
    assert main(["kernels", "layer"]) != 0  # nothing saved yet
    assert "no layer record on this node" in capsys.readouterr().err
    assert main(["kernels", "layer", "--from", str(FIXTURE), "--save", "--json"]) == 0
    saved = json.loads(capsys.readouterr().out)["saved"]
    assert Path(saved) == cache / "kernels" / "sm_90a" / "layer.json"
    assert json.loads(Path(saved).read_text()) == raw
    assert main(["kernels", "layer", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device"] == raw["device"] and len(doc["points"]) == 14


def test_measured_overheads_follow_the_layer_times(raw):
    record = read_layer_record(FIXTURE)
    h200 = get_system("h200")
    got = measured_overheads(record, h200)
    assert got is not None
    for path, take in (("stock", "stock"), ("specialized", None)):
        per = []
        for layer in raw["layers"].values():
            row = layer["rows"][0]
            assert row["m"] == 1
            v = take or min(
                (v for v in KIMICTL_VARIANTS if row.get(v, {}).get("ok")),
                key=lambda v: row[v]["us"],
            )
            rate = h200.hbm_tb_s * 1e6 * param(f"hbm_efficiency_{path}")
            per.append((row[v]["us"] - layer["weight_bytes"] / rate) / row[v]["nodes"]["kernel"])
        assert got[f"kernel_overhead_us_{path}"] == pytest.approx(sum(per) / len(per))
    assert measured_overheads(record, get_system("gb300")) is None  # another GPU's record


def test_overheads_applied_is_undone():
    before = dict(PARAMS)
    with overheads_applied({"kernel_overhead_us_stock": 1.25}, "measured"):
        assert param("kernel_overhead_us_stock") == 1.25
        assert not PARAMS["kernel_overhead_us_stock"].fitted
    assert PARAMS == before


def _tune(capsys) -> dict:
    argv = ["tune", "--system", "h200", "--gpus", "16", "--concurrency", "4", "--json"]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_tune_uses_the_node_layer_record_when_it_has_one(cache, capsys):
    fitted = _tune(capsys)
    assert fitted["kernel_overheads"]["measured"] is False
    assert main(["kernels", "layer", "--from", str(FIXTURE), "--save", "--json"]) == 0
    capsys.readouterr()
    measured = _tune(capsys)
    over = measured["kernel_overheads"]
    assert over["measured"] is True and "NVIDIA H200" in over["source"]
    expect = measured_overheads(read_layer_record(FIXTURE), get_system("h200"))
    assert expect is not None
    for name, value in expect.items():
        assert over[name] == pytest.approx(value)
    # the search itself changed: the same candidates predict other step times
    assert json.dumps(measured["candidates"]) != json.dumps(fitted["candidates"])
    assert "kernel_overhead_us_stock" in fitted["fitted_parameters"]
    assert "kernel_overhead_us_stock" not in measured["fitted_parameters"]  # measured, not fitted
    assert PARAMS["kernel_overhead_us_stock"].fitted  # restored after the command
