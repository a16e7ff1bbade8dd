"""Profiles: shipped files, strict schema errors, edits that keep comments, atomic writes, CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimictl.cli import main
from kimictl.core.errors import InputError
from kimictl.deployment.profile_writer import update_provenance, write_profile
from kimictl.deployment.profiles import (
    diff_profiles,
    list_profiles,
    load_profile,
    scan_profiles,
    shipped_profiles_dir,
)
from kimictl.deployment.spec import FIELD_CHECKS, DeploymentSpec, k3
from kimictl.deployment.vllm_args import parse_vllm_command
from kimictl.runtime.checks.hardware import load_snapshots
from kimictl.runtime.checks.rules import evaluate
from kimictl.runtime.checks.rules.base import Status
from kimictl.runtime.checks.rules.deployment import deployment_checks, fast_path_coverage

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
K3_TUNED = ["k3-tp8-latency", "k3-tp16-latency", "k3-tp8-long-context"]
K3_ALL = K3_TUNED + [f"{name}-stock" for name in K3_TUNED]


def _gb300_for(tp: int):
    folder = SNAPSHOTS / f"gb300-tp{tp}-healthy"
    return load_snapshots(sorted(folder.glob("*.json")))


@pytest.fixture(autouse=True)
def _only_shipped_profiles(tmp_path, monkeypatch):
    # keep a user's ~/.config/kimictl/profiles out of the tests
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("KIMICTL_PROFILE_PATH", raising=False)


def test_all_shipped_profiles_load():
    good, bad = scan_profiles()
    assert bad == []
    assert {p.name for p in good} >= set(K3_ALL) | {"cpu-demo", "cpu-demo-stock"}


@pytest.mark.parametrize("name", K3_ALL)
def test_shipped_k3_profile_passes_every_rule_on_a_gb300_snapshot(name):
    profile = load_profile(name)
    hw = _gb300_for(profile.spec.tensor_parallel_size)
    assert hw.source == "simulated"
    checks = deployment_checks(profile.spec, hw)
    assert [c for c in checks if c.status in (Status.FAIL, Status.UNKNOWN)] == []
    for rule in k3.RULES:
        assert next(c for c in checks if c.id == rule.id).status is Status.PASS
    # the whole doctor verdict (hardware + fabric + deployment) on that snapshot
    assert [c for c in evaluate(profile.spec, hw, None) if c.blocking] == []


def test_shipped_k3_profiles_fail_on_the_real_h200_snapshot():
    hw = load_snapshots([SNAPSHOTS / "h200-real.json"])
    checks = deployment_checks(load_profile("k3-tp8-latency").spec, hw)
    failing = {c.id for c in checks if c.status is Status.FAIL}
    assert {"k3.gpu_arch", "k3.gpu_count"} <= failing


@pytest.mark.parametrize("name", K3_TUNED)
def test_tuned_profiles_are_the_documented_fast_path(name):
    profile = load_profile(name)
    spec = profile.spec
    assert spec.decode_backend == k3.DECODE_BACKEND_SPECIALIZED
    assert spec.speculative_method == "dspark" and spec.num_speculative_tokens == 7
    assert spec.kv_cache_dtype == "fp8"
    assert spec.env[k3.ENV_USE_V2_MODEL_RUNNER] == "1"
    assert spec.max_num_seqs == 8
    assert spec.cudagraph_capture_sizes == list(k3.PREPARED_TOKEN_BATCHES)
    assert spec.compilation_config["cudagraph_mode"] in k3.FULL_DECODE_CUDAGRAPH_MODES
    coverage = fast_path_coverage(spec)
    assert coverage.fast_requests == tuple(range(1, 9)) and coverage.missed == ()
    assert profile.stock_twin == f"{name}-stock"
    assert spec.host == "127.0.0.1"


@pytest.mark.parametrize("name", K3_TUNED + ["cpu-demo"])
def test_stock_twin_differs_only_in_decode_backend_and_port(name):
    tuned = load_profile(name)
    assert tuned.stock_twin is not None
    twin = load_profile(tuned.stock_twin)
    assert twin.stock_twin is None
    fields = {row[0] for row in diff_profiles(tuned, twin)}
    if tuned.runtime == "gpu":
        assert fields == {"additional_config.decode_backend", "port", "stock_twin"}
        assert twin.spec.decode_backend == "auto"
    else:
        assert fields == {"port", "stock_twin"}
    assert tuned.spec.with_(additional_config={}, port=None) == twin.spec.with_(
        additional_config={}, port=None
    )


def test_long_context_profile_uses_dcp_equal_to_tp():
    spec = load_profile("k3-tp8-long-context").spec
    assert spec.decode_context_parallel_size == spec.tensor_parallel_size == 8
    assert spec.max_model_len == k3.K3_SHAPES["max_context"]


def test_cpu_demo_is_the_embedded_default():
    profile = load_profile("cpu-demo")
    assert profile.runtime == "cpu"
    assert profile.spec.model == "@tiny-k2"
    assert profile.spec.enforce_eager is True
    assert 512 <= (profile.spec.max_model_len or 0) <= 1024
    assert profile.spec.host == "127.0.0.1"
    assert profile.stock_twin == "cpu-demo-stock"
    assert load_profile("cpu-demo-stock").spec.port != profile.spec.port


# ---------------------------------------------------------------- schema errors


def _copy(tmp_path: Path, name: str = "k3-tp8-latency") -> Path:
    target = tmp_path / f"{name}-copy.toml"
    shutil.copy(shipped_profiles_dir() / f"{name}.toml", target)
    return target


def _line_number(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("old", "new", "needle", "expected"),
    [
        (
            "max_num_seqs = 8",
            "max_num_seqs = 8\nmax_num_seq = 4",
            "max_num_seq = 4",
            "unknown key 'max_num_seq' in [batching]; allowed keys: max_num_seqs, ",
        ),
        (
            'cudagraph_mode = "FULL_AND_PIECEWISE"',
            'cudagraph_mode = "FULLY"',
            "FULLY",
            '[compile] cudagraph_mode = "FULLY" is not allowed; it must be "NONE" | ',
        ),
        (
            "tensor_parallel_size = 8",
            'tensor_parallel_size = "8"',
            'tensor_parallel_size = "8"',
            "it must be a whole number >= 1",
        ),
        (
            'decode_backend = "latency_specialized"',
            'decode_backend = "fast"',
            'decode_backend = "fast"',
            '"auto" | "latency_specialized"',
        ),
        (
            'VLLM_USE_V2_MODEL_RUNNER = "1"',
            "VLLM_USE_V2_MODEL_RUNNER = 1",
            "VLLM_USE_V2_MODEL_RUNNER = 1",
            '[env] VLLM_USE_V2_MODEL_RUNNER must be a string, e.g. VLLM_USE_V2_MODEL_RUNNER = "1"',
        ),
        ("[batching]", "[batchin]", "[batchin]", "unknown section [batchin]; allowed sections:"),
        ("port = 8000", "port = 99999", "port = 99999", "a port number 1-65535"),
    ],
)
def test_bad_profile_names_file_line_key_and_allowed(tmp_path, old, new, needle, expected):
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(InputError) as info:
        load_profile(path)
    message = info.value.message
    assert message.startswith(f"{path}:{_line_number(path, needle)}: ")
    assert expected in message
    assert "\n" not in message


# keys kimictl knows are checked inside the free-form inline tables too (they land in vLLM's JSON)
@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "num_speculative_tokens = 7",
            'extra = { num_speculative_tokens = "seven" }',
            '[speculative] extra.num_speculative_tokens = "seven" is not allowed; it must be a '
            "whole number >= 0 (the K3 fast path takes at most 7).",
        ),
        (
            'decode_backend = "latency_specialized"',
            'additional_config = { decode_backend = "fast" }',
            '[serve] additional_config.decode_backend = "fast" is not allowed; it must be "auto" '
            '| "latency_specialized".',
        ),
        (
            'cudagraph_mode = "FULL_AND_PIECEWISE"',
            "extra = { cudagraph_capture_sizes = [0] }",
            "[compile] extra.cudagraph_capture_sizes = [0] is not allowed; it must be a non-empty "
            "list of whole numbers >= 1, e.g. [1, 2, 4, 8].",
        ),
    ],
)
def test_wrong_value_inside_an_inline_table_names_file_line_key(tmp_path, old, new, expected):
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(InputError) as info:
        load_profile(path)
    line = _line_number(path, new)
    assert info.value.message == f"{path}:{line}: {expected}"


# (profile section, key, TOML value, command flags, DeploymentSpec field, Python value)
SAME_BOUNDS = [
    ("speculative", "num_speculative_tokens", '"seven"', "-sc.num_speculative_tokens seven",
     "speculative_config.num_speculative_tokens", "seven"),
    ("speculative", "enable_adaptive_verification", "1", "-sc.enable_adaptive_verification 1",
     "speculative_config.enable_adaptive_verification", 1),
    ("parallel", "tensor_parallel_size", "0", "-tp 0", "tensor_parallel_size", 0),
    ("batching", "gpu_memory_utilization", "1.5", "--gpu-memory-utilization 1.5",
     "gpu_memory_utilization", 1.5),
    ("compile", "optimization_level", "4", "-O4", "optimization_level", 4),
    ("model", "max_model_len", "0", "--max-model-len 0", "max_model_len", 0),
    ("model", "max_model_len", '"0k"', "--max-model-len 0k", "max_model_len", "0k"),
    ("serve", "port", "70000", "--port 70000", "port", 70000),
]  # fmt: skip
# (additional_config values: a profile refuses them; a `vllm serve` line keeps them, as vLLM's
# parser does, and the rules fail them: tests/test_deployment.py)


@pytest.mark.parametrize(("section", "key", "toml", "flags", "field", "value"), SAME_BOUNDS)
def test_profile_and_command_refuse_a_value_with_the_same_allowed_text(
    tmp_path, section, key, toml, flags, field, value
):
    with pytest.raises(ValueError) as allowed:  # the one table both entry points use
        FIELD_CHECKS[field](value)
    path = tmp_path / "p.toml"
    path.write_text(f'[model]\nname = "m"\n[{section}]\n{key} = {toml}\n')
    if section == "model":
        path.write_text(f'[model]\nname = "m"\n{key} = {toml}\n')
    with pytest.raises(InputError) as from_profile:
        load_profile(path)
    with pytest.raises(InputError) as from_command:
        parse_vllm_command(f"vllm serve m {flags}")
    assert from_profile.value.message.endswith(f"it must be {allowed.value}.")
    assert f" expects {allowed.value}, got " in from_command.value.message


def test_invalid_toml_and_missing_model(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text('[model]\nname = "x"\n[parallel\n')
    with pytest.raises(InputError, match=r"broken.toml:3: not valid TOML"):
        load_profile(broken)
    nameless = tmp_path / "nameless.toml"
    nameless.write_text("[parallel]\ntensor_parallel_size = 8\n")
    with pytest.raises(InputError, match=r"\[model\] name is required"):
        load_profile(nameless)


def test_unknown_profile_lists_known_ones():
    with pytest.raises(InputError) as info:
        load_profile("k3-tp9-latency")
    assert "Unknown profile 'k3-tp9-latency'" in info.value.message
    assert "k3-tp8-latency" in info.value.message
    with pytest.raises(InputError, match="does not exist"):
        load_profile("/nowhere/x.toml")


def test_user_folder_shadows_shipped_and_broken_files_are_listed(tmp_path, monkeypatch):
    user = tmp_path / "mine"
    user.mkdir()
    spec = load_profile("cpu-demo").spec.with_(port=9999)
    write_profile(user / "cpu-demo.toml", spec, runtime="cpu")
    (user / "typo.toml").write_text('[model]\nname = "m"\nfoo = 1\n')
    monkeypatch.setenv("KIMICTL_PROFILE_PATH", str(user))
    assert load_profile("cpu-demo").spec.port == 9999
    good, bad = scan_profiles()
    assert [b.name for b in bad] == ["typo"]
    assert "typo.toml:3: unknown key 'foo' in [model]" in bad[0].error.message
    assert "typo" not in {p.name for p in list_profiles()}


# ---------------------------------------------------------------- edits and writes


def test_update_provenance_keeps_comments_order_and_other_bytes(tmp_path):
    path = _copy(tmp_path)
    before = path.read_text()
    update_provenance(path, {"figures": "812 tok/s at batch 1", "measured_on": "2026-11-30"})
    after = path.read_text()
    head = before[: before.index('figures = "')]
    assert after.startswith(head)  # every byte before the edited key is unchanged
    assert [ln for ln in before.splitlines() if ln.startswith("#")] == [
        ln for ln in after.splitlines() if ln.startswith("#")
    ]
    profile = load_profile(path)
    assert profile.provenance["figures"] == "812 tok/s at batch 1"
    assert list(profile.provenance)[-1] == "measured_on"
    assert list(profile.provenance)[:4] == ["source", "vllm_version", "hardware", "figures"]
    assert profile.spec == load_profile("k3-tp8-latency").spec
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_update_provenance_adds_section_and_refuses_broken_file(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('# mine\n[model]\nname = "m"  # keep me\n')
    update_provenance(path, {"by": "tune", "predicted": {"tok_s": 800.0, "x": None}, "at": None})
    text = path.read_text()
    assert text.startswith('# mine\n[model]\nname = "m"  # keep me\n')
    assert load_profile(path).provenance == {"by": "tune", "predicted": {"tok_s": 800.0}}
    update_provenance(path, {"by": None, "hardware": Path("/snap.json"), "sizes": (1, 2)})
    assert load_profile(path).provenance == {
        "predicted": {"tok_s": 800.0},
        "hardware": "/snap.json",
        "sizes": [1, 2],
    }
    path.write_text('[model]\nname = "m"\nbogus = 1\n')
    with pytest.raises(InputError, match="bogus"):
        update_provenance(path, {"by": "x"})
    assert "by" not in path.read_text()


def test_write_profile_never_overwrites_silently(tmp_path):
    path = tmp_path / "new.toml"
    spec = load_profile("k3-tp8-latency").spec
    write_profile(path, spec, {"by": "test"}, stock_twin="k3-tp8-latency-stock")
    first = path.read_text()
    with pytest.raises(InputError, match="already exists"):
        write_profile(path, spec.with_(max_num_seqs=4))
    assert path.read_text() == first
    write_profile(path, spec.with_(max_num_seqs=4), overwrite=True)
    assert load_profile(path).spec.max_num_seqs == 4


@pytest.mark.parametrize("name", K3_ALL + ["cpu-demo", "cpu-demo-stock"])
def test_write_then_load_reproduces_each_shipped_profile(tmp_path, name):
    shipped = load_profile(name)
    path = write_profile(
        tmp_path / f"{name}.toml",
        shipped.spec,
        shipped.provenance,
        description=shipped.description,
        runtime=shipped.runtime,
        stock_twin=shipped.stock_twin,
    )
    again = load_profile(path)
    assert again.spec == shipped.spec
    assert (again.runtime, again.stock_twin, again.provenance) == (
        shipped.runtime,
        shipped.stock_twin,
        shipped.provenance,
    )


_spec_keys = st.sampled_from(["method", "model", "num_speculative_tokens", "custom_key"])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tp=st.sampled_from([1, 8, 16]),
    dcp=st.sampled_from([1, 8]),
    nst=st.integers(0, 9),
    seqs=st.none() | st.integers(1, 512),
    sizes=st.none() | st.lists(st.integers(1, 512), min_size=1, max_size=6),
    eager=st.booleans(),
    backend=st.sampled_from([None, "auto", "latency_specialized"]),
    env=st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), st.text(max_size=6)),
    extra=st.lists(st.sampled_from(["--trust-remote-code", "--seed", "3"]), max_size=3),
    max_len=st.none() | st.just(-1) | st.integers(1, 2**20),
)
def test_write_load_round_trip_property(
    tmp_path, tp, dcp, nst, seqs, sizes, eager, backend, env, extra, max_len
):
    spec = DeploymentSpec(
        model="moonshotai/Kimi-K3",
        tensor_parallel_size=tp,
        decode_context_parallel_size=dcp,
        speculative_config={"method": "dspark", "num_speculative_tokens": nst, "custom": [1]},
        max_num_seqs=seqs,
        compilation_config={"cudagraph_capture_sizes": sizes, "pass_config": {"x": 1}}
        if sizes
        else {},
        enforce_eager=eager,
        additional_config={"decode_backend": backend, "other": "v"} if backend else {},
        env=env,
        extra_args=extra,
        max_model_len=max_len,
    )
    path = write_profile(tmp_path / "rt.toml", spec, overwrite=True)
    assert load_profile(path).spec == spec


# ---------------------------------------------------------------- CLI


def test_cli_validate_bad_file_exits_2_with_one_sentence(tmp_path, capsys):
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace("max_num_seqs = 8", "max_num_seqs = 0"))
    assert main(["profiles", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    line = _line_number(path, "max_num_seqs = 0")
    assert err.startswith(f"error: {path}:{line}: [batching] max_num_seqs = 0 is not allowed")


@pytest.mark.parametrize("command", ["show", "validate"])
def test_cli_wrong_type_in_json_table_exits_2_with_one_sentence(tmp_path, capsys, command):
    path = _copy(tmp_path)
    new = 'extra = { num_speculative_tokens = "seven" }'
    path.write_text(path.read_text().replace("num_speculative_tokens = 7", new))
    assert main(["profiles", command, str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"error: {path}:{_line_number(path, new)}: [speculative] extra.num_speculative_tokens = "
        '"seven" is not allowed; it must be a whole number >= 0 (the K3 fast path takes at most '
        "7).\n"
    )


@pytest.mark.parametrize("command", ["show", "validate"])
def test_cli_folder_given_as_profile_exits_2_naming_it(tmp_path, capsys, command):
    folder = tmp_path / "mine.toml"
    folder.mkdir()
    assert main(["profiles", command, str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: Profile file {folder} is a folder; name a .toml file.\n"


def test_cli_toml_cut_short_says_end_of_file(tmp_path, capsys):
    path = tmp_path / "cut.toml"
    path.write_text("garbage")
    assert main(["profiles", "show", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}:1: not valid TOML (unexpected end of file).\n"


def test_cli_profile_not_utf8_exits_2(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'description = "caf\xe9"\n')
    assert main(["profiles", "show", str(path)]) == 2
    assert (
        capsys.readouterr().err == f"error: {path}: not valid TOML (not UTF-8 text at byte 18).\n"
    )


def test_cli_key_twice_in_a_table_exits_2(tmp_path, capsys):
    path = tmp_path / "twice.toml"
    path.write_text('description = "x"\n[model]\nname = "a"\nname = "b"\n')
    assert main(["profiles", "validate", str(path)]) == 2
    # tomlkit >= 0.15.3 raises this as a parse error with its line; older tomlkit without one
    try:
        tomlkit.parse(path.read_text())
        line = ""
    except tomlkit.exceptions.ParseError:
        line = ":4"
    except tomlkit.exceptions.TOMLKitError:
        line = ""
    assert capsys.readouterr().err == (
        f'error: {path}{line}: not valid TOML (Key "name" already exists).\n'
    )


def test_write_profile_refuses_a_folder_even_with_overwrite(tmp_path):
    folder = tmp_path / "new.toml"
    folder.mkdir()
    with pytest.raises(InputError, match="is a folder; name a new file"):
        write_profile(folder, load_profile("k3-tp8-latency").spec, overwrite=True)
    assert folder.is_dir()


def test_cli_validate_against_snapshots(capsys):
    tp16 = sorted(str(p) for p in (SNAPSHOTS / "gb300-tp16-healthy").glob("*.json"))
    args = ["profiles", "validate", "k3-tp16-latency", "--json"]
    assert main([*args, *[a for p in tp16 for a in ("--from-snapshot", p)]]) == 0
    ok = json.loads(capsys.readouterr().out)
    assert ok["verdict"] == "ready" and ok["schema"] == "ok"
    assert main([*args, "--from-snapshot", str(SNAPSHOTS / "h200-real.json")]) == 1
    out, err = capsys.readouterr()
    bad = json.loads(out)  # stdout: the JSON document alone; stderr: one error line
    assert err.startswith("error: profile k3-tp16-latency breaks the K3 fast-path rules: ")
    assert err.count("\n") == 1
    failing = {c["id"] for c in bad["checks"] if c["status"] == "fail"}
    assert "k3.gpu_arch" in failing
    message = next(c["message"] for c in bad["checks"] if c["id"] == "k3.gpu_arch")
    assert message.startswith("Kimi K3 specialized decode does not support this GPU (SM100/103)")


def _list_at(columns: int) -> str:
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "kimictl", "profiles", "list"],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLUMNS=str(columns)),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_list_at_80_columns_keeps_every_cell_whole():
    # the cells of the wide table (there, one row per line between the frame's bars)
    wide = _list_at(200)
    rows = [
        [cell.strip() for cell in line.strip()[1:-1].split("│")]
        for line in wide.splitlines()
        if line.startswith("│")
    ]
    assert {row[0] for row in rows} >= set(K3_ALL)
    narrow = _list_at(80)
    assert "…" not in narrow and max(len(line) for line in narrow.splitlines()) <= 80
    lines = [" ".join(line.split()) for line in narrow.splitlines()]
    for name, runtime, shape, draft, decode, twin in rows:
        # the row's facts, whole and in order on the profile's line; its twin on the next
        (i,) = [i for i, line in enumerate(lines) if line.startswith(name + " ")]
        assert lines[i] == f"{name} {runtime} {shape} {draft} {decode}", lines[i]
        if twin:
            assert lines[i + 1] == twin


def test_diff_at_80_columns_wraps_long_fields_instead_of_cutting(capsys):
    import os
    import subprocess
    import sys

    argv = ["profiles", "diff", "k3-tp8-latency", "k3-tp8-latency-stock"]
    assert main([*argv, "--json"]) == 0
    expected = [
        [str(d["field"]), str(d["a"]), str(d["b"])]
        for d in json.loads(capsys.readouterr().out)["differences"]
    ]
    done = subprocess.run(
        [sys.executable, "-m", "kimictl", *argv],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLUMNS="80"),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "…" not in done.stdout
    rows: list[list[str]] = []
    for line in done.stdout.splitlines()[3:]:  # title and header first
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip()[1:-1].split("│")]
        if rows and cells[0] and cells[1:] == ["", ""]:
            rows[-1][0] += cells[0]  # a folded field name goes on
        else:
            rows.append(cells)
    assert [[f, a.replace("None", "-"), b.replace("None", "-")] for f, a, b in expected] == rows


def test_cli_list_show_diff_json(capsys):
    assert main(["profiles", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in listed["profiles"]} >= set(K3_ALL)
    assert listed["invalid"] == []

    assert main(["profiles", "show", "k3-tp8-latency", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["command"].startswith("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve moonshotai/Kimi-K3")
    assert shown["coverage"]["q"] == 8 and shown["coverage"]["fast_requests"] == list(range(1, 9))

    assert main(["profiles", "diff", "k3-tp8-latency", "k3-tp8-latency-stock", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["differences"]
    assert {
        "field": "additional_config.decode_backend",
        "a": "latency_specialized",
        "b": "auto",
    } in (rows)


def test_cli_show_human_prints_the_launch_command(capsys):
    assert main(["profiles", "show", "k3-tp8-long-context"]) == 0
    out = capsys.readouterr().out
    assert "--decode-context-parallel-size 8" in out.replace("\n", "")
    assert "8 of 8 step" in out


@pytest.mark.parametrize("name", K3_ALL)
def test_doctor_says_ready_for_each_shipped_k3_profile_on_gb300(name, capsys):
    tp = load_profile(name).spec.tensor_parallel_size
    snaps = sorted((SNAPSHOTS / f"gb300-tp{tp}-healthy").glob("*.json"))
    args = ["doctor", "--profile", name, "--json"]
    assert main([*args, *[a for p in snaps for a in ("--from-snapshot", str(p))]]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "ready"
    assert not [c for c in report["checks"] if c["status"] == "fail"]
