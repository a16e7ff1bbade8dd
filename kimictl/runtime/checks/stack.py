"""Installed software vs the stack vLLM 0.33.0 pins, read without importing vllm or torch.

`PINNED` is the single source of truth for these pins (from vllm 0.33.0's Requires-Dist). Versions
come from importlib.metadata; the specialized decode package is located through
importlib.util.find_spec("vllm"), which reads the package's location without executing it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kimictl.deployment.traces import OTEL_PACKAGES
from kimictl.runtime.checks.hardware._types import Unavailable

__all__ = [
    "PINNED",
    "SPECIALIZED_DECODE_SUBPATH",
    "CUTLASS_INSTALL",
    "VLLM_VERSION",
    "PackageCheck",
    "Pin",
    "StackReport",
    "probe_stack",
    "satisfies",
]

VLLM_VERSION = "0.33.0"
_CUTLASS_DSL = "4.8.0"  # one version for the DSL and its two library wheels
CUTLASS_INSTALL = f"nvidia-cutlass-dsl[cu13]=={_CUTLASS_DSL}"
SPECIALIZED_DECODE_SUBPATH = "models/kimi_k3/nvidia/specialized_decode"


@dataclass(frozen=True)
class Pin:
    name: str  # distribution name as pip knows it
    spec: str  # "==2.14.0" or ">=5.16.1,<5.21.0"
    install: str = ""  # what to put after `pip install` (extras included); default name + spec
    required: bool = True  # False: reported as WARN when missing
    why: str = ""

    def __post_init__(self) -> None:
        if not self.install:  # the version is written once, in `spec`
            object.__setattr__(self, "install", self.name + self.spec)


PINNED: tuple[Pin, ...] = (
    Pin("vllm", f"=={VLLM_VERSION}", why="carries the K3 specialized path"),
    Pin("torch", "==2.14.0"),
    Pin("flashinfer-python", "==0.7.2.post1"),
    Pin(
        "nvidia-cutlass-dsl",
        f"=={_CUTLASS_DSL}",
        CUTLASS_INSTALL,
        why="no runtime version check exists: a mismatch fails late, inside kernel compilation",
    ),
    Pin("nvidia-cutlass-dsl-libs-base", f"=={_CUTLASS_DSL}", CUTLASS_INSTALL),
    Pin("nvidia-cutlass-dsl-libs-cu13", f"=={_CUTLASS_DSL}", CUTLASS_INSTALL),
    Pin("quack-kernels", "==0.6.5"),
    Pin("tokenspeed-mla", "==2.0.3"),
    Pin("apache-tvm-ffi", "==0.1.11"),
    Pin("xgrammar", "==0.2.8"),
    Pin("transformers", ">=5.16.1,<5.21.0"),
    Pin(
        "cuda-bindings",
        ">=13",
        required=False,
        why="kimictl reads the multicast attribute through it (libcuda via ctypes otherwise)",
    ),
)

_VERSION = re.compile(
    r"^v?(?P<release>\d+(?:\.\d+)*)(?:[-_.]?(?P<pre>a|b|rc)(?P<pre_n>\d*))?"
    r"(?:[-_.]?post(?P<post>\d*))?(?:[-_.]?dev(?P<dev>\d*))?(?:\+.*)?$"
)


def _key(version: str) -> tuple[Any, ...]:
    """Sort key for the PEP 440 subset real wheels use; a local label (+cu130) is ignored."""
    m = _VERSION.match(version.strip().lower())
    if not m:
        raise ValueError(f"unparsable version {version!r}")
    release = tuple(int(p) for p in m["release"].split("."))
    release = release + (0,) * (6 - len(release))
    pre_rank = {"a": 0, "b": 1, "rc": 2}.get(m["pre"] or "", 3)
    pre = (pre_rank, int(m["pre_n"] or 0)) if m["pre"] else (3, 0)
    post = int(m["post"] or 0) if m["post"] is not None else -1
    dev = int(m["dev"] or 0) if m["dev"] is not None else 1 << 30
    if m["dev"] is not None and not m["pre"] and m["post"] is None:
        pre = (-1, 0)  # 1.0.dev1 sorts before 1.0a1
    return (release, pre, post, dev)


def satisfies(version: str, spec: str) -> bool:
    """Does `version` meet `spec` ("==X", ">=X,<Y", ...)? Unparsable versions never satisfy."""
    try:
        have = _key(version)
        for clause in (c.strip() for c in spec.split(",") if c.strip()):
            op = re.match(r"^(==|!=|>=|<=|>|<)", clause)
            if not op:
                raise ValueError(clause)
            want = _key(clause[op.end() :])
            ok = {
                "==": have == want,
                "!=": have != want,
                ">=": have >= want,
                "<=": have <= want,
                ">": have > want,
                "<": have < want,
            }[op.group(1)]
            if op.group(1) == "<" and have[0] == want[0] and have[1] < (3, 0) <= want[1]:
                ok = False  # PEP 440: <V excludes V's own pre-releases
            if not ok:
                return False
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class PackageCheck:
    name: str
    spec: str
    installed: str | None
    status: Literal["ok", "mismatch", "missing"]
    fix: str  # the exact pip command; "" when ok
    required: bool = True
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PackageCheck:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


@dataclass(frozen=True)
class StackReport:
    python: str
    packages: list[PackageCheck]
    vllm_location: str | None
    specialized_decode: str | Unavailable  # the directory found, or why not
    notes: list[str] = field(default_factory=list)
    # the OpenTelemetry packages vLLM exports trace spans with (deployment.traces.OTEL_PACKAGES):
    # name -> installed version or None; {} when not probed (an older snapshot)
    tracing: dict[str, str | None] = field(default_factory=dict)

    def package(self, name: str) -> PackageCheck | None:
        return next((p for p in self.packages if p.name == name), None)

    def versions(self) -> dict[str, str | None]:
        return {p.name: p.installed for p in self.packages}

    def to_json(self) -> dict[str, Any]:
        sd = self.specialized_decode
        return {
            "python": self.python,
            "packages": [p.to_json() for p in self.packages],
            "vllm_location": self.vllm_location,
            "specialized_decode": {"unavailable": sd.reason} if isinstance(sd, Unavailable) else sd,
            "notes": list(self.notes),
            "tracing": dict(self.tracing),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StackReport:
        sd = raw.get("specialized_decode")
        return cls(
            python=str(raw.get("python", "")),
            packages=[PackageCheck.from_json(p) for p in raw.get("packages", [])],
            vllm_location=raw.get("vllm_location"),
            specialized_decode=Unavailable(str(sd["unavailable"]))
            if isinstance(sd, dict)
            else str(sd),
            notes=list(raw.get("notes", [])),
            tracing=dict(raw.get("tracing") or {}),
        )


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pip(install: str) -> str:
    return f"pip install {shlex.quote(install)}"


def _check(pin: Pin) -> PackageCheck:
    have = _installed(pin.name)
    if have is None:
        return PackageCheck(
            pin.name, pin.spec, None, "missing", _pip(pin.install), pin.required, pin.why
        )
    if satisfies(have, pin.spec):
        return PackageCheck(pin.name, pin.spec, have, "ok", "", pin.required, pin.why)
    return PackageCheck(
        pin.name, pin.spec, have, "mismatch", _pip(pin.install), pin.required, pin.why
    )


def find_specialized_decode() -> tuple[str | None, str | Unavailable]:
    """(vllm package dir, specialized_decode dir or why not) without importing vllm."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError) as error:
        return None, Unavailable(f"cannot locate vllm: {error}")
    if spec is None or not spec.submodule_search_locations:
        return None, Unavailable("vllm is not installed")
    roots = [Path(p) for p in spec.submodule_search_locations]
    for root in roots:
        candidate = root / SPECIALIZED_DECODE_SUBPATH
        if candidate.is_dir():
            return str(root), str(candidate)
    return str(roots[0]), Unavailable(
        f"{roots[0] / SPECIALIZED_DECODE_SUBPATH} is absent: this vLLM has no K3 specialized decode"
    )


def probe_stack() -> StackReport:
    location, sd = find_specialized_decode()
    packages = [_check(pin) for pin in PINNED]
    notes: list[str] = []
    cutlass = next(p for p in packages if p.name == "nvidia-cutlass-dsl")
    if cutlass.status == "missing":
        # The libs wheels come with nvidia-cutlass-dsl[cu13]; one fix line covers all three.
        packages = [
            p for p in packages if not p.name.startswith("nvidia-cutlass-dsl-libs") or p.installed
        ]
    version = sys.version_info
    return StackReport(
        python=f"{version.major}.{version.minor}.{version.micro}",
        packages=packages,
        vllm_location=location,
        specialized_decode=sd,
        notes=notes,
        tracing={name: _installed(name) for name in OTEL_PACKAGES},
    )
