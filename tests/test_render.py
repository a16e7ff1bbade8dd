"""`serve --render slurm|k8s`: the files parse, and carry the same argv/env as a direct launch."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimictl.cli import main
from kimictl.runtime.errors import InputError
from kimictl.runtime.serving import render, workflow
from kimictl.runtime.serving.plan import LaunchPlan


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def _plan(profile: str) -> LaunchPlan:
    prepared = workflow.prepare_serve(workflow.ServeRequest(profile=profile, for_render=True))
    assert prepared.blocking == [], [c.message for c in prepared.blocking]
    return prepared.plans[0]


def _bash_array(script: str, name: str) -> list[str]:
    """Evaluate the script's `NAME=( ... )` with bash itself and return its words."""
    lines = script.splitlines()
    start = lines.index(f"{name}=(")
    end = lines.index(")", start)
    snippet = "\n".join(lines[start : end + 1]) + f'\nprintf "%s\\0" "${{{name}[@]}}"'
    out = subprocess.run(["bash", "-c", snippet], capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


def _exports(script: str) -> dict[str, str]:
    snippet = "\n".join(line for line in script.splitlines() if line.startswith("export "))
    snippet = snippet.replace('export VLLM_API_KEY="${VLLM_API_KEY:?', "#")
    out = subprocess.run(
        ["env", "-i", "bash", "-c", snippet + "\nenv -0"], capture_output=True, check=True
    ).stdout
    pairs = (item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k not in ("PWD", "SHLVL", "_")}


@pytest.mark.parametrize(("profile", "nodes"), [("k3-tp8-latency", 2), ("k3-tp16-latency", 4)])
def test_slurm_script_parses_and_carries_the_launch(tmp_path, profile, nodes):
    plan = _plan(profile)
    script = render.render(plan, "slurm")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert _bash_array(script, "VLLM_ARGV") == plan.argv
    expected_env = {k: v for k, v in plan.env.items() if k != "TMPDIR"}
    assert _exports(script) == expected_env
    assert f"#SBATCH --nodes={nodes}" in script
    assert f"#SBATCH --gpus-per-node={plan.gpus // nodes}" in script
    assert "--headless" in script and f"--nnodes {nodes}" in script


def test_k8s_leaderworkerset_parses_and_carries_the_launch():
    plan = _plan("k3-tp16-latency")
    doc = yaml.safe_load(render.render(plan, "k8s", api_key=True))
    assert (doc["apiVersion"], doc["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    group = doc["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 4
    leader = group["leaderTemplate"]["spec"]["containers"][0]
    worker = group["workerTemplate"]["spec"]["containers"][0]
    node_flags = ["--nnodes", "4", "--master-addr", "$(LWS_LEADER_ADDRESS)", "--node-rank"]
    assert leader["command"] + leader["args"] == [*plan.argv, *node_flags, "0"]
    assert worker["command"] + worker["args"] == [
        *plan.argv,
        *node_flags,
        "$(LWS_WORKER_INDEX)",
        "--headless",
    ]
    env = {e["name"]: e.get("value") for e in leader["env"]}
    assert {k: v for k, v in env.items() if k != "VLLM_API_KEY"} == {
        k: v for k, v in plan.env.items() if k != "TMPDIR"
    }
    key = next(e for e in leader["env"] if e["name"] == "VLLM_API_KEY")
    assert "value" not in key and key["valueFrom"]["secretKeyRef"]["key"] == "key"
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert leader["readinessProbe"]["httpGet"]["port"] == plan.port


def test_render_rejects_bad_format_and_uneven_split():
    plan = _plan("k3-tp8-latency")
    with pytest.raises(InputError, match="allowed: slurm, k8s"):
        render.render(plan, "nomad")
    with pytest.raises(
        InputError, match="do not split evenly over 3 nodes; allowed --nnodes: 1, 2"
    ):
        render.render(plan, "slurm", nnodes=3)


def test_cli_render_writes_the_file(tmp_path, capsys):
    out = tmp_path / "lws.yaml"
    assert main(["serve", "k3-tp8-latency", "--render", "k8s", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["kind"] == "LeaderWorkerSet"
    assert main(["serve", "k3-tp8-latency", "--render", "nomad"]) == 2
    assert "allowed: slurm, k8s" in capsys.readouterr().err


_scalars = st.one_of(
    st.text(max_size=20),
    st.integers(),
    st.booleans(),
    st.none(),
    st.sampled_from(["on", "1", "$(X)", "a: b", "- x", "#c"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=10), inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(min_size=1, max_size=8), _values, max_size=5))
def test_to_yaml_round_trips_through_a_yaml_parser(value):
    assert yaml.safe_load(render.to_yaml(value)) == value
