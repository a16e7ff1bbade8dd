"""The node's layer record: a K3 layer's projections back to back, from `kimictl kernels bench`
(tests/fixtures/runs/kernels_vs_vllm_tuned4/kernels_h200_bench.json, the bench of an H200
`kernels install`), shown by `kimictl kernels layer`, saved as the node's, and used by
`kimictl tune` in place of the fitted per-kernel overheads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.core.errors import InputError
from kimictl.kernels.toolchain.layer_record import LayerRecord, read_layer_record
from kimictl.runtime.tuning.layer_overhead import measured_overheads
from kimictl.runtime.tuning.model import fitted_parameters, layer_time_us
from kimictl.runtime.tuning.params import PARAMS, param
from kimictl.runtime.tuning.published import published_setups
from kimictl.runtime.tuning.systems import KernelOverheads, get_system

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "runs" / "kernels_vs_vllm_tuned4" / "kernels_h200_bench.json"


@pytest.fixture
def raw() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIMICTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_each_point_is_what_the_table_ships_against_cublas_and_vllm(raw):
    record = read_layer_record(FIXTURE)
    assert record.device == raw["device"] == "NVIDIA H200"
    assert [p.m for p in record.points] == [c["m"] for c in raw["chains"]]
    for chain in raw["chains"]:
        p = record.point("projections", chain["m"])
        assert p is not None
        # the bench's own fields, not a second reading: its chosen plan and that plan's time
        assert p.best == chain["chain_plan"] and p.best_us == chain["plans"][p.best]
        assert p.stock_us == chain["cublas_us"] and p.vllm_us == chain["plans"]["vllm"]
        assert p.stock_kernels == p.best_kernels == len(chain["shapes"]) == 11
        assert p.tbps == pytest.approx(chain["bytes"] / p.best_us / 1e6)
        assert p.vs_stock == pytest.approx(p.best_us / chain["cublas_us"])


def test_without_a_chain_plan_the_two_way_picks_are_the_point(raw):
    for chain in raw["chains"]:
        del chain["chain_plan"], chain["plans"]
    p = LayerRecord.from_json(raw).point("projections", 1)
    assert p is not None and p.best == "dispatched" and p.vllm_us is None
    assert p.best_us == raw["chains"][0]["dispatched_us"]


def test_a_saved_record_reads_back_the_same(raw):
    record = LayerRecord.from_json(raw)
    assert LayerRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_file_that_is_not_a_layer_record_is_bad_input(tmp_path, capsys):
    table = FIXTURES / "kernels" / "bench_h200_table.json"  # real JSON, wrong kind
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
    assert json.loads(Path(saved).read_text()) == LayerRecord.from_json(raw).to_json()
    assert main(["kernels", "layer", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device"] == raw["device"] and len(doc["points"]) == len(raw["chains"]) == 11


def test_measured_overheads_follow_the_layer_times(raw):
    record = read_layer_record(FIXTURE)
    h200 = get_system("h200")
    got = measured_overheads(record, h200)
    assert got is not None
    chain = raw["chains"][0]
    assert chain["m"] == 1
    for path, us in (("stock", chain["cublas_us"]), ("specialized", chain["shipped_us"])):
        rate = h200.hbm_tb_s * 1e6 * param(f"hbm_efficiency_{path}")
        expect = max(0.0, (us - chain["bytes"] / rate) / len(chain["shapes"]))
        assert got[f"kernel_overhead_us_{path}"] == pytest.approx(expect)
    assert measured_overheads(record, get_system("gb300")) is None  # another GPU's record


def test_measured_overheads_travel_with_the_system_not_the_parameters():
    before = dict(PARAMS)
    h200 = get_system("h200")
    measured = replace(h200, overheads=KernelOverheads(1.25, 0.5, source="measured"))
    layer = published_setups()["layer"]
    for path, us in (("stock", 1.25), ("specialized", 0.5)):
        per_layer = param(f"kernels_per_layer_{path}")
        got = layer_time_us(measured, layer, path=path)["kernels"]
        assert got == pytest.approx(per_layer * us)
        fitted = layer_time_us(h200, layer, path=path)["kernels"]
        assert fitted == pytest.approx(per_layer * param(f"kernel_overhead_us_{path}"))
        assert f"kernel_overhead_us_{path}" in fitted_parameters(h200)
        assert f"kernel_overhead_us_{path}" not in fitted_parameters(measured)
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
    assert PARAMS["kernel_overhead_us_stock"].fitted  # the command changed no parameter
