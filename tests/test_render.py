"""`serve --render slurm|k8s`: each file is what its engine accepts, and carries the launch.

k8s: every object is checked against the schema the API server uses (tests/k8s_schemas.py: the
LWS and ComputeDomain CRDs, Kubernetes v1.34's core OpenAPI), then for what a GB300 NVL72
deployment needs that a schema cannot say (bind, key, /dev/shm, IMEX, clique, Service, weights).
slurm: bash parses the script and evaluates its arrays and exports; the node flags are vLLM's.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import k8s_schemas
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimictl.cli import main
from kimictl.core.errors import InputError
from kimictl.deployment.cluster import ClusterSettings
from kimictl.runtime.serving import render, workflow
from kimictl.runtime.serving.plan import LaunchPlan

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-render-test-0123456789"


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def _prepared(profile: str, fmt: str = "k8s", **request: Any) -> workflow.Prepared:
    prepared = workflow.prepare_serve(
        workflow.ServeRequest(profile=profile, for_render=fmt, **request)
    )
    assert prepared.blocking == [], [c.message for c in prepared.blocking]
    return prepared


SHARED = "/lustre/models"  # a path every node mounts: what a multi-node render needs for weights


def _plan(profile: str, fmt: str = "k8s", **request: Any) -> LaunchPlan:
    return _prepared(profile, fmt, **request).plans[0]


def _objects(text: str) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(text))
    return {d["kind"]: d for d in docs}


def _k8s(profile: str, *, key: str | None = KEY, **kw: Any) -> dict[str, dict[str, Any]]:
    prepared = _prepared(profile, "k8s", ray=kw.pop("ray", False))
    plan = prepared.plans[0]
    if key is not None:
        from dataclasses import replace

        plan = replace(plan, env={**plan.env, "VLLM_API_KEY": key})
    kw.setdefault("cluster", prepared.cluster)
    return _objects(render.render(plan, "k8s", **kw))


def _pods(objs: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    group = objs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    return group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]


def _bash_array(script: str, name: str) -> list[str]:
    """Evaluate the script's `NAME=( ... )` with bash itself and return its words."""
    lines = script.splitlines()
    start = lines.index(f"{name}=(")
    end = lines.index(")", start)
    snippet = "\n".join(lines[start : end + 1]) + f'\nprintf "%s\\0" "${{{name}[@]}}"'
    out = subprocess.run(["bash", "-c", snippet], capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


def _exports(script: str, env: dict[str, str] | None = None) -> dict[str, str]:
    snippet = "\n".join(line for line in script.splitlines() if line.startswith("export "))
    snippet = snippet.replace("export MASTER_NODE MASTER_ADDR", "")
    out = subprocess.run(
        [
            "env",
            "-i",
            *(f"{k}={v}" for k, v in (env or {}).items()),
            "bash",
            "-c",
            snippet + "\nenv -0",
        ],
        capture_output=True,
        check=False,
    )
    pairs = (item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k not in ("PWD", "SHLVL", "_")}


def _bound_all(argv: list[str]) -> list[str]:
    out = list(argv)
    out[out.index("--host") + 1] = "0.0.0.0"
    return out


def _profile_copy(tmp_path: Path, name: str, cluster: str, base: str = "k3-tp8-latency") -> Path:
    text = (ROOT / "profiles" / f"{base}.toml").read_text()
    start = text.index("[cluster]")
    end = text.index("\n[", start + 1)
    path = tmp_path / f"{name}.toml"
    path.write_text(text[:start] + "[cluster]\n" + cluster + text[end:])
    return path


# ---------------------------------------------------------------- k8s: schemas


@pytest.mark.parametrize("profile", ["k3-tp8-latency", "k3-tp16-latency", "k3-tp8-long-context"])
@pytest.mark.parametrize(
    "variant",
    ["rendered-secret", "named-secret", "insecure", "ray", "nnodes-8", "host-path"],
)
def test_every_k8s_render_validates_against_the_api_schemas(tmp_path, profile, variant):
    kw: dict[str, Any] = {}
    key: str | None = KEY
    if variant == "named-secret":
        kw["api_key_secret"] = "team-vllm-key"
    elif variant == "insecure":
        key, kw["insecure"] = None, True
    elif variant == "ray":
        kw["ray"] = True
    elif variant == "nnodes-8":
        kw["nnodes"] = 8
    elif variant == "host-path":
        kw["cluster"] = ClusterSettings(weights_path="/raid/models", cpu="32", memory="1Ti")
    objs = _k8s(profile, key=key, **kw)
    for obj in objs.values():
        assert k8s_schemas.errors(obj) == [], (obj["kind"], k8s_schemas.errors(obj))


def test_schemas_catch_what_the_api_server_refuses_or_prunes():
    objs = _k8s("k3-tp16-latency")
    lws = objs["LeaderWorkerSet"]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    leader["containers"][0]["resources"]["claim"] = leader["containers"][0]["resources"].pop(
        "claims"
    )
    errors = k8s_schemas.errors(lws)
    assert any("resources.claim: pruned" in e for e in errors), errors
    assert any("'claim' was unexpected" in e for e in errors), errors
    objs["ComputeDomain"]["spec"]["channel"]["allocationMode"] = "Many"
    assert k8s_schemas.errors(objs["ComputeDomain"])


# ---------------------------------------------------------------- k8s: what GB300 NVL72 needs


def test_leader_binds_every_interface_and_its_probes_reach_the_port():
    # was: --host 127.0.0.1 with an httpGet probe on the pod IP: never Ready
    leader, _ = _pods(_k8s("k3-tp16-latency"))
    (ctr,) = leader["containers"]
    words = ctr["command"] + ctr["args"]
    assert words[words.index("--host") + 1] == "0.0.0.0"
    (port,) = ctr["ports"]
    assert words[words.index("--port") + 1] == str(port["containerPort"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ctr[probe]["httpGet"] == {"path": "/health", "port": port["name"]}


def test_api_key_comes_from_a_rendered_or_named_secret_and_never_sits_in_argv():
    objs = _k8s("k3-tp8-latency")
    secret = objs["Secret"]
    assert secret["stringData"] == {"key": KEY}
    for pod in _pods(objs):
        (ctr,) = pod["containers"]
        (ref,) = [e for e in ctr["env"] if e["name"] == "VLLM_API_KEY"]
        assert ref == {
            "name": "VLLM_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "key"}},
        }
        assert KEY not in ctr["args"]
    named = _k8s("k3-tp8-latency", key=None, api_key_secret="team-vllm-key")
    assert "Secret" not in named
    (ctr,) = _pods(named)[0]["containers"]
    (ref,) = [e for e in ctr["env"] if e["name"] == "VLLM_API_KEY"]
    assert ref["valueFrom"]["secretKeyRef"]["name"] == "team-vllm-key"


def test_no_key_is_refused_unless_insecure():
    plan = _plan("k3-tp8-latency")
    with pytest.raises(InputError, match="bind 0.0.0.0") as refused:
        render.render(plan, "k8s", weights_path=SHARED)
    assert "--api-key-secret" in (refused.value.hint or "")
    objs = _objects(render.render(plan, "k8s", insecure=True, weights_path=SHARED))
    assert "Secret" not in objs
    (ctr,) = _pods(objs)[0]["containers"]
    assert all(e["name"] != "VLLM_API_KEY" for e in ctr["env"])


def test_dev_shm_is_a_memory_volume_in_every_pod():
    # vLLM refuses to start with a container's 64 MiB /dev/shm
    for pod in _pods(_k8s("k3-tp16-latency")):
        (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
        (ctr,) = pod["containers"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in ctr["volumeMounts"]


def test_each_pod_claims_an_imex_channel_of_one_compute_domain():
    objs = _k8s("k3-tp16-latency")
    cd = objs["ComputeDomain"]
    template = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    for pod in _pods(objs):
        (claim,) = pod["resourceClaims"]
        assert claim["resourceClaimTemplateName"] == template
        (ctr,) = pod["containers"]
        assert ctr["resources"]["claims"] == [{"name": claim["name"]}]
        assert ctr["resources"]["limits"]["nvidia.com/gpu"] == 4


def test_all_pods_are_held_in_one_nvlink_clique():
    objs = _k8s("k3-tp16-latency")
    name = objs["LeaderWorkerSet"]["metadata"]["name"]
    for pod in _pods(objs):
        affinity = pod["affinity"]
        (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.clique", "operator": "Exists"}]
        (pod_term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert pod_term["topologyKey"] == "nvidia.com/gpu.clique"
        assert pod_term["labelSelector"]["matchLabels"] == {
            "leaderworkerset.sigs.k8s.io/name": name
        }


def test_a_single_node_deployment_needs_no_imex_and_no_clique():
    objs = _k8s("k3-tp8-latency", gpus_per_node=8)  # an 8-GPU node: TP8 fits one node
    assert "ComputeDomain" not in objs
    leader, _ = _pods(objs)
    assert "affinity" not in leader and "resourceClaims" not in leader
    assert objs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["size"] == 1


def test_leader_service_routes_the_api_port_to_the_leader():
    objs = _k8s("k3-tp16-latency")
    svc = objs["Service"]
    name = objs["LeaderWorkerSet"]["metadata"]["name"]
    assert svc["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": name, "role": "leader"}
    leader = objs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    assert leader["metadata"]["labels"]["role"] == "leader"
    (port,) = svc["spec"]["ports"]
    (ctr,) = leader["spec"]["containers"]
    assert port["port"] == ctr["ports"][0]["containerPort"] and port["targetPort"] == "http"


def test_weights_come_from_the_profiles_volume_read_offline():
    objs = _k8s("k3-tp16-latency")  # the shipped profile: PVC kimi-k3-weights
    for pod in _pods(objs):
        (vol,) = [v for v in pod["volumes"] if v["name"] == "weights"]
        assert vol["persistentVolumeClaim"] == {"claimName": "kimi-k3-weights", "readOnly": True}
        (ctr,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in ctr["env"]}
        assert env["HF_HOME"] == "/models/hf" and env["HF_HUB_OFFLINE"] == "1"
        assert {"name": "weights", "mountPath": "/models", "readOnly": True} in ctr["volumeMounts"]
        assert ctr["resources"]["requests"] == {"cpu": "64", "memory": "512Gi"}
    host = _k8s("k3-tp16-latency", cluster=ClusterSettings(weights_path="/raid/models"))
    (vol,) = [v for v in _pods(host)[0]["volumes"] if v["name"] == "weights"]
    assert vol["hostPath"] == {"path": "/raid/models", "type": "Directory"}


def test_rank_flags_are_vllms_and_appear_once():
    leader, worker = _pods(_k8s("k3-tp16-latency"))
    plan = _plan("k3-tp16-latency")
    node = ["--nnodes", "4", "--master-addr", "$(LWS_LEADER_ADDRESS)", "--node-rank"]
    (lc,) = leader["containers"]
    (wc,) = worker["containers"]
    assert lc["command"] + lc["args"] == [*_bound_all(plan.argv), *node, "0"]
    assert wc["command"] + wc["args"] == [
        *_bound_all(plan.argv),
        *node,
        "$(LWS_WORKER_INDEX)",
        "--headless",
    ]
    env = {e["name"]: e.get("value") for e in lc["env"] if "value" in e}
    assert {k: v for k, v in env.items() if not k.startswith("HF_")} == {
        k: v for k, v in plan.env.items() if k != "TMPDIR"
    }


def test_ray_render_starts_a_ray_cluster_and_gives_vllm_no_node_flags():
    leader, worker = _pods(_k8s("k3-tp16-latency", ray=True))
    (lc,) = leader["containers"]
    (wc,) = worker["containers"]
    assert lc["command"] == ["sh", "-c"]
    script = lc["args"][0]
    assert script.startswith("ray start --head --port=6379 && python3 -c ")
    assert "--distributed-executor-backend ray" in script
    assert "--nnodes" not in script and "--node-rank" not in script
    assert wc["command"] + wc["args"] == [
        "ray",
        "start",
        "--address=$(LWS_LEADER_ADDRESS):6379",
        "--block",
    ]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("K3_TP16", "lowercase letters, digits and '-'"),
        ("1-k3", "starting with a letter"),
        ("k3-" + "x" * 50, "53 characters, at most 45"),
    ],
)
def test_profile_names_must_be_kubernetes_names(tmp_path, capsys, name, why, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    path = _profile_copy(tmp_path, name, 'weights_pvc = "w"\n')
    assert main(["serve", str(path), "--render", "k8s"]) == 2
    err = capsys.readouterr().err
    assert f"profile name '{name}' cannot name Kubernetes objects" in err and why in err


def test_cluster_table_is_checked_by_line(tmp_path, capsys):
    path = _profile_copy(tmp_path, "k3-bad", 'weights_pvc = "a"\nweights_path = "/b"\n')
    assert main(["profiles", "show", str(path)]) == 2
    assert "[cluster] needs one weights volume" in capsys.readouterr().err
    path = _profile_copy(tmp_path, "k3-bad2", 'memory = "lots"\n')
    assert main(["profiles", "show", str(path)]) == 2
    assert '[cluster] memory = "lots" is not allowed' in capsys.readouterr().err


# ---------------------------------------------------------------- slurm


@pytest.mark.parametrize(("profile", "nodes"), [("k3-tp8-latency", 2), ("k3-tp16-latency", 4)])
def test_slurm_script_parses_and_carries_the_launch(tmp_path, profile, nodes):
    plan = _plan(profile, "slurm")
    script = render.render(plan, "slurm", weights_path=SHARED)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert _bash_array(script, "VLLM_ARGV") == _bound_all(plan.argv)
    expected_env = {k: v for k, v in plan.env.items() if k != "TMPDIR"}
    expected_env |= {"HF_HOME": f"{SHARED}/hf", "HF_HUB_OFFLINE": "1", "VLLM_API_KEY": KEY}
    assert _exports(script, {"VLLM_API_KEY": KEY}) == expected_env
    assert f"#SBATCH --nodes={nodes}" in script
    assert f"#SBATCH --gpus-per-node={plan.gpus // nodes}" in script
    assert script.count("--nnodes") == 1 and f"--nnodes {nodes}" in script


def test_slurm_binds_where_it_says_the_api_is_and_needs_the_key_at_submit():
    script = render.render(_plan("k3-tp16-latency", "slurm"), "slurm", weights_path=SHARED)
    argv = _bash_array(script, "VLLM_ARGV")
    assert argv[argv.index("--host") + 1] == "0.0.0.0"  # was 127.0.0.1 on rank 0
    assert 'echo "API: http://$MASTER_ADDR:8000' in script
    # the key is read from sbatch's environment: without it the job stops at once
    assert _exports(script) == {}
    assert "VLLM_API_KEY" not in _exports(script) and "sk-" not in script


def test_slurm_takes_whole_nodes_ends_on_one_failure_and_checks_imex():
    script = render.render(_plan("k3-tp16-latency", "slurm"), "slurm", weights_path=SHARED)
    assert "#SBATCH --mem=0" in script.splitlines()
    steps = [line for line in script.splitlines() if line.startswith("srun ")]
    assert steps and all("--kill-on-bad-exit=1" in line for line in steps)
    assert "test -e /dev/nvidia-caps-imex-channels/channel0" in steps[0]
    single = render.render(_plan("k3-tp8-latency", "slurm"), "slurm", gpus_per_node=8)
    assert "imex" not in single.lower()


def test_slurm_cpu_profile_takes_one_cpu_node_per_rank_and_no_gpu(tmp_path):
    plan = _plan("cpu-demo-tp2", "slurm")  # TP2, one rank per host (tests/test_multihost_slurm)
    script = render.render(plan, "slurm")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    lines = script.splitlines()
    assert "#SBATCH --nodes=2" in lines  # was 1: both ranks on one node, --nnodes 1
    assert script.count("--nnodes") == 1 and "--nnodes 2" in script
    assert not [line for line in lines if "gpu" in line.lower() and line.startswith("#SBATCH")]
    assert "imex" not in script.lower()
    assert "#SBATCH --mem=0" in lines
    steps = [line for line in lines if line.startswith("srun ")]
    assert len(steps) == 1 and "--kill-on-bad-exit=1" in steps[0]
    assert _bash_array(script, "VLLM_ARGV") == _bound_all(plan.argv)
    # a node count that does not divide the ranks is refused; one node runs both ranks
    with pytest.raises(InputError, match="2 ranks do not split evenly over 3 nodes"):
        render.render(plan, "slurm", nnodes=3)
    assert "#SBATCH --nodes=1" in render.render(_plan("cpu-demo", "slurm"), "slurm")


def test_slurm_cpu_caches_are_node_local_and_vllm_runs_at_the_cpu_launchs_nice():
    plan = _plan("cpu-demo-tp2", "slurm")
    assert "VLLM_CACHE_ROOT" in plan.env  # the local launch keeps them in its run folder
    script = render.render(plan, "slurm")
    env = _exports(script, {"VLLM_API_KEY": KEY, "SLURM_JOB_ID": "7", "TMPDIR": "/scratch"})
    assert env["VLLM_CACHE_ROOT"] == "/scratch/kimictl-job-7/vllm-cache"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/kimictl-job-7/inductor"
    # nothing of the rendering host's run folder (a path on the submit host) reaches the job
    assert str(plan.run_dir) not in script and plan.run_id not in script
    assert f'exec nice -n {plan.nice} "$0" "$@"' in script and plan.nice == 10
    gpu = render.render(_plan("k3-tp8-latency", "slurm"), "slurm", weights_path=SHARED)
    assert "nice" not in gpu and "VLLM_CACHE_ROOT" not in gpu


def test_slurm_master_is_the_first_nodes_address_not_its_name(tmp_path):
    """Slurm reaches a node at its NodeAddr; its name may resolve nowhere on the other nodes
    (the real run's node names do not: vLLM's rendezvous on rank 1 then retried forever)."""
    script = render.render(_plan("cpu-demo-tp2", "slurm"), "slurm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Slurm's answers on the two-host test cluster (node names kmh-a, kmh-b; NodeAddr
    # 10.77.0.x), a line per write as a long node list comes (or a node in two partitions):
    # the script must read them all
    fakes = {  # (the arguments the script must pass, its two lines)
        "scontrol": ("show hostnames kmh-[a-b]", "kmh-a", "kmh-b"),
        "sinfo": ("-h -N -n kmh-a -o %o", "10.77.0.1", "10.77.0.1"),
    }
    for name, (args, first, second) in fakes.items():
        body = f'[ "$*" = "{args}" ] && echo {first} && sleep .2 && echo {second}'
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("MASTER_NODE="))
    end = next(i for i, line in enumerate(lines) if line.startswith('echo "API:'))
    snippet = "\n".join(["set -euo pipefail", *lines[start : end + 1]])
    out = subprocess.run(
        ["bash", "-c", snippet],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "kmh-[a-b]"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "API: http://10.77.0.1:8100 (model tiny-k2)\n"  # was http://kmh-a:8100


@pytest.mark.parametrize("profile", ["k3-tp8-latency", "k3-tp16-latency", "k3-tp8-long-context"])
def test_multi_node_slurm_never_lets_every_node_download_the_model(profile, capsys, monkeypatch):
    """The GB300 profiles name a PVC (k8s): under Slurm each of 2-4 nodes would fetch 1.5 TB
    itself; the render is refused until a shared path is given, then reads it offline."""
    plan = _plan(profile, "slurm")
    with pytest.raises(InputError, match="every node download moonshotai/Kimi-K3") as refused:
        render.render(plan, "slurm")  # the profile's [cluster]: weights_pvc only
    assert "[cluster] weights_path" in refused.value.message
    assert "--weights-path" in (refused.value.hint or "")
    script = render.render(plan, "slurm", cluster=ClusterSettings(weights_path="/lustre/models"))
    env = _exports(script, {"VLLM_API_KEY": KEY})
    assert env["HF_HOME"] == "/lustre/models/hf" and env["HF_HUB_OFFLINE"] == "1"
    # the flag replaces the profile's PVC for this render
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    argv = ["serve", profile, "--render", "slurm", "--weights-path", "/gpfs/k3"]
    assert main(argv) == 0
    assert "export HF_HOME=/gpfs/k3/hf" in capsys.readouterr().out
    assert main(["serve", profile, "--render", "slurm", "--weights-path", "gpfs/k3"]) == 2
    assert "error: --weights-path 'gpfs/k3' is not allowed; it must be an absolute path" in (
        capsys.readouterr().err
    )
    assert main(["serve", profile, "--weights-path", "/gpfs/k3", "--dry-run"]) == 2
    assert "--weights-path goes with --render" in capsys.readouterr().err


def test_one_node_or_a_model_path_renders_without_a_shared_volume():
    single = render.render(_plan("k3-tp8-latency", "slurm"), "slurm", gpus_per_node=8)
    assert "the node fills its own Hugging Face cache" in single
    assert "HF_HUB_OFFLINE" not in _exports(single, {"VLLM_API_KEY": KEY})
    # a model path (`serve --model /lustre/k3`) is read on every node: offline, never the hub
    from dataclasses import replace

    hub = _plan("k3-tp8-latency", "slurm")
    plan = replace(hub, argv=[*hub.argv[:2], "/lustre/k3", *hub.argv[3:]])
    script = render.render(plan, "slurm")
    assert "# The model is read from /lustre/k3 on every node" in script
    assert _exports(script, {"VLLM_API_KEY": KEY})["HF_HUB_OFFLINE"] == "1"
    k8s = _objects(render.render(plan, "k8s", insecure=True))
    (ctr,) = _pods(k8s)[1]["containers"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in ctr["env"]
    # a k8s render of a hub model over two pods needs the PVC or a path, as Slurm does
    with pytest.raises(InputError, match="weights_pvc or weights_path"):
        render.render(_plan("k3-tp8-latency"), "k8s", insecure=True, cluster=ClusterSettings())


def test_slurm_ray_runs_one_server_on_a_ray_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # the rendering machine's own cluster
    plan = _plan("k3-tp16-latency", "slurm", ray=True)
    script = render.render(plan, "slurm", weights_path=SHARED)
    assert "127.0.0.1:6379" not in script
    # vLLM joins the job's cluster by address, whatever temp folder its node gives it
    assert 'export RAY_ADDRESS="$MASTER_ADDR:6379"' in script
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    argv = _bash_array(script, "VLLM_ARGV")
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert "--nnodes" not in script and "--node-rank" not in script
    assert "ray start --head" in script and 'ray start --address="$MASTER_ADDR:6379"' in script
    # the wait for the Ray nodes is Python that compiles, as bash hands it over
    start = script.index("python3 -c ")
    end = script.index("\n", script.index("sys.exit('", start))
    code = subprocess.run(
        ["bash", "-c", "printf %s " + script[start + len("python3 -c ") : end]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    compile(code, "ray-wait", "exec")
    assert "ray.nodes()" in code and ">= 4" in code


def test_slurm_ray_on_cpu_nodes_uses_the_runtimes_ray_one_cpu_a_node(tmp_path):
    """On CPU nodes Ray must be the CPU runtime's (vLLM CPU 0.32 needs kimictl's fix-ups in that
    venv) and each node offers one CPU: vLLM packs one {"CPU": 1} bundle per rank, so a head
    offering two took both ranks in the real Ray run (tests/test_multihost_ray.py)."""
    plan = _plan("cpu-demo-tp2", "slurm", ray=True)
    script = render.render(plan, "slurm")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    bindir = str(Path(_bash_array(script, "VLLM_ARGV")[0]).parent)
    starts = [
        line for line in script.splitlines() if line.startswith("srun") and "ray start" in line
    ]
    assert len(starts) == 2, starts
    for line in starts:
        assert f" {bindir}/ray start " in line and "--num-cpus=1" in line, line
    assert f"\n{bindir}/python -c " in "\n" + script
    assert "#SBATCH --nodes=2" in script and "--gpus-per-node" not in script
    # a GPU render keeps the node's own Ray and lets it count the node's GPUs
    gpu = render.render(_plan("k3-tp16-latency", "slurm", ray=True), "slurm", weights_path=SHARED)
    assert "--num-cpus" not in gpu and " ray start --head" in gpu


# ---------------------------------------------------------------- CLI


def test_render_rejects_bad_format_and_uneven_split():
    plan = _plan("k3-tp8-latency")
    with pytest.raises(InputError, match="allowed: slurm, k8s"):
        render.render(plan, "nomad")
    with pytest.raises(
        InputError, match="do not split evenly over 3 nodes; allowed --nnodes: 1, 2"
    ):
        render.render(plan, "slurm", nnodes=3)


def test_cli_render_writes_a_private_file_and_never_overwrites(tmp_path, capsys, monkeypatch):
    out = tmp_path / "lws.yaml"
    assert main(["serve", "k3-tp8-latency", "--render", "k8s", "-o", str(out)]) == 2
    assert "needs a key" in capsys.readouterr().err and not out.exists()
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert main(["serve", "k3-tp8-latency", "--render", "k8s", "-o", str(out)]) == 0
    assert "holds the API key" in capsys.readouterr().err
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert _objects(out.read_text())["LeaderWorkerSet"]["kind"] == "LeaderWorkerSet"
    assert main(["serve", "k3-tp8-latency", "--render", "k8s", "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["serve", "k3-tp8-latency", "--render", "nomad"]) == 2
    assert "--render 'nomad' is not one of: slurm, k8s" in capsys.readouterr().err
    assert main(["serve", "k3-tp8-latency", "--render", "slurm", "--api-key-secret", "s"]) == 2
    assert "goes with --render k8s" in capsys.readouterr().err


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


@pytest.mark.parametrize("fmt", ["k8s", "slurm"])
def test_traces_to_the_nodes_own_loopback_are_refused(fmt):
    # a pod's 127.0.0.1 is the pod: spans sent there reach no monitor
    plan = _plan("k3-tp8-latency", fmt, traces="kimictl")
    assert "--otlp-traces-endpoint" in plan.argv
    with pytest.raises(InputError, match="no monitor listens"):
        render.render(plan, fmt, insecure=True, weights_path=SHARED)
    remote = _plan("k3-tp8-latency", fmt, traces="http://collector.obs:4318/v1/traces")
    assert "collector.obs:4318" in render.render(remote, fmt, insecure=True, weights_path=SHARED)


# ---------------------------------------------------------------- values with units and rules


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (
            ["--render", "k8s", "--api-key-secret", "My_Secret!"],
            "error: --api-key-secret 'My_Secret!' is not allowed; it must be a Kubernetes "
            "object name: lowercase letters, digits, '-' and '.'",
        ),
        (
            ["--render", "k8s", "--api-key-secret", ""],
            "error: --api-key-secret '' is not allowed; it must be a Kubernetes object name",
        ),
        (
            ["--render", "k8s", "--api-key-secret", "a" * 254],
            "error: --api-key-secret 'aaaa",
        ),
        (
            ["--render", "k8s", "--traces", "https://user:pw@collector.obs:4318/v1/traces"],
            "error: --traces 'https://***@collector.obs:4318/v1/traces' is not allowed; use a "
            "URL without user:password@",
        ),
        (
            ["--render", "slurm", "--traces", "http://:pw@collector.obs/v1/traces"],
            "error: --traces 'http://***@collector.obs/v1/traces' is not allowed",
        ),
        (
            ["--render", "slurm", "--weights-path", "models"],
            "error: --weights-path 'models' is not allowed; it must be an absolute path",
        ),
    ],
)
def test_render_options_follow_their_cluster_rules(args, sentence, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert main(["serve", "k3-tp8-latency", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(sentence), captured.err
    assert captured.out == "" and "Traceback" not in captured.err and "pw@" not in captured.err


@pytest.mark.parametrize(
    ("line", "sentence"),
    [
        (
            "memory = 512",
            "[cluster] memory = 512 is not allowed; it must be a size with its "
            'unit, e.g. "512Gi": Kubernetes reads a bare number as bytes.',
        ),
        (
            'memory = "512"',
            '[cluster] memory = "512" is not allowed; it must be a size with its '
            'unit, e.g. "512Gi": Kubernetes reads a bare number as bytes.',
        ),
        ('shm_size = "64m"', '[cluster] shm_size = "64m" is not allowed'),  # milli-bytes
        ('shm_size = "lots"', '[cluster] shm_size = "lots" is not allowed; it must be a size'),
        (
            'api_key_secret = "My_Secret!"',
            '[cluster] api_key_secret = "My_Secret!" is not '
            "allowed; it must be a Kubernetes object name",
        ),
        ('api_key_secret = ""', '[cluster] api_key_secret = "" is not allowed'),
    ],
)
def test_profiles_validate_checks_the_same_cluster_rules(tmp_path, capsys, line, sentence):
    path = _profile_copy(tmp_path, "k3-bad", f'weights_pvc = "w"\n{line}\n')
    assert main(["profiles", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:" in err and sentence in err, err


def test_profile_traces_url_with_credentials_is_refused_and_not_echoed(tmp_path, capsys):
    text = (ROOT / "profiles" / "k3-tp8-latency.toml").read_text()
    url = "https://user:s3cret@collector.obs:4318/v1/traces"
    path = tmp_path / "k3-cred.toml"
    path.write_text(text.replace("[metrics]\n", f'[metrics]\ntraces = "{url}"\n', 1))
    assert "[metrics]\n" in text
    assert main(["profiles", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert '[metrics] traces = "https://***@collector.obs:4318/v1/traces" is not allowed' in err
    assert "without user:password@" in err and "s3cret" not in err


def test_units_and_names_that_follow_the_rules_render_and_validate(tmp_path):
    cluster = ClusterSettings(weights_path="/raid/models", memory="1.5Ti", shm_size="64G")
    objs = _k8s("k3-tp8-latency", key=None, api_key_secret="team.vllm-key", cluster=cluster)
    for obj in objs.values():
        assert k8s_schemas.errors(obj) == [], (obj["kind"], k8s_schemas.errors(obj))
    leader, _ = _pods(objs)
    assert leader["containers"][0]["resources"]["limits"]["memory"] == "1.5Ti"
    (dshm,) = [v for v in leader["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["sizeLimit"] == "64G"


def test_profiles_validate_says_which_render_would_download_per_node(capsys):
    assert main(["profiles", "validate", "k3-tp16-latency", "--json"]) == 0
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    slurm, k8s = checks["render.slurm.weights"], checks["render.k8s.weights"]
    assert slurm["status"] == "warn" and "4 nodes would each download" in slurm["message"]
    assert slurm["remedy"] == "kimictl serve k3-tp16-latency --render slurm --weights-path PATH"
    assert k8s["status"] == "pass" and "PVC kimi-k3-weights" in k8s["message"]
    assert main(["profiles", "validate", "cpu-demo-tp2", "--json"]) == 0  # a model on each host
    assert json.loads(capsys.readouterr().out)["checks"] == []


def test_apply_without_kubectl_or_a_cluster_is_one_sentence(tmp_path, capsys, monkeypatch):
    """--apply needs kubectl and a cluster that answers; here neither is faked: an empty PATH
    has no kubectl, and a kubeconfig naming a closed local port has no cluster."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    argv = ["serve", "k3-tp8-latency", "--render", "k8s", "--apply"]
    kubectl = shutil.which("kubectl")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: kubectl is not installed here") and len(err.splitlines()) == 2
    if kubectl is None:
        return
    (tmp_path / "kubectl").symlink_to(kubectl)
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no Kubernetes cluster is reachable from here (kubectl: ")
    assert "nothing was applied" in err and len(err.splitlines()) == 2
    assert main([*argv[:-1], "-o", str(tmp_path / "x.yaml"), "--apply"]) == 2
    assert "--apply goes with --render k8s" in capsys.readouterr().err


def test_slurm_submit_refuses_what_it_cannot_submit(capsys, monkeypatch):
    """`serve --slurm` checks its options and the key before sbatch is ever run."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    cases = [
        (["--partition", "x"], "--partition goes with --slurm"),
        (["--slurm", "--ab"], "--slurm submits one deployment; drop --ab."),
        (["--slurm", "--render", "slurm"], "--slurm submits the job; drop --render"),
        (["--slurm"], "the Slurm job binds 0.0.0.0 on its first node, so the API needs a key"),
    ]
    for extra, said in cases:
        assert main(["serve", "cpu-demo-tp2", *extra]) == 2
        err = capsys.readouterr().err
        assert f"error: {said}" in err and "Traceback" not in err, err
