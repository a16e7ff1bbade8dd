"""`kimictl serve PROFILE --render k8s --apply`: the render handed to `kubectl apply`.

Only where kubectl is installed and its cluster answers; otherwise one sentence says which is
missing and nothing is applied. kimictl does not follow an applied deployment (`ps`/`stop` are
for local, Slurm and Ray runs): `kubectl get lws` and `kubectl delete -f` are the operator's.
"""

from __future__ import annotations

import shutil
import subprocess

from kimictl.core.errors import LaunchError, Unsupported

__all__ = ["REACH_TIMEOUT_S", "apply"]

REACH_TIMEOUT_S = 10


def _said(done: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {done.returncode}"


def apply(text: str) -> list[str]:
    """`kubectl apply -f -` of the rendered objects; kubectl's lines (one per object)."""
    kubectl = shutil.which("kubectl")
    hint = (
        "`--render k8s -o FILE` writes the objects; apply them where kubectl reaches the cluster."
    )
    if kubectl is None:
        raise Unsupported("kubectl is not installed here, so --apply has nothing to apply with.",
                          hint=hint)  # fmt: skip
    try:
        reach = subprocess.run(
            [kubectl, "get", "--raw", "/version", f"--request-timeout={REACH_TIMEOUT_S}s"],
            capture_output=True, text=True, timeout=REACH_TIMEOUT_S + 5,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        reach = subprocess.CompletedProcess([], 124, "", f"no answer in {REACH_TIMEOUT_S} s")
    if reach.returncode != 0:
        raise Unsupported(
            f"no Kubernetes cluster is reachable from here (kubectl: {_said(reach)}); "
            "nothing was applied.",
            hint=hint,
        )
    done = subprocess.run(
        [kubectl, "apply", "-f", "-"], input=text, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise LaunchError(f"kubectl apply refused the objects: {_said(done)}")
    return done.stdout.splitlines()
