"""A profile's `[cluster]` table: what a rendered cluster job needs beyond the vLLM launch line
(where the weights live, what each pod or node asks for, which Secret holds the API key).

One helper per rule, used wherever the value enters: the profile schema (`CLUSTER_KEYS`, so
`profiles validate` and every load) and the render's own options (`serve --render
--api-key-secret / --weights-path`). Memory sizes need a unit: Kubernetes reads a bare number as
bytes (`memory = 512` is 512 bytes), so one is refused rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "CLIQUE_LABEL",
    "CLUSTER_KEYS",
    "DEFAULT_SHM",
    "DEFAULT_WEIGHTS_MOUNT",
    "ClusterSettings",
    "JobFormat",
    "check_abs_path",
    "check_byte_quantity",
    "check_dns_label",
    "check_object_name",
    "cluster_settings",
    "is_local_model",
    "weights_problem",
]


class JobFormat(StrEnum):
    """The cluster jobs `kimictl serve --render` writes."""

    slurm = "slurm"  # an sbatch script
    k8s = "k8s"  # Kubernetes manifests (LeaderWorkerSet)


DEFAULT_WEIGHTS_MOUNT = "/models"
# GPU feature discovery's node label for a multi-node NVLink domain, valued "<cluster UUID>.<clique
# id>" (NVIDIA k8s-device-plugin, internal/lm/fabric.go): rendered pods' affinity keys on it.
CLIQUE_LABEL = "nvidia.com/gpu.clique"
# vLLM's mp backend and NCCL share tensors through /dev/shm; a container's default is 64 MiB.
DEFAULT_SHM = "16Gi"

# Kubernetes names (k8s.io/apimachinery validation): a DNS-1123 label, which is also a valid
# DNS-1035 label (what a Service name must be) when it starts with a letter.
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# resource.Quantity: <signed number><suffix>, suffix binary (Ki..Ei), decimal (m, k, M..E) or exp.
_QUANTITY = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]+)?")
# A size in bytes with its unit: binary (Ki..Ei) or decimal (k, M..E); no bare number, no milli.
_BYTES = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[kMGTPE])")


def check_dns_label(value: str, *, max_len: int = 63) -> str | None:
    """None when `value` is a Kubernetes DNS label starting with a letter, else why not."""
    if len(value) > max_len:
        return f"{len(value)} characters, at most {max_len}"
    if not _DNS_LABEL.fullmatch(value):
        return "lowercase letters, digits and '-', starting with a letter and ending alphanumeric"
    return None


def check_object_name(value: Any) -> str:
    """A Kubernetes object name (a Secret's, a PVC's): a DNS-1123 subdomain, at most 253
    characters; ValueError says what is allowed (an empty name is none)."""
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(
            "a Kubernetes object name: lowercase letters, digits, '-' and '.', starting and "
            "ending alphanumeric, at most 253 characters"
        )
    return value


def check_abs_path(value: Any) -> str:
    """A path every node has (weights): absolute, one line."""
    if not isinstance(value, str) or not value.startswith("/") or "\n" in value:
        raise ValueError('an absolute path, e.g. "/shared/models"')
    return value


def check_byte_quantity(value: Any) -> str:
    """memory, shm_size: a Kubernetes quantity with a byte unit ("512Gi", "64G")."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError('a size with its unit, e.g. "512Gi" or "64G"')
    if not _BYTES.fullmatch(str(value)):
        raise ValueError(
            f'a size with its unit, e.g. "{value}Gi": Kubernetes reads a bare number as bytes'
            if isinstance(value, int | float) or _QUANTITY.fullmatch(str(value))
            else 'a size with its unit, e.g. "512Gi" or "64G" (Ki, Mi, Gi, Ti or k, M, G, T)'
        )
    return str(value)


def _quantity(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError('a Kubernetes quantity, e.g. "64", "512Gi" or "500m"')
    text = str(value)
    if not _QUANTITY.fullmatch(text):
        raise ValueError('a Kubernetes quantity, e.g. "64", "512Gi" or "500m"')
    return text


CLUSTER_KEYS = {
    "weights_pvc": check_object_name,
    "weights_path": check_abs_path,
    "weights_mount": check_abs_path,
    "cpu": _quantity,  # a bare number is cores
    "memory": check_byte_quantity,
    "shm_size": check_byte_quantity,
    "api_key_secret": check_object_name,
}


@dataclass(frozen=True)
class ClusterSettings:
    """`[cluster]`: weights come from a PersistentVolumeClaim (k8s) or a path present on every
    node (a shared filesystem under Slurm, a hostPath under k8s), mounted at `weights_mount`;
    the Hugging Face cache (HF_HOME) lives there, so a restart reads, never downloads."""

    weights_pvc: str | None = None
    weights_path: str | None = None
    weights_mount: str = DEFAULT_WEIGHTS_MOUNT
    cpu: str | None = None
    memory: str | None = None
    shm_size: str = DEFAULT_SHM
    api_key_secret: str | None = None  # an existing Secret (key "key") instead of a rendered one

    @property
    def hf_home(self) -> str | None:
        if self.weights_pvc or self.weights_path:
            return f"{self.weights_mount.rstrip('/')}/hf"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "weights_pvc": self.weights_pvc,
            "weights_path": self.weights_path,
            "weights_mount": self.weights_mount,
            "cpu": self.cpu,
            "memory": self.memory,
            "shm_size": self.shm_size,
            "api_key_secret": self.api_key_secret,
        }


def cluster_settings(table: dict[str, Any]) -> ClusterSettings:
    """ClusterSettings from a checked `[cluster]` table; ValueError when it names two volumes."""
    if table.get("weights_pvc") and table.get("weights_path"):
        raise ValueError("one weights volume: weights_pvc or weights_path, not both")
    return ClusterSettings(**table)


def is_local_model(model: str) -> bool:
    """A model every node reads from a path (or kimictl's own, made on each host), not the hub."""
    return model.startswith(("/", "@"))


def weights_problem(cluster: ClusterSettings, *, fmt: str, nodes: int, model: str) -> str | None:
    """Why a `fmt` render over `nodes` nodes would have every node download `model` itself (the
    key it lacks), or None: one node, a model path, or a weights volume that format mounts."""
    if nodes < 2 or is_local_model(model):
        return None
    if fmt == "slurm" and not cluster.weights_path:
        return "[cluster] weights_path (a path every node mounts; a PVC means nothing to Slurm)"
    if fmt == "k8s" and not (cluster.weights_pvc or cluster.weights_path):
        return "[cluster] weights_pvc or weights_path"
    return None
