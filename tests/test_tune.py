"""`kimictl tune` end to end through the real CLI entry point (kimictl.cli.main)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.deployment import k3
from kimictl.deployment.profiles import load_profile
from kimictl.runtime.checks.rules.base import Status
from kimictl.runtime.checks.rules.deployment import deployment_checks
from kimictl.runtime.tuning import model as m
from kimictl.runtime.tuning.systems import SYSTEMS

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
GB300_16 = ["--system", "gb300", "--gpus", "16"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["tune", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def one_sentence_error(err: str, *fragments: str) -> None:
    assert "Traceback" not in err and "kimictl bug" not in err
    first = err.strip().splitlines()[0]
    assert first.startswith("error: ")
    for fragment in fragments:
        assert fragment in first, (fragment, first)


# --- model search ---------------------------------------------------------------------------


def test_json_has_candidates_pareto_and_a_predicted_choice(capsys) -> None:
    doc = run_json(capsys, *GB300_16, "--context", "8k", "--output-len", "1k")
    assert len(doc["candidates"]) == 2 * 2 * 8 * 9 * 2  # TP x DCP x draft x seqs x path
    assert doc["pareto"] and all(row["fits_memory"] for row in doc["pareto"])
    choice = doc["choice"]
    assert set(choice["predicted"]) == {
        "tokens_per_s",
        "tokens_per_s_per_user",
        "tokens_per_s_per_gpu",
        "step_us",
    }
    assert (choice["path"], choice["tensor_parallel_size"], choice["num_speculative_tokens"]) == (
        "specialized",
        16,
        7,
    )
    assert choice["predicted"]["tokens_per_s_per_user"] == pytest.approx(840, rel=0.15)
    assert choice["fallback_share"] == 0.0 and choice["bound_by"] == "fast-path"
    assert any("ASSUMED" in note for note in doc["notes"])
    assert {row["figure"] for row in doc["model"]} >= {"one layer, stock (us)"}


def test_human_output_shows_frontier_plot_choice_why_and_model_error(capsys) -> None:
    code, out, err = run(capsys, *GB300_16, "--concurrency", "4", "--slo", "interactivity_p10>=300")
    assert code == 0, err
    assert "Pareto frontier" in out and "tokens/s/user" in out
    assert "choice: specialized TP16" in out
    assert "bound by the SLO" in out
    assert "error on the published figures" in out and "(fitted)" in out


def test_measured_acceptance_changes_the_answer(capsys) -> None:
    high = run_json(capsys, *GB300_16, "--draft-acceptance", "6")
    low = run_json(capsys, *GB300_16, "--draft-acceptance", "1.2@1")
    assert low["choice"]["num_speculative_tokens"] < high["choice"]["num_speculative_tokens"]
    assert not any("ASSUMED" in note for note in low["notes"])


def test_from_snapshot_reads_system_and_gpu_count(capsys) -> None:
    trays = sorted((SNAPSHOTS / "gb300-tp16-healthy").glob("*.json"))
    args = [arg for path in trays for arg in ("--from-snapshot", str(path))]
    from_snapshot = run_json(capsys, *args)
    from_flags = run_json(capsys, *GB300_16)
    assert from_snapshot["inputs"]["gpus"] == 16 and from_snapshot["inputs"]["system"] == "gb300"
    assert from_snapshot["choice"]["predicted"] == from_flags["choice"]["predicted"]
    assert from_snapshot["hardware_source"].startswith("snapshot")


def test_h200_snapshot_with_one_gpu_is_refused_in_one_sentence(capsys) -> None:
    code, _, err = run(capsys, "--from-snapshot", str(SNAPSHOTS / "h200-real.json"))
    assert code == 2
    one_sentence_error(err, "1 GPU(s)", "a multiple of 8")


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--system", "mi300x", "--gpus", "8"], ["'mi300x'", "gb300, b300, b200, h200"]),
        (["--system", "gb300"], ["--gpus"]),
        ([], ["--system", "--from-snapshot"]),
        (["--system", "gb300", "--gpus", "12"], ["12 GPU(s)"]),
        ([*GB300_16, "--context", "lots"], ["--context", "'lots'"]),
        ([*GB300_16, "--context", "2M"], ["maximum context"]),
        ([*GB300_16, "--output-len", "0"], ["--output-len", "positive"]),
        ([*GB300_16, "--concurrency", "0"], ["--concurrency"]),
        ([*GB300_16, "--draft-acceptance", "9"], ["between 1 and 8"]),
        ([*GB300_16, "--draft-acceptance", "2@9"], ["1 to 7"]),
        ([*GB300_16, "--draft-acceptance", "six"], ["AL@DRAFT_TOKENS"]),
        ([*GB300_16, "--slo", "fast please"], ["SLO term"]),
        ([*GB300_16, "--plot", "/tmp/plot.jpg"], [".png"]),
        ([*GB300_16, "--write", "/nonexistent-dir/p.toml"], ["does not exist"]),
        (["--measure", "http://127.0.0.1:9"], ["--slo"]),
        (
            ["--measure", "http://127.0.0.1:9", "--slo", "ttft_p99<=1s", "--max-concurrency", "0"],
            ["--max-concurrency"],
        ),
        (["--measure", "not a url", "--slo", "ttft_p99<=1s"], ["not a url"]),
    ],
)
def test_bad_input_exits_2_with_one_sentence(capsys, argv: list[str], fragments: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    one_sentence_error(err, *fragments)


def test_plot_writes_a_png(capsys, tmp_path: Path) -> None:
    target = tmp_path / "pareto.png"
    doc = run_json(capsys, *GB300_16, "--plot", str(target))
    assert doc["plot"] == str(target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 5000


def test_plot_never_overwrites_without_force_and_writes_nothing_first(
    capsys, tmp_path: Path
) -> None:
    png = tmp_path / "mine.png"
    png.write_bytes(b"my picture")
    profile = tmp_path / "p.toml"
    code, out, err = run(capsys, *GB300_16, "--plot", str(png), "--write", str(profile))
    assert code == 2 and out == ""
    one_sentence_error(err, f"--plot '{png}' already exists")
    assert png.read_bytes() == b"my picture" and not profile.exists()
    doc = run_json(capsys, *GB300_16, "--plot", str(png), "--force")
    assert doc["plot"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"


# --- --write ---------------------------------------------------------------------------------


def test_write_emits_a_profile_and_stock_twin_that_pass_the_deployment_rules(
    capsys, tmp_path: Path
) -> None:
    target = tmp_path / "tuned.toml"
    doc = run_json(capsys, *GB300_16, "--concurrency", "2", "--write", str(target))
    assert doc["written"] == str(target)
    tuned = load_profile(str(target))
    twin = load_profile(str(tmp_path / "tuned-stock.toml"))
    assert tuned.stock_twin == "tuned-stock"
    assert tuned.spec.tensor_parallel_size == doc["choice"]["tensor_parallel_size"]
    assert tuned.spec.max_num_seqs == doc["choice"]["max_num_seqs"]
    assert tuned.spec.num_speculative_tokens == doc["choice"]["num_speculative_tokens"]
    assert tuned.spec.decode_backend == k3.DECODE_BACKEND_SPECIALIZED
    assert twin.spec.decode_backend == k3.DECODE_BACKEND_AUTO
    checks = deployment_checks(tuned.spec, None, model_config=dict(k3.K3_MOE_CONFIG))
    assert not [c.id for c in checks if c.status is Status.FAIL]
    prov = tuned.provenance
    assert prov["model_version"] == m.MODEL_VERSION
    assert (
        prov["predicted"]["tokens_per_s_per_user"]
        == doc["choice"]["predicted"]["tokens_per_s_per_user"]
    )
    assert prov["inputs"]["concurrency"] == 2 and prov["why"]


def test_write_never_overwrites_without_force(capsys, tmp_path: Path) -> None:
    target = tmp_path / "p.toml"
    target.write_text("# mine\n")
    code, _, err = run(capsys, *GB300_16, "--write", str(target))
    assert code == 2
    one_sentence_error(err, "already exists")
    assert target.read_text() == "# mine\n"
    code, _, err = run(capsys, *GB300_16, "--write", str(target), "--force")
    assert code == 0, err
    assert load_profile(str(target)).spec.tensor_parallel_size == 16


def test_write_to_a_folder_is_bad_input_even_with_force(capsys, tmp_path: Path) -> None:
    folder = tmp_path / "p.toml"
    folder.mkdir()
    code, out, err = run(capsys, *GB300_16, "--write", str(folder), "--force")
    assert code == 2 and out == ""
    one_sentence_error(err, "is a folder; name a .toml file")
    assert folder.is_dir() and not any(folder.iterdir())


def test_measure_refuses_a_bad_write_before_touching_the_server(capsys, tmp_path: Path) -> None:
    target = tmp_path / "p.toml"
    target.write_text("# mine\n")
    # port 9 (discard) is closed: reaching the sweep would exit 1 with a connection error
    argv = ["--measure", "http://127.0.0.1:9", "--slo", "interactivity_p10>=20"]
    code, _, err = run(capsys, *argv, "--write", str(target))
    assert code == 2
    one_sentence_error(err, "already exists")
    assert target.read_text() == "# mine\n"
    broken = tmp_path / "broken.toml"
    broken.write_text("[model\n")
    code, _, err = run(capsys, *argv, "--write", str(tmp_path / "n.toml"), "--profile", str(broken))
    assert code == 2 and f"error: {broken}:1: not valid TOML" in err


def test_measure_against_a_closed_port_exits_1_with_tune_hint(capsys) -> None:
    code, out, err = run(
        capsys, "--measure", "http://127.0.0.1:9", "--slo", "interactivity_p10>=20"
    )
    assert code == 1 and out == ""
    one_sentence_error(err, "cannot read the model list of 127.0.0.1:9")
    assert "hint: check the server is up" in err and "--model" not in err


def test_h200_write_is_a_stock_profile_without_twin(capsys, tmp_path: Path) -> None:
    target = tmp_path / "h200.toml"
    doc = run_json(capsys, "--system", "h200", "--gpus", "16", "--write", str(target))
    assert doc["choice"]["path"] == "stock"
    assert load_profile(str(target)).spec.decode_backend == k3.DECODE_BACKEND_AUTO
    assert not (tmp_path / "h200-stock.toml").exists()


# --- predict ---------------------------------------------------------------------------------


def test_predict_gives_both_paths_and_the_speedup(capsys) -> None:
    doc = run_json(
        capsys, "predict", *GB300_16, "--tp", "16", "--batch", "1", "--draft-tokens", "7",
        "--draft-acceptance", "6",
    )  # fmt: skip
    spec, stock = doc["specialized"], doc["stock"]
    for side in (spec, stock):
        assert {"tokens_per_s", "tokens_per_s_per_user", "tokens_per_s_per_gpu", "step_us"} <= set(
            side
        )
    assert spec["tokens_per_s_per_user"] == pytest.approx(840, rel=0.15)
    assert doc["speedup"] == pytest.approx(
        spec["tokens_per_s_per_user"] / stock["tokens_per_s_per_user"], rel=1e-3
    )
    assert doc["acceptance_length"] == pytest.approx(6.0, rel=1e-3)


def test_predict_at_batch_64_with_drafts_is_all_stock(capsys) -> None:
    doc = run_json(
        capsys, "predict", "--system", "gb300", "--gpus", "8", "--tp", "8", "--batch", "64",
        "--draft-tokens", "7", "--draft-acceptance", "6",
    )  # fmt: skip
    assert doc["specialized"]["detail"]["fallback_share"] == 1.0
    assert doc["speedup"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--tp", "4"], ["--tp 4", "8 or 16"]),
        (["--tp", "8", "--dcp", "4"], ["--dcp 4"]),
        (["--tp", "16", "--gpus", "8"], ["--gpus 8"]),
        (["--tp", "8", "--draft-tokens", "8"], ["--draft-tokens 8", "0 to 7"]),
        (["--tp", "8", "--batch", "0"], ["--batch"]),
    ],
)
def test_predict_bad_input_exits_2(capsys, argv: list[str], fragments: list[str]) -> None:
    base = ["predict", "--system", "gb300"]
    if "--gpus" not in argv:
        base += ["--gpus", "16"]
    code, out, err = run(capsys, *base, *argv)
    assert code == 2, (out, err)
    one_sentence_error(err, *fragments)


# --- --check ---------------------------------------------------------------------------------


def _bench_file(tmp_path: Path, **overrides: object) -> Path:
    doc = {
        "max_concurrency": 4,
        "completed": 40,
        "failed": 0,
        "total_input_tokens": 40 * 8000,
        "total_output_tokens": 40 * 1000,
        "spec_decode_acceptance_length": 5.0,
    }
    doc.update(overrides)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    return path


def test_check_reports_the_models_error_on_each_figure(capsys, tmp_path: Path) -> None:
    cfg = m.Config(
        tp=16, batch=4, draft_tokens=7, acceptance=m.acceptance_rate_for(5.0, 7),
        context=8000, output_len=1000,
    )  # fmt: skip
    pred = m.predict(SYSTEMS["gb300"], cfg)
    # a measurement 25% above the model on throughput, 10% below on interactivity
    bench = _bench_file(
        tmp_path,
        output_throughput=pred.tokens_per_s * 1.25,
        mean_tpot_ms=1000 / (pred.tokens_per_s_per_user * 0.9),
        mean_ttft_ms=pred.ttft_ms,
    )
    doc = run_json(capsys, "--check", str(bench), "k3-tp16-latency", "--system", "gb300")
    errors = {row["figure"].split(": ")[-1]: row["error"] for row in doc["figures"]}
    assert errors["output tokens/s"] == pytest.approx(1 / 1.25 - 1, abs=1e-3)
    assert errors["tokens/s/user (mean)"] == pytest.approx(1 / 0.9 - 1, abs=1e-3)
    assert errors["TTFT ms (mean)"] == pytest.approx(0.0, abs=1e-3)
    assert doc["max_abs_error"] == pytest.approx(0.2, abs=1e-3)
    assert "measured acceptance length 5.00" in doc["figures"][0]["figure"]


def test_check_of_a_cpu_profile_says_the_model_does_not_apply(capsys, tmp_path: Path) -> None:
    code, _, err = run(capsys, "--check", str(_bench_file(tmp_path)), "cpu-demo")
    assert code == 1
    one_sentence_error(err, "CPU runtime")


def test_check_with_a_missing_bench_file_exits_2(capsys, tmp_path: Path) -> None:
    code, _, err = run(capsys, "--check", str(tmp_path / "nope.json"), "k3-tp16-latency")
    assert code == 2
    one_sentence_error(err, "does not exist")


def test_check_without_concurrency_exits_2(capsys, tmp_path: Path) -> None:
    bench = _bench_file(tmp_path, max_concurrency=None, output_throughput=100.0)
    code, _, err = run(capsys, "--check", str(bench), "k3-tp16-latency", "--system", "gb300")
    assert code == 2
    one_sentence_error(err, "max_concurrency")


@pytest.mark.parametrize(
    ("field", "value"), [("max_concurrency", "x"), ("mean_tpot_ms", "fast"), ("completed", True)]
)
def test_check_with_a_non_number_field_exits_2_naming_it(
    capsys, tmp_path: Path, field: str, value: object
) -> None:
    bench = _bench_file(tmp_path, output_throughput=100.0, **{field: value})
    code, out, err = run(capsys, "--check", str(bench), "k3-tp16-latency", "--system", "gb300")
    assert code == 2 and out == ""
    one_sentence_error(err, f"bench file {bench}, run 0: {field} = {value!r} is not a number.")


# --- import hygiene ---------------------------------------------------------------------------


def test_command_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, kimictl.commands.tune\n"
        "heavy = {'matplotlib', 'plotext', 'torch', 'numpy', 'textual', 'httpx'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- measured mode on the real CPU server ------------------------------------------------------


@pytest.mark.slow
def test_measure_finds_the_slo_limit_and_writes_it(capsys, cpu_server, tmp_path: Path) -> None:
    target = tmp_path / "measured.toml"
    doc = run_json(
        capsys, "--measure", cpu_server.url, "--slo", "interactivity_p10>=0.5",
        "--context", "32", "--output-len", "8", "--max-concurrency", "2",
        "--write", str(target), "--profile", "cpu-demo",
    )  # fmt: skip
    assert [p["concurrency"] for p in doc["points"]] == [1, 2]
    assert all(p["slo_met"] and p["completed"] >= 4 for p in doc["points"])
    assert doc["max_concurrency_meeting_slo"] == 2
    assert "sweep's limit of 2" in doc["why"]
    written = load_profile(str(target))
    assert written.spec.max_num_seqs == 2 and written.runtime == "cpu"
    assert written.provenance["slo"] == "interactivity_p10>=0.5"
    assert written.provenance["measured_url"] == cpu_server.url


def test_measured_write_keeps_each_profiles_prebuilt_units(tmp_path: Path) -> None:
    from kimictl.runtime.tuning.measure import MeasureResult, write_measured

    repo_profiles = Path(__file__).parent.parent / "profiles"
    for name in ("cpu-demo", "cpu-demo-stock"):
        text = (repo_profiles / f"{name}.toml").read_text()
        if name == "cpu-demo":  # the tuned one opts out; its stock twin keeps the default
            text = text.replace("[serve]\n", '[serve]\nprebuilt_units = "off"\n', 1)
        (tmp_path / f"{name}.toml").write_text(text)
    assert load_profile(str(tmp_path / "cpu-demo.toml")).prebuilt_units == "off"
    result = MeasureResult(
        target="t", url="http://127.0.0.1:1", model="m", run_id=None, profile=None,
        slo="interactivity_p10>=1", context=32, output_len=8, points=[], best=3,
        limit_reason="r",
    )  # fmt: skip
    base = str(tmp_path / "cpu-demo.toml")
    out = write_measured(result, tmp_path / "out.toml", base_profile=base)
    written, twin = load_profile(str(out)), load_profile(str(tmp_path / "out-stock.toml"))
    assert (written.prebuilt_units, written.spec.max_num_seqs) == ("off", 3)
    assert (twin.prebuilt_units, twin.spec.max_num_seqs) == ("auto", 3)


@pytest.mark.slow
def test_measure_with_an_slo_nothing_meets_exits_1(capsys, cpu_server) -> None:
    code, out, err = run(
        capsys, "--measure", cpu_server.url, "--slo", "interactivity_p10>=100000",
        "--context", "32", "--output-len", "8", "--max-concurrency", "4",
    )  # fmt: skip
    assert code == 1
    assert "concurrency 1: breaks the SLO" in out
    one_sentence_error(err, "no concurrency", "interactivity_p10>=100000")


def test_model_card_lists_sources_errors_and_a_calibration_that_reproduces_the_stored_fit(
    capsys,
) -> None:
    doc = run_json(capsys, "model", "--calibrate")
    assert all(p["source"] for p in doc["parameters"].values())
    fitted = {name for name, p in doc["parameters"].items() if p["fitted"]}
    assert set(doc["calibration"]) == fitted and len(fitted) == 3
    assert all(abs(row["drift"]) < 0.01 for row in doc["calibration"].values())
    kinds = {row["in_sample"] for row in doc["published_figures"]}
    assert kinds == {True, False}
    assert all(abs(row["error"]) <= 0.15 for row in doc["published_figures"])


# --- the measured sweep's search, on a known limit -------------------------------------------


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 5, 8, 13, 40, 64, 100])
@pytest.mark.parametrize("max_concurrency", [1, 6, 64])
def test_sweep_finds_the_largest_load_meeting_the_slo(limit: int, max_concurrency: int) -> None:
    from kimictl.runtime.tuning.measure import sweep

    asked: list[int] = []

    def meets(concurrency: int) -> bool:
        assert 1 <= concurrency <= max_concurrency
        asked.append(concurrency)
        return concurrency <= limit

    good, bad = sweep(meets, max_concurrency)
    assert good == min(limit, max_concurrency)
    assert bad == (None if limit >= max_concurrency else good + 1)
    assert len(asked) == len(set(asked)) <= 2 * max_concurrency.bit_length() + 1


def test_tune_help_exits_0_without_heavy_imports() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from kimictl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    rc = main(['tune', '--help'])\n"
        "heavy = {'matplotlib', 'plotext', 'torch', 'numpy', 'textual'}\n"
        "print(rc, sorted(heavy & set(sys.modules)), '--draft-acceptance' in out.getvalue())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0 [] True"


def test_nothing_fits_exits_1_and_writes_nothing(capsys, tmp_path: Path) -> None:
    target = tmp_path / "b200.toml"
    args = ["--system", "b200", "--gpus", "8", "--write", str(target), "--json"]
    code, out, err = run(capsys, *args)
    assert code == 1
    assert json.loads(out)["choice"] is None  # the search is still reported
    one_sentence_error(err, "no configuration fits 8 x b200")
    assert not target.exists()


def test_check_refuses_a_bench_of_another_model(capsys, tmp_path: Path) -> None:
    """A tiny-CPU-model bench against a K3 profile is not a +575% model error: exit 2."""
    real = Path(__file__).parent / "fixtures" / "vllm_bench" / "vllm_save_result.json"
    code, out, err = run(capsys, "--check", str(real), "k3-tp16-latency", "--system", "gb300")
    assert code == 2 and out == ""
    one_sentence_error(err, "model_id 'tiny-k2' is not profile k3-tp16-latency's model")
    same = _bench_file(tmp_path, model_id="moonshotai/Kimi-K3", output_throughput=100.0)
    code, _, err = run(capsys, "--check", str(same), "k3-tp16-latency", "--system", "gb300")
    assert code == 0, err
