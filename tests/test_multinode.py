"""Multi-node launches: the node flags kimictl accepts are the ones vLLM accepts.

Fast: each bad combination of --nnodes / --node-rank / --master-addr / --ray exits 2 with one
sentence (vLLM's own wording where vLLM refuses it too). vllm_src: the argv kimictl produces for
every rank, direct and `--ray`, goes through vLLM 0.33.0's own parser and
`create_engine_config()` (tests/vllm_src.py) and is not refused there; the argv kimictl refuses is
refused by vLLM too, with the same words.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from kimictl.cli import main
from kimictl.core.errors import InputError
from kimictl.runtime.serving import plan as plan_mod
from kimictl.runtime.serving import ray_cluster, render, workflow


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code, out, err = run_cli(capsys, "serve", *args, "--dry-run", "--json")
    assert code in (0, 1), err  # 1: no GPU here, the gate blocks; the plan is still printed
    return json.loads(out)


# ---------------------------------------------------------------- fast: bad input, exit 2


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        # vLLM: EngineArgs.create_engine_config refuses both (arg_utils.py)
        (
            ["k3-tp16-latency", "--nnodes", "3", "--master-addr", "10.0.0.1"],
            "`--nnodes 3` must evenly divide the total world size (16 = TP x PP x DP)",
        ),
        (
            ["k3-tp16-latency", "--nnodes", "4", "--node-rank", "4", "--master-addr", "10.0.0.1"],
            "`--node-rank` must be between 0 and 3; got `--node-rank 4`",
        ),
        # vLLM ignores these silently: a single node, or a master the others cannot reach
        (["k3-tp16-latency", "--node-rank", "1"], "--node-rank 1 needs --nnodes above 1"),
        (["k3-tp16-latency", "--master-addr", "10.0.0.1"], "needs --nnodes above 1"),
        (
            ["k3-tp16-latency", "--nnodes", "4", "--master-addr", "127.0.0.1"],
            "--master-addr 127.0.0.1 is a loopback address",
        ),
        (["k3-tp16-latency", "--nnodes", "4", "--master-addr", "localhost"], "loopback"),
        (["k3-tp16-latency", "--nnodes", "4", "--master-addr", "::1"], "loopback"),
        (["k3-tp16-latency", "--nnodes", "4"], "--nnodes 4 needs --master-addr"),
        (["k3-tp16-latency", "--nnodes", "0"], "--nnodes 0 is not a node count"),
        (
            ["k3-tp16-latency", "--ray", "--nnodes", "4", "--node-rank", "1"],
            "--ray runs one `vllm serve` on the Ray head node",
        ),
        (["k3-tp16-latency", "--ray", "--nnodes", "3"], "--nnodes 3 must evenly divide"),
        # a render takes ranks and rank 0's address from the scheduler
        (
            ["k3-tp16-latency", "--render", "slurm", "--master-addr", "10.0.0.1"],
            "--render writes every node's rank",
        ),
        (
            ["k3-tp16-latency", "--render", "k8s", "--nnodes", "4", "--node-rank", "2"],
            "drop --node-rank and --master-addr",
        ),
    ],
)
def test_bad_node_flags_exit_2_with_one_sentence(capsys, args, sentence):
    code, out, err = run_cli(capsys, "serve", *args, "--dry-run")
    assert code == 2, (out, err)
    assert err.startswith("error: ") and sentence in err
    assert "Traceback" not in err


def test_node_rank_above_zero_is_headless_and_lists_no_other_command(capsys):
    doc = dry_run(
        capsys, "k3-tp16-latency", "--nnodes", "4", "--node-rank", "2", "--master-addr", "10.0.0.1"
    )
    (run,) = doc["runs"]
    assert run["argv"][-7:] == [
        "--nnodes",
        "4",
        "--master-addr",
        "10.0.0.1",
        "--node-rank",
        "2",
        "--headless",
    ]
    # the others: rank 1 and 3 headless; rank 0 serves the API and is not a "headless" command
    assert [a[a.index("--node-rank") + 1] for a in run["other_nodes"]] == ["1", "3"]


def test_ray_with_nnodes_leaves_the_node_flags_out(capsys):
    # vLLM: "nnodes > 1 can only be set when distributed executor backend is mp, uni or
    # external_launcher." Ray places the ranks from the head node.
    (run,) = dry_run(capsys, "k3-tp16-latency", "--ray", "--nnodes", "4")["runs"]
    argv = run["argv"]
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(argv)
    assert run["other_nodes"] == []


def test_ray_launch_joins_the_running_cluster_and_probes_its_peers(monkeypatch):
    # kimictl gives each run its own TMPDIR, which hides the address file `ray start` writes:
    # without RAY_ADDRESS vLLM would start a private one-node Ray inside the run folder
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    request = workflow.ServeRequest(profile="k3-tp16-latency", ray=True, nnodes=4)
    (plan,) = workflow.prepare_serve(request).plans
    assert plan.env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert plan.ray and plan.leads_other_nodes  # the launcher's peer probe watches Ray's ranks
    (plain,) = workflow.prepare_serve(workflow.ServeRequest(profile="k3-tp8-latency")).plans
    assert "RAY_ADDRESS" not in plain.env and not plain.ray and not plain.leads_other_nodes


def test_ray_address_is_the_operators_or_the_one_ray_start_wrote(tmp_path):
    assert ray_cluster.address_env({}, tmp_path) == "auto"  # Ray then says no cluster runs
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.1:6379\n")
    assert ray_cluster.address_env({}, tmp_path) == "10.0.0.1:6379"
    assert ray_cluster.address_env({"RAY_ADDRESS": "head:6380"}, tmp_path) == "head:6380"


def test_ray_on_the_cpu_runtime_needs_kimictls_fixups(capsys, monkeypatch):
    # vLLM 0.32's CpuPlatform has no ray_device_key; tests/test_multihost_ray.py shows it, and
    # serves through a real two-node Ray cluster with the fix-ups `setup cpu-runtime --ray` adds
    from kimictl.runtime.serving import cpu_runtime

    monkeypatch.setattr(cpu_runtime, "ray_ready", lambda: False)
    for extra in ([], ["--render", "slurm"]):
        code, _, err = run_cli(capsys, "serve", "cpu-demo-tp2", "--ray", "--dry-run", *extra)
        assert code == 1, err
        assert err.startswith("error: vLLM 0.32's CPU build cannot run the Ray executor")
        assert "kimictl setup cpu-runtime --ray" in err and "Traceback" not in err
    if not cpu_runtime.is_installed():
        return  # the plan below resolves the tiny model inside the runtime
    monkeypatch.setattr(cpu_runtime, "ray_ready", lambda: True)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    (run,) = dry_run(capsys, "cpu-demo-tp2", "--ray", "--nnodes", "2")["runs"]
    assert run["env"]["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert run["argv"][run["argv"].index("--distributed-executor-backend") + 1] == "ray"


def test_render_with_nnodes_asks_for_no_master_and_adds_the_node_flags_once(capsys, tmp_path):
    out = tmp_path / "job.sbatch"
    code, _, err = run_cli(
        capsys,
        "serve",
        "k3-tp8-latency",
        "--render",
        "slurm",
        "--nnodes",
        "2",
        "-o",
        str(out),
        "--weights-path",
        "/lustre/models",
    )
    assert code == 0, err
    script = out.read_text()
    assert script.count("--nnodes") == 1 and script.count("--node-rank") == 1
    assert "--master-addr" in script and "10.0.0.1" not in script


def test_check_nodes_accepts_host_names_and_single_node():
    plan_mod.check_nodes(nnodes=1, node_rank=0, master_addr=None, world_size=16)
    plan_mod.check_nodes(nnodes=4, node_rank=3, master_addr="tray-0.rack", world_size=16)
    plan_mod.check_nodes(nnodes=2, node_rank=1, master_addr="10.77.0.1", world_size=2)
    with pytest.raises(InputError) as refused:
        plan_mod.check_nodes(nnodes=3, node_rank=0, master_addr="10.0.0.1", world_size=16)
    assert refused.value.hint == "allowed --nnodes: 1, 2, 4, 8, 16."


# ---------------------------------------------------------------- vllm_src: vLLM 0.33's own verdict


def _words(argv: list[str], model: Path, draft: Path) -> list[str]:
    """kimictl's argv as vLLM's parser sees it: after `vllm serve`, with the checkpoints swapped
    for config-only folders (vLLM reads config.json while building the engine config)."""
    assert argv[1] == "serve"
    words = [str(model), *argv[3:]]
    i = words.index("--speculative-config")
    spec = json.loads(words[i + 1])
    spec["model"] = str(draft)
    words[i + 1] = json.dumps(spec)
    return words


@pytest.mark.vllm_src
def test_vllm_accepts_every_rank_and_refuses_what_kimictl_refuses(tmp_path):
    import vllm_cases
    import vllm_src
    from test_doctor_vs_vllm import VllmWorker

    sources, why = vllm_src.ensure_sources()
    if sources is None:
        pytest.skip(f"vLLM {vllm_src.VLLM_VERSION} sources unavailable: {why}")
    models = vllm_cases.make_models(tmp_path / "models")

    def deployment(**request) -> vllm_cases.Deployment:
        prepared = workflow.prepare_serve(
            workflow.ServeRequest(profile="k3-tp16-latency", **request)
        )
        (plan,) = prepared.plans
        env = {k: v for k, v in plan.env.items() if k != "TMPDIR"}
        return vllm_cases.Deployment(
            _words(plan.argv, models["k3"], models["k3-dspark-draft"]), env
        )

    accepted = [
        deployment(nnodes=4, node_rank=rank, master_addr="10.0.0.1") for rank in range(4)
    ] + [deployment(nnodes=2, node_rank=1, master_addr="10.0.0.1"), deployment(ray=True, nnodes=4)]
    # the rendered LeaderWorkerSet's commands, as the kubelet expands them
    for ray in (False, True):
        prepared = workflow.prepare_serve(
            workflow.ServeRequest(profile="k3-tp16-latency", for_render="k8s", ray=ray)
        )
        text = render.render(prepared.plans[0], "k8s", insecure=True, cluster=prepared.cluster)
        (lws,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "LeaderWorkerSet"]
        group = lws["spec"]["leaderWorkerTemplate"]
        for template in (group["leaderTemplate"], group["workerTemplate"]):
            (ctr,) = template["spec"]["containers"]
            words = ctr["command"] + ctr["args"]
            if words[:2] == ["sh", "-c"]:  # Ray leader: `ray start ... && exec vllm serve ...`
                words = shlex.split(words[2].split(" && exec ", 1)[1])
            elif words[0] == "ray":
                continue  # a Ray worker runs no vLLM
            words = [
                w.replace(
                    "$(LWS_LEADER_ADDRESS)", "k3-tp16-latency-0.k3-tp16-latency.default"
                ).replace("$(LWS_WORKER_INDEX)", "3")
                for w in words
            ]
            env = {e["name"]: e["value"] for e in ctr["env"] if "value" in e}
            dep = vllm_cases.Deployment(_words(words, models["k3"], models["k3-dspark-draft"]), env)
            accepted.append(dep)
    assert len(accepted) == 6 + 3
    # what kimictl refuses, as the argv would have been without the check
    base = deployment()
    refused = {
        "`--nnodes 3` must evenly divide the total world size (16)": vllm_cases.Deployment(
            [*base.words, "--nnodes", "3", "--master-addr", "10.0.0.1"], base.env
        ),
        "`--node-rank` must be between 0 and 3; got `--node-rank 4`": vllm_cases.Deployment(
            [*base.words, "--nnodes", "4", "--node-rank", "4", "--master-addr", "10.0.0.1"],
            base.env,
        ),
        "nnodes > 1 can only be set when distributed executor backend is mp": vllm_cases.Deployment(
            [*base.words, "--distributed-executor-backend", "ray", "--nnodes", "4"], base.env
        ),
    }
    worker = VllmWorker()
    try:
        verdicts = worker.verdicts([*accepted, *refused.values()])
    finally:
        worker.close()
    for dep, verdict in zip(accepted, verdicts, strict=False):
        assert verdict["outcome"] in ("ready", "not_ready"), (dep.words[-8:], verdict)
    for (words, dep), verdict in zip(refused.items(), verdicts[len(accepted) :], strict=True):
        assert verdict["outcome"] == "refused", (dep.words[-8:], verdict)
        assert words in verdict["message"], verdict["message"]
