"""Validate rendered Kubernetes objects the way the API server would, from vendored schemas
(tests/fixtures/k8s/README.md says where each comes from).

- Core kinds (Pod template, Service, Secret, ResourceClaimTemplate): Kubernetes v1.34's OpenAPI
  as strict JSON Schema (additionalProperties false: an unknown or misspelt field fails).
- Custom resources (LeaderWorkerSet, ComputeDomain): the CRD's openAPIV3Schema, plus the API
  server's pruning rule: a field the structural schema does not declare is silently dropped, so
  here it fails the test instead.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

FIX = Path(__file__).parent / "fixtures" / "k8s"
CRDS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): ("lws-crd.yaml", "v1"),
    ("resource.nvidia.com/v1beta1", "ComputeDomain"): ("computedomain-crd.yaml", "v1beta1"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): ("gateway-api-httproutes-crd.yaml", "v1"),
}
CORE = {("v1", "Service"): "Service", ("v1", "Secret"): "Secret", ("v1", "Pod"): "Pod"}


@cache
def _core() -> dict[str, Any]:
    return json.loads((FIX / "core-v1.34-strict.json").read_text())  # type: ignore[no-any-return]


def core_validator(kind: str) -> jsonschema.protocols.Validator:
    doc = _core()
    schema = {**doc["kinds"][kind], "$defs": doc["$defs"]}
    cls = jsonschema.validators.validator_for({"$schema": doc["$schema"]})
    return cls(schema)


@cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    file, version = CRDS[(api_version, kind)]
    crd = yaml.safe_load((FIX / file).read_text())
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return entry["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def pruned_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths the API server would prune: object keys the structural schema does not declare."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                out += pruned_fields(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += pruned_fields(item, extra, f"{path}.{key}")
            elif props is not None or extra is False:
                out.append(f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += pruned_fields(item, schema["items"], f"{path}[{i}]")
    return out


def errors(obj: dict[str, Any]) -> list[str]:
    """Every reason the API server would reject (or silently alter) `obj`; [] when none."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    found: list[str] = []
    if key in CRDS:
        schema = crd_schema(*key)
        validator = jsonschema.Draft7Validator(schema)
        found += [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(obj)
        ]
        found += [f"{p}: pruned (not in the CRD schema)" for p in pruned_fields(obj, schema)]
        if key[1] == "LeaderWorkerSet":
            group = obj["spec"]["leaderWorkerTemplate"]
            for name in ("leaderTemplate", "workerTemplate"):
                if name in group:
                    found += [f"{name}: {e}" for e in pod_template_errors(group[name])]
        return found
    if key in CORE:
        validator = core_validator(CORE[key])  # type: ignore[index]
        return [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(obj)
        ]
    return [f"no schema for {key}"]


def pod_template_errors(template: dict[str, Any]) -> list[str]:
    validator = core_validator("PodTemplateSpec")
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(template)
    ]
