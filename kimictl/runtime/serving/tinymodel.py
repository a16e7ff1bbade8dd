"""The tiny Kimi K2-architecture model behind the embedded default (`@tiny-k2`), built locally.

Random weights from a fixed seed and a byte-level BPE tokenizer trained on local text, so every
machine builds the same model in seconds with no download. `perturb` builds a subtly wrong twin for
`kimictl validate`'s proof that the gate can fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from kimictl.core.errors import InputError, LaunchError, child_failure
from kimictl.core.paths import cache_dir
from kimictl.runtime.serving import cpu_runtime

__all__ = ["TINY_MODEL", "build", "resolve_model"]

TINY_MODEL = "@tiny-k2"
_BUILDER = Path(__file__).with_name("_tinymodel_build.py")
_PERTURB = re.compile(r"^(scale|noise):[0-9.eE+-]+$")


def model_dir(seed: int = 0, perturb: str | None = None) -> Path:
    suffix = f"-{perturb.replace(':', '')}" if perturb else ""
    return cache_dir() / "models" / f"tiny-k2-seed{seed}{suffix}"


def build(seed: int = 0, perturb: str | None = None, *, force: bool = False) -> Path:
    """Build (or reuse) the model folder; built in a temp folder and renamed: never half-written."""
    if perturb is not None and not _PERTURB.match(perturb):
        raise InputError(
            f"unknown perturbation {perturb!r}; allowed: scale:EPS (last layer x (1+EPS)) "
            "or noise:SIGMA (relative noise on lm_head)"
        )
    target = model_dir(seed, perturb)
    if (target / "kimictl-tiny.json").exists() and not force:
        return target
    cpu_runtime.require_installed()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    # -I: isolated mode, so the script's own folder (kimictl/runtime/) is not on sys.path and
    # cannot shadow a library's import; no user site-packages, no PYTHON* variables.
    argv = [str(cpu_runtime.python_path()), "-I", str(_BUILDER), "--out", str(tmp)]
    argv += ["--seed", str(seed)]
    if perturb:
        argv += ["--perturb", perturb]
    log = target.parent / f"{target.name}.build.log"
    with log.open("w") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LaunchError(
            f"building the tiny model failed: {child_failure(log)}",
            hint=f"full log: {log}",
        )
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def resolve_model(name: str) -> Path | str:
    """`@tiny-k2` (optionally `@tiny-k2?seed=N&perturb=S`) -> a built folder; others as they are."""
    if not name.startswith(TINY_MODEL):
        return name
    seed, perturb = 0, None
    _, _, query = name.partition("?")
    for part in filter(None, query.split("&")):
        key, _, value = part.partition("=")
        if key == "seed" and value.isdigit():
            seed = int(value)
        elif key == "perturb":
            perturb = value
        else:
            raise InputError(
                f"unknown tiny-model option {part!r} in {name!r}; allowed: seed=N, perturb=S"
            )
    return build(seed, perturb)
