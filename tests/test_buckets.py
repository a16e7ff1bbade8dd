"""Histogram buckets that resolve interactivity: derivation, profile/flag plumbing, doctor's
warning, and the monitor's resolution logic on 1-5 ms TPOT histograms."""

from __future__ import annotations

import json
import math
import random
import shlex
from pathlib import Path

import pytest

from kimictl.cli import main
from kimictl.core.errors import InputError
from kimictl.deployment import buckets
from kimictl.deployment.profile_writer import render_profile
from kimictl.deployment.profiles import load_profile, scan_profiles
from kimictl.deployment.spec import DeploymentSpec
from kimictl.deployment.vllm_args import parse_vllm_command
from kimictl.runtime.observe.names import TIME_PER_OUTPUT_TOKEN
from kimictl.runtime.observe.prometheus import Histogram
from kimictl.runtime.observe.resolution import read_quantile, unresolved_figures
from kimictl.runtime.observe.snapshot import snapshot_from_text
from kimictl.runtime.observe.window import WindowStats, compute_window
from kimictl.runtime.tuning.bucket_check import histogram_bucket_check
from kimictl.tui.rows import ROWS, fmt_cell

FIX = Path(__file__).parent / "fixtures" / "metrics"


def hist(values: list[float], bounds: list[float]) -> Histogram:
    """A vLLM-style cumulative histogram of `values` over `bounds` (+Inf appended)."""
    edges = [*bounds, math.inf]
    cumulative = tuple(float(sum(v <= b for v in values)) for b in edges)
    return Histogram(tuple(edges), cumulative, float(len(values)), float(sum(values)))


def test_derived_buckets_resolve_20_to_4000_within_5_percent_with_few_bounds() -> None:
    b = buckets.interactivity_buckets(20, 4000)
    assert len(b) <= 64
    assert buckets.unresolved_speeds(b, 20, 4000) == []
    # the middle of every bucket that holds a speed in range is within 5% of all values in it
    for lower, upper in zip(b, b[1:], strict=False):
        if upper <= 1 / 20 * buckets.RATIO:
            assert (upper - lower) / (upper + lower) < 0.05
    assert b[0] < 1 / 4000 and 1 / 20 < b[-6]
    assert buckets.range_of(b) == (20.0, 4000.0)
    assert buckets.range_of(list(buckets.VLLM_DEFAULT_ITL_BUCKETS)) is None


def test_vllm_default_buckets_resolve_nothing_from_20_to_4000() -> None:
    gaps = buckets.unresolved_speeds(buckets.VLLM_DEFAULT_ITL_BUCKETS, 20, 4000)
    assert gaps == [(20.0, 4000.0)]


@pytest.mark.parametrize("tpot_ms", [1.0, 1.2, 2.0, 3.3, 5.0])
def test_monitor_resolution_at_fast_path_tpot(tpot_ms: float) -> None:
    rng = random.Random(int(tpot_ms * 10))
    values = [tpot_ms / 1000 * rng.uniform(0.9, 1.1) for _ in range(400)]
    values.sort()
    truth = {q: values[int(q * len(values)) - 1] for q in (0.1, 0.5, 0.9)}

    default = hist(values, list(buckets.VLLM_DEFAULT_ITL_BUCKETS))
    got = unresolved_figures({TIME_PER_OUTPUT_TOKEN: default})
    for key in ("interactivity_p10", "interactivity_p50", "interactivity_p90"):
        assert got[key]["bound"] == ">" and got[key]["value"] == pytest.approx(100.0)
        assert got[key]["bucket_s"] == [0.0, 0.01]
    assert got["tpot_p50_ms"]["bound"] == "<" and got["tpot_p50_ms"]["value"] == 10.0
    assert fmt_cell(ROWS[3], None, got) == "> 100.0"

    custom = hist(values, buckets.interactivity_buckets(20, 4000))
    assert unresolved_figures({TIME_PER_OUTPUT_TOKEN: custom}) == {}
    for q, true in truth.items():
        reading = read_quantile(custom, q)
        assert reading is not None and reading.resolved
        assert reading.value == pytest.approx(true, rel=0.05)


def test_overflow_bucket_is_a_lower_bound_on_tpot() -> None:
    h = hist([0.2, 0.3, 0.4], [0.001, 0.0011, 0.00121])
    got = unresolved_figures({TIME_PER_OUTPUT_TOKEN: h})
    assert got["tpot_p50_ms"]["bound"] == ">" and got["tpot_p50_ms"]["value"] == 1.21
    assert got["interactivity_p50"]["bound"] == "<"
    assert got["interactivity_p50"]["value"] == pytest.approx(1 / 0.00121)


def test_flag_parses_renders_and_rejects_what_vllm_rejects() -> None:
    b = buckets.interactivity_buckets(20, 4000)
    line = "vllm serve m " + shlex.join(buckets.flag_for({"inter_token_latency": b}))
    spec = parse_vllm_command(line).spec
    assert spec.custom_histogram_buckets == {"inter_token_latency": b}
    assert parse_vllm_command(spec.to_argv()).spec == spec
    for bad, said in (
        ('{"tpot": [0.1]}', "unknown bucket family 'tpot'"),
        ('{"inter_token_latency": [0.2, 0.1]}', "strictly increasing"),
        ('{"inter_token_latency": [0]}', "above 0"),
        ('{"inter_token_latency": []}', "non-empty"),
    ):
        with pytest.raises(InputError, match=said):
            parse_vllm_command(f"vllm serve m --custom-histogram-buckets '{bad}'")


