"""Build every sm_103a unit of `kimictl kernels plan k3-tp8-latency` this CPU machine can build.

For the families whose vLLM 0.33.0 compile function takes plain keys (o-projection producer,
consumer and fused: `oproj/prepared.py::compile_oproj`; AttnRes: `attn_res/prepared.py::
compile_consumer`), one fresh process per family runs vLLM's REAL compile body (wheel sources via
tests/vllm_src.py, torch stubbed, CUTE_DSL_ARCH=sm_103a, no GPU, no libcuda) for one key per
distinct effective key of the plan, and exports the result with `export_to_c` (C ABI object with
the cubin inside; where the DSL's C header generator refuses the signature, the object alone via
`dump_to_object`, and the header error is recorded). Per unit: compile seconds, compile + export
seconds, object bytes, or the error. The other
families (split-K and skinny projections, KDA core, MLA core) compile from prepared weight and KV
layouts (`PreparedProjection`, `PreparedKda.prepare_caches`, `PreparedMla.prepare_cache`: real
tensors through `to_cute`), which this script does not build: listed with that reason. Nothing
here loads or runs on Blackwell (no GB300 is lent).

    PYTHONPATH=$PWD python benchmarks/vllm_units_sm103.py [--profile P] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARCH = "sm_103a"
BUILT = ("oproj.producer", "oproj.consumer", "oproj.fused", "attn_res")
NOT_BUILT_WHY = (
    "compiled from prepared weight/KV layouts (real tensors through to_cute), not plain keys: "
    "not built by this script"
)


def _text(exc: BaseException) -> str:
    """The DSL's message without colour codes and boilerplate, one line."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    text = text.replace("The compiler hit an internal DSL problem while compiling your code.", "")
    text = text.replace("note: This is a bug in the DSL, not a mistake in your kernel.", "")
    text = text.split("suggestion:")[0]
    return " ".join(text.split())[:400]


def _child(family: str, keys: list[list[Any]], out: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import vllm_src

    sources, why = vllm_src.ensure_sources()
    if sources is None:
        raise SystemExit(why)
    vllm_src.load(sources)
    import importlib

    base = "vllm.models.kimi_k3.nvidia.specialized_decode.cutedsl"
    oproj = importlib.import_module(f"{base}.oproj.prepared").compile_oproj
    attn_res = importlib.import_module(f"{base}.attn_res.prepared").compile_consumer
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, key in enumerate(keys):
        name = f"{family.replace('.', '_')}_{i:03d}"
        if family.startswith("oproj."):
            fn, args = oproj, key
        else:  # kimictl key (nb, delta, write, final, slots, cap, aux) + arch
            fn, args = attn_res, [*key[:6], ARCH, key[6]]
        start = time.perf_counter()
        try:
            compiled = fn.__wrapped__(*args)
            compile_s = time.perf_counter() - start
        except Exception as exc:
            rows.append({"key": key, "error": f"compile: {type(exc).__name__}: {_text(exc)}"})
            continue
        row: dict[str, Any] = {"key": key, "compile_s": round(compile_s, 3)}
        obj = out / f"{name}.o"
        try:
            compiled.export_to_c(str(out), name, function_prefix=name)
        except Exception as exc:  # the C header generator refuses some signatures
            row["header_error"] = _text(exc)
            try:
                obj.write_bytes(compiled.dump_to_object(name))  # the object without a header
            except Exception as exc2:
                row["error"] = f"export: {type(exc2).__name__}: {_text(exc2)}"
                rows.append(row)
                continue
        row["seconds"] = round(time.perf_counter() - start, 3)
        row["bytes"] = obj.stat().st_size
        rows.append(row)
    sys.__stdout__.write(json.dumps(rows) + "\n")  # type: ignore[union-attr]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="k3-tp8-latency")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/_vllm_units_sm103a")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/vllm_units_sm103a.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import cutlass

    from kimictl.runtime.deployment.profiles import load_profile
    from kimictl.runtime.kernel_plan import plan_units

    plan = plan_units(load_profile(args.profile).spec)
    families: dict[str, Any] = {}
    t_all = time.perf_counter()
    for fam in plan.families():
        picked: dict[Any, list[Any]] = {}
        for unit in plan.units:
            if unit.family == fam.family:
                picked.setdefault(unit.effective, list(unit.key))
        row: dict[str, Any] = {"vllm_units": fam.units, "distinct": fam.distinct}
        if fam.family not in BUILT:
            row["not_built"] = NOT_BUILT_WHY
            families[fam.family] = row
            continue
        argv = [sys.executable, __file__, "--child", fam.family, json.dumps(list(picked.values()))]
        argv.append(str(args.out / fam.family))
        env = {**os.environ, "CUTE_DSL_ARCH": ARCH, "PYTHONPATH": str(ROOT)}
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            row["process_error"] = done.stderr[-600:]
            families[fam.family] = row
            continue
        units = json.loads(done.stdout.strip().splitlines()[-1])
        ok = [u for u in units if "error" not in u]
        secs = [u["seconds"] for u in ok]
        row.update(
            built=len(ok),
            failed=len(units) - len(ok),
            errors=sorted({u["error"] for u in units if "error" in u})[:5],
            header_errors=sorted({u["header_error"] for u in units if "header_error" in u})[:3],
            object_only=sum("header_error" in u for u in units if "error" not in u),
            process_s=round(time.perf_counter() - t0, 1),
            seconds_total=round(sum(secs), 1),
            seconds_median=round(statistics.median(secs), 3) if secs else None,
            seconds_max=max(secs) if secs else None,
            bytes_total=sum(u["bytes"] for u in ok),
            bytes_median=int(statistics.median(u["bytes"] for u in ok)) if ok else None,
            units=units,
        )
        families[fam.family] = row
        print(fam.family, {k: v for k, v in row.items() if k != "units"}, flush=True)
    doc = {
        "command": "PYTHONPATH=$PWD python benchmarks/vllm_units_sm103.py --profile "
        + args.profile,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"CPU build machine ({os.cpu_count()} shared cores, no GPU, no libcuda)",
        "cutlass_dsl": cutlass.__version__,
        "arch": ARCH,
        "wall_s": round(time.perf_counter() - t_all, 1),
        "families": families,
    }
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4]))
        sys.exit(0)
    sys.exit(main())
