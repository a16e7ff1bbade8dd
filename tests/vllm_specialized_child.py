"""Child process of tests/test_vllm_specialized.py: vLLM 0.33.0's real oproj/prepared.py and
attn_res/prepared.py (wheel sources through kimictl's own `compile_modules`, torch a stand-in),
kimictl's plugin step on them, then calls as vLLM's Prepared* classes make them.

    python tests/vllm_specialized_child.py SOURCES REQUEST_JSON

REQUEST: {"folder", "installed", "broken": [symbols whose load raises], "calls": [[group, args]],
"prepared_attn_res": [nb, delta, write, final] or null}. vLLM's compile bodies run for real up
to `cute.compile`, which is replaced by a recorder (what vLLM's JIT would have compiled). Prints
one JSON line: per call "loaded SYMBOL" or "compiled KERNEL", the loader's calls, the log lines.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path
from typing import Any


def main() -> int:
    sources, request = Path(sys.argv[1]), json.loads(sys.argv[2])
    from kimictl.kernels.vllm import prebuilt as vllm_prebuilt
    from kimictl.kernels.vllm.specialized import COMPILERS, compile_modules

    modules = compile_modules(sources)
    compiled: list[str] = []
    for module in modules.values():  # vLLM's JIT, observed at its cute.compile call
        real = module.cute
        module.cute = types.SimpleNamespace(
            compile=lambda kernel, *a, **k: compiled.append(type(kernel).__name__) or "jit",
            **{n: getattr(real, n) for n in ("sym_int",)},
        )
    loads: list[list[str]] = []
    broken = set(request.get("broken", []))

    def loader(path: Path, symbol: str) -> Any:
        loads.append([path.name, symbol])
        if symbol in broken:
            raise RuntimeError("JITLink: bad object")
        return f"loaded {symbol}"

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("vllm.kimictl").addHandler(handler)
    logging.getLogger("vllm.kimictl").setLevel(logging.INFO)
    env = {vllm_prebuilt.PREBUILT_ENV: request["folder"]}
    vllm_prebuilt.load_prebuilt(env, installed=request["installed"], loader=loader)
    wrapped = {
        g: bool(getattr(getattr(modules[g], f), "__kimictl_wrapped__", False))
        for g, (_, f) in COMPILERS.items()
    }
    results = []
    for group, args in request["calls"]:
        before = len(compiled)
        fn = getattr(modules[group], COMPILERS[group][1])  # looked up as vLLM's classes do
        out = fn(*args)
        results.append(out if out != "jit" else f"compiled {compiled[before]}")
    if request.get("prepared_attn_res"):  # vLLM's own PreparedAttnRes._compile -> global
        prepared = modules["attn_res"]
        prepared.architecture = lambda device: "sm_103a"  # torch.cuda capability: no GPU here
        obj = object.__new__(prepared.PreparedAttnRes)
        obj.device, obj.key = None, tuple(request["prepared_attn_res"])
        out = obj._compile(0, 0)
        results.append(out if out != "jit" else f"compiled {compiled[-1]}")
    print(json.dumps({"results": results, "loads": loads, "log": records, "wrapped": wrapped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