def test_every_shipped_profile_renders_the_flag() -> None:
    profiles, problems = scan_profiles()
    assert not problems and len(profiles) >= 8
    for p in profiles:
        argv = p.spec.to_argv()
        got = json.loads(argv[argv.index("--custom-histogram-buckets") + 1])
        assert buckets.unresolved_speeds(got[buckets.FAMILY], 20, 4000) == []
        assert load_profile(p.path).spec == p.spec
        assert "interactivity_range = [20, 4000]" in render_profile(p.spec)


def test_profile_metrics_section_bad_values(tmp_path: Path) -> None:
    base = '[model]\nname = "m"\n[metrics]\n'
    for body, said in (
        ("interactivity_range = [4000, 20]", "two tokens/s/user figures"),
        ("custom_histogram_buckets = { ttft = [0.1] }", "bucket families"),
        (
            "interactivity_range = [20, 400]\n"
            "custom_histogram_buckets = { inter_token_latency = [0.1] }",
            "sets inter_token_latency twice",
        ),
    ):
        path = tmp_path / "p.toml"
        path.write_text(base + body + "\n")
        with pytest.raises(InputError, match=said):
            load_profile(path)


def test_doctor_warns_with_the_exact_flag_and_the_flag_fixes_it() -> None:
    k3 = parse_vllm_command(
        "vllm serve moonshotai/Kimi-K3 -tp 8 --max-num-seqs 8 "
        '--speculative-config \'{"method":"dspark","num_speculative_tokens":7}\''
    ).spec
    warn = histogram_bucket_check(k3)
    assert warn.status == "warn" and "tune predicts" in warn.message
    flag = warn.remedy.split("add to the vLLM command: ", 1)[1].split(" (in a profile")[0]
    fixed = parse_vllm_command("vllm serve moonshotai/Kimi-K3 -tp 8 --max-num-seqs 8 " + flag).spec
    assert histogram_bucket_check(fixed.with_(speculative_config=k3.speculative_config)).status == (
        "pass"
    )
    narrow = k3.with_(custom_histogram_buckets={"inter_token_latency": [0.0015, 0.00165]})
    assert histogram_bucket_check(narrow).status == "warn"
    cpu = DeploymentSpec(model="m")
    assert histogram_bucket_check(cpu).status == "warn"


def test_doctor_cli_json_carries_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    main(["doctor", "--profile", "cpu-demo", "--json"])
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["deployment.histogram_buckets"]["status"] == "pass"


def _window(prefix: str) -> WindowStats:
    gaps = json.loads((FIX / f"{prefix}_meta.json").read_text())["gaps_s"]
    t0 = snapshot_from_text((FIX / f"{prefix}_t0.txt").read_text(), monotonic=0.0)
    t2 = snapshot_from_text((FIX / f"{prefix}_t2.txt").read_text(), monotonic=sum(gaps))
    return compute_window(t0, t2)


def test_real_cpu_server_captures_default_vs_custom_buckets() -> None:
    # the same load (2 streams x 64 tokens) on the CPU server, started without and with the
    # shipped buckets (tests/fixtures/metrics/capture.py)
    default, custom = _window("fast_default"), _window("fast_custom")
    assert default.interactivity_p50 is None and default.tpot_p50_ms is None
    entry = default.unresolved["interactivity_p50"]
    assert entry["bound"] == "range" and entry["bucket_s"] == [0.01, 0.025]
    assert custom.unresolved == {}
    assert custom.tpot_p10_ms is not None and custom.tpot_p90_ms is not None
    # the custom figure lies inside the default's bucket range: same server, same load
    assert custom.tpot_p50_ms is not None and 10.0 <= custom.tpot_p50_ms <= 25.0
    assert custom.interactivity_p50 == pytest.approx(1000.0 / custom.tpot_p50_ms)
    t2 = snapshot_from_text((FIX / "fast_custom_t2.txt").read_text(), monotonic=1.0)
    bounds = t2.histograms[TIME_PER_OUTPUT_TOKEN].bounds
    assert bounds[:-1] == tuple(buckets.interactivity_buckets(20, 4000))


def test_flag_spells_each_bound_in_its_shortest_exact_form() -> None:
    """vLLM 0.33 reads --custom-histogram-buckets with json.loads (vllm/engine/arg_utils.py:
    parse_type(json.loads) for a dict field) and accepts only a full list per family, so the
    shortest exact form spells every bound as the shortest JSON number of the same float."""
    b = buckets.interactivity_buckets(20, 4000)
    value = buckets.flag_for({"inter_token_latency": b})[1]
    assert json.loads(value) == {"inter_token_latency": b}  # every bound the same float
    assert all(type(x) is float for x in json.loads(value)["inter_token_latency"])
    plain = json.dumps({"inter_token_latency": b}, separators=(",", ":"))
    assert len(value) <= len(plain) - 50, (len(value), len(plain))
    assert " " not in value and "2273e-7" in value and "8e1" in value
