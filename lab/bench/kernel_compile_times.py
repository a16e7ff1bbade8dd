"""Compile time per CuTe DSL unit of vLLM 0.33.0's K3 specialized decode, on THIS machine's CPU.

Compiles sample units of kimictl's plan (k3-tp8-latency and k3-tp16-latency, target sm_103a, no
GPU) through vLLM 0.33.0's REAL compile functions (wheel sources via tests/vllm_src.py, torch
stubbed) with the installed nvidia-cutlass-dsl, one fresh process per family:
- cold: CUTE_DSL_DISABLE_FILE_CACHING=1, up to PER_FAMILY distinct units per family compiled in
  sequence in one process (what vLLM pays per unit and rank today);
- file cache: one unit twice, in two processes sharing a fresh CUTE_DSL_CACHE_DIR: whether the
  DSL's file cache would save anything on a warm start (it writes nothing for cute.compile).
Writes kimictl/data/kernel_compile_times.json (read by `kimictl kernels plan`).

    PYTHONPATH=$PWD python3 lab/bench/kernel_compile_times.py     # needs nvidia-cutlass-dsl
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "kimictl/data/kernel_compile_times.json"
ARCH = "sm_103a"
# Families whose vLLM compile function takes only plain keys (no weight layouts): compiled here.
COMPILED = ("oproj.producer", "oproj.consumer", "oproj.fused", "attn_res")
PER_FAMILY = 5  # distinct units timed per family


def _child(family: str, keys: list[list[Any]]) -> None:
    """Compile `keys` of one family in sequence with vLLM's own compile body (as one vLLM
    process does); print each unit's seconds."""
    sys.path.insert(0, str(ROOT / "tests"))
    import vllm_src

    sources, why = vllm_src.ensure_sources()
    if sources is None:
        raise SystemExit(why)
    vllm_src.load(sources)
    import importlib

    base = "vllm.models.kimi_k3.nvidia.specialized_decode.cutedsl"
    attn_res = importlib.import_module(f"{base}.attn_res.prepared").compile_consumer
    # Untimed warm-up (a unit no sample uses): the first compile of a process also loads and
    # initializes the compiler, paid once per vLLM process, not per unit.
    attn_res.__wrapped__(0, True, -1, False, 0, 0, ARCH, True)
    seconds = []
    for key in keys:
        if family.startswith("oproj."):
            fn, args = importlib.import_module(f"{base}.oproj.prepared").compile_oproj, key
        else:  # attn_res: kimictl key (nb, delta, write, final, slots, cap, aux) + arch
            fn, args = attn_res, [*key[:6], ARCH, key[6]]
        start = time.perf_counter()
        fn.__wrapped__(*args)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds}))


def _run(family: str, keys: list[Any], env: dict[str, str]) -> list[float]:
    argv = [sys.executable, __file__, "--child", family, json.dumps(keys)]
    full = {**os.environ, "CUTE_DSL_ARCH": ARCH, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{family} {keys}: {done.stderr[-800:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def _samples() -> dict[str, list[Any]]:
    sys.path.insert(0, str(ROOT))
    from kimictl.deployment.profiles import load_profile
    from kimictl.kernels.vllm.plan import plan_units

    picked: dict[str, list[Any]] = {}
    for name in ("k3-tp8-latency", "k3-tp16-latency"):
        seen: set[Any] = set()
        for unit in plan_units(load_profile(name).spec).units:
            if unit.family not in COMPILED or unit.effective in seen:
                continue
            seen.add(unit.effective)
            chosen = picked.setdefault(unit.family, [])
            if len(chosen) < PER_FAMILY and list(unit.key) not in chosen:
                chosen.append(list(unit.key))
    return picked


def main() -> int:
    import cutlass

    cold: dict[str, list[float]] = {}
    cache: dict[str, dict[str, float]] = {}
    for family, keys in _samples().items():
        cold[family] = _run(family, keys, {"CUTE_DSL_DISABLE_FILE_CACHING": "1"})
        print(family, "cold", " ".join(f"{t:.2f}" for t in cold[family]), flush=True)
        # the same first unit twice, in two processes sharing one fresh CUTE_DSL_CACHE_DIR
        with tempfile.TemporaryDirectory(prefix="kimictl-cute-cache-") as folder:
            env = {"CUTE_DSL_CACHE_DIR": folder}
            first, second = _run(family, keys[:1], env)[0], _run(family, keys[:1], env)[0]
            files = sum(1 for p in Path(folder).rglob("*") if p.is_file())
        cache[family] = {"cold": first, "warm": second, "files": files}
        print(family, f"file cache {first:.2f} -> {second:.2f} s ({files} files written)",
              flush=True)  # fmt: skip
    doc = {
        "provenance": {
            "command": "PYTHONPATH=$PWD python3 lab/bench/kernel_compile_times.py",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.node()} ({os.cpu_count()} CPUs, shared, no GPU)",
            "python": platform.python_version(),
            "cutlass_dsl": cutlass.__version__,
            "vllm_sources": "0.33.0",
            "arch": ARCH,
            "note": "one process per family compiling its samples in sequence after one "
            "untimed warm-up compile; seconds inside each compile call only (DSL import and "
            "vLLM stubs excluded)",
        },
        "cold_seconds": cold,
        "file_cache": cache,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], json.loads(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
