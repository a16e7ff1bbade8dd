"""Prebuilt vLLM skinny GEMM units: build here (CPU), inject and run on the H200, side by side
with the start-up compile they replace.

`build` (CPU machine, DSL + tvm_ffi + quack's compile_utils importable): `kimictl kernels install
--vllm PROFILE --arch sm_90a --vllm-src WHEEL` into OUT/cache (the doctor's versioned layout), a
copy of the wheel's skinny_gemm.py for the device, the DSL's static CUDA-dialect runtime, and the
"without" figure: a fresh process importing the DSL and running vLLM's compile body for every
unit, as vLLM's warmup does at each start (measured HERE: the device has no DSL).

`device` (H200, no DSL, no tvm_ffi, no vLLM): links the exported TVM-FFI objects with a 40-line C
stand-in for the four TVM-FFI/CuTe-runtime entry points they import (error text, env stream) into
one .so; loads vLLM 0.33's real skinny_gemm.py (real torch); `inject_prebuilt()` puts each unit
into that module's `shape_dynamic_skinny_gemm` under vLLM's key; vLLM's warmup path
(request_warmup_configs + every unit's compile) must compile nothing (the original `_compile`
would fail here: no DSL); then vLLM's own `__call__` runs every unit on table shapes, checked
against an fp64 reference, eagerly and inside a CUDA graph. Seams replaced on the device: the
stream (`_stream`: vLLM wraps torch's current stream in a cuda-python CUstream; here the raw
handle, which the TVM-FFI wrapper accepts as an int) and the object loader (the DSL's
`load_module` needs the DSL; the stand-in calls the same exported entry point).

Usage: python lab/bench/vllm_prebuilt_h200.py build OUT [--profile P] [--vllm-src DIR]
       python lab/bench/vllm_prebuilt_h200.py device OUT [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SKINNY_REL = "vllm/model_executor/kernels/linear/cute_dsl/skinny_gemm.py"

SHIM = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct { void* data; DLDevice device; int32_t ndim; DLDataType dtype;
                 int64_t* shape; int64_t* strides; uint64_t byte_offset; } DLTensor;
typedef struct { int32_t type_index; uint32_t pad; union { int64_t v_int64; void* v_ptr; }; }
    TVMFFIAny;
typedef int (*SafeCall)(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
typedef void (*SetParts)(const char*, const char**, int32_t);
static __thread char g_err[4096];
void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* msg) {
  snprintf(g_err, sizeof g_err, "%s: %s", kind, msg);
}
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t o = (size_t)snprintf(g_err, sizeof g_err, "%s: ", kind);
  for (int32_t i = 0; i < n && o < sizeof g_err; i++)
    o += (size_t)snprintf(g_err + o, sizeof g_err - o, "%s", parts[i] ? parts[i] : "");
}
void* TVMFFIEnvGetStream(int32_t device_type, int32_t device_id) { return 0; }
void CuteDSLRT_TVMFFISetRaisedCudaError(SetParts set_error, int32_t code) {
  char buf[64]; snprintf(buf, sizeof buf, "CUDA error %d", code);
  const char* parts[1] = {buf}; set_error("CUDADialectError", parts, 1);
}
const char* kimictl_last_error(void) { return g_err; }
/* four 2-D bf16 CUDA tensors (A, B, residual, C) and a stream, as vLLM passes them */
int kimictl_call4(void* fn, void** data, int64_t* shapes, int64_t* strides, int64_t stream,
                  int32_t device_id) {
  DLTensor t[4]; TVMFFIAny args[5], result; memset(&result, 0, sizeof result);
  for (int i = 0; i < 4; i++) {
    t[i].data = data[i]; t[i].device.device_type = 2; t[i].device.device_id = device_id;
    t[i].ndim = 2; t[i].dtype.code = 4; t[i].dtype.bits = 16; t[i].dtype.lanes = 1;
    t[i].shape = shapes + 2 * i; t[i].strides = strides + 2 * i; t[i].byte_offset = 0;
    args[i].type_index = 7; args[i].pad = 0; args[i].v_ptr = &t[i];
  }
  args[4].type_index = 1; args[4].pad = 0; args[4].v_int64 = stream;
  g_err[0] = 0;
  return ((SafeCall)fn)(0, args, 5, &result);
}
"""


def build(out: Path, profile: str, sources: Path) -> None:
    from kimictl.kernels.toolchain.build import RUNTIME_LIB, _runtime_lib_dir

    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KIMICTL_CACHE_DIR": str(out / "cache")}
    argv = [sys.executable, "-m", "kimictl", "kernels", "install", "--vllm", profile]
    argv += ["--arch", "sm_90a", "--vllm-src", str(sources), "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    install_wall = time.perf_counter() - t0
    report = json.loads(done.stdout)
    shutil.copy2(sources / SKINNY_REL, out / "skinny_gemm.py")
    lib_dir = _runtime_lib_dir()
    assert lib_dir is not None, "no DSL runtime library folder"
    shutil.copy2(lib_dir / RUNTIME_LIB, out / RUNTIME_LIB)
    (out / "shim.c").write_text(SHIM)
    # "without": what vLLM's warmup does at each start, in a fresh process (DSL import included)
    probe = (
        "import sys, time, json; t0 = time.perf_counter()\n"
        "from pathlib import Path\n"
        "from kimictl.kernels.vllm.prebuilt import skinny_from_sources, _aot_class\n"
        "from kimictl.kernels.vllm.skinny import skinny_units\n"
        "import os; os.environ['CUTE_DSL_ARCH'] = 'sm_90a'\n"
        "m = skinny_from_sources(Path(sys.argv[1])); import cutlass.cute\n"
        "t1 = time.perf_counter(); o = _aot_class(m, 'sm_90a')(); per = []\n"
        "for u in skinny_units('sm_90a', int(sys.argv[2])):\n"
        "    t = time.perf_counter()\n"
        "    o._compile(sys.modules['torch'].bfloat16, m.SkinnyGemmConfig(*u.config), False)\n"
        "    per.append(round(time.perf_counter() - t, 3))\n"
        "print(json.dumps({'import_s': round(t1 - t0, 2), 'units': len(per),"
        " 'compile_s': round(sum(per), 2), 'per_unit_s': per,"
        " 'total_s': round(time.perf_counter() - t0, 2)}))\n"
    )
    from kimictl.deployment.profiles import load_profile

    tp = load_profile(profile).spec.tensor_parallel_size
    jit = subprocess.run(
        [sys.executable, "-c", probe, str(sources), str(tp)],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    doc = {
        "machine": "CPU build machine (2 shared cores, no GPU)",
        "install": report,
        "install_wall_s": round(install_wall, 2),
        "vllm_jit_without_cache": json.loads(jit.stdout),
    }
    (out / "build.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


def _link(out: Path, folder: Path, manifest: dict[str, Any]) -> Path:
    from kimictl.kernels.toolchain.harness import _cuda_roots, _static_cudart

    root = next(r for r in _cuda_roots() if _static_cudart(r))
    objects = sorted({str(folder / u["object"]) for u in manifest["units"]})
    so = out / "libvllm_skinny_units.so"
    cxx = shutil.which("g++") or "c++"
    argv = [cxx, "-O2", "-fPIC", "-shared", "-o", str(so), "-x", "c", str(out / "shim.c")]
    argv += ["-x", "none", *objects]
    argv += [str(out / "libcuda_dialect_runtime_static.a"), str(_static_cudart(root))]
    argv += ["-ldl", "-lpthread", "-lrt", "-lstdc++"]
    subprocess.run(argv, check=True)
    return so


def device(out: Path, json_path: Path | None) -> None:
    import ctypes
    import importlib.util
    import types

    import torch

    from kimictl.kernels.vllm.prebuilt import SKINNY_MODULE, inject_prebuilt
    from kimictl.kernels.vllm.skinny import SM90_TABLE

    res: dict[str, Any] = {"device": torch.cuda.get_device_name()}
    folder = next((out / "cache").glob("cute-dsl/*/*/manifest.json")).parent
    manifest = json.loads((folder / "manifest.json").read_text())
    t0 = time.perf_counter()
    so = _link(out, folder, manifest)
    res["link_s"] = round(time.perf_counter() - t0, 3)

    # vLLM's real skinny_gemm.py as its own module (its parents are empty packages here)
    parts = SKINNY_MODULE.split(".")
    for i in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    spec = importlib.util.spec_from_file_location(SKINNY_MODULE, out / "skinny_gemm.py")
    assert spec is not None and spec.loader is not None
    sk = importlib.util.module_from_spec(spec)
    sys.modules[SKINNY_MODULE] = sk
    spec.loader.exec_module(sk)
    skinny = sk.shape_dynamic_skinny_gemm
    skinny._stream = lambda: torch.cuda.current_stream().cuda_stream  # seam: raw handle
    jit_calls: list[Any] = []
    skinny._compile = lambda d, c, r: jit_calls.append(c)  # vLLM's JIT (no DSL here): observed

    t_start = time.perf_counter()
    lib = ctypes.CDLL(str(so))
    lib.kimictl_call4.restype = ctypes.c_int
    lib.kimictl_call4.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int32]
    lib.kimictl_last_error.restype = ctypes.c_char_p

    class Unit:  # what vLLM stores in _compiled: called as fn(a, b, residual, c, stream)
        def __init__(self, symbol: str) -> None:
            self.fn = ctypes.cast(lib[f"__tvm_ffi_{symbol}"], ctypes.c_void_p)

        def __call__(self, a: Any, b: Any, r: Any, c: Any, stream: Any) -> None:
            ts = (a, b, r, c)
            ptrs = (ctypes.c_void_p * 4)(*(t.data_ptr() for t in ts))
            shapes = (ctypes.c_int64 * 8)(*(d for t in ts for d in t.shape))
            strides = (ctypes.c_int64 * 8)(*(s for t in ts for s in t.stride()))
            rc = lib.kimictl_call4(self.fn, ptrs, shapes, strides, int(stream), a.device.index)
            if rc != 0:
                raise RuntimeError(lib.kimictl_last_error().decode())

    installed = {
        "cutlass_dsl": manifest["cutlass_dsl"],  # no DSL or vLLM here: the build's, as stated
        "vllm": manifest["vllm"],
        "arch": {(9, 0): "sm_90a"}.get(torch.cuda.get_device_capability()),
    }
    report = inject_prebuilt(
        skinny, folder, dtype=torch.bfloat16, config_cls=sk.SkinnyGemmConfig,
        installed=installed, loader=lambda path, symbol: Unit(symbol),
    )  # fmt: skip
    # vLLM's warmup: request every config, then call each unit's compile (cutedsl_warmup.py)
    configs = {sk.SkinnyGemmConfig(*u["key"][1:7]) for u in manifest["units"]}
    skinny._warmup_configs.update((torch.bfloat16, c, False) for c in configs)
    for d, c, r in list(skinny._warmup_configs):
        skinny._compile(d, c, r)
    res["startup_with_cache_s"] = round(time.perf_counter() - t_start, 4)
    res["inject"] = {"injected": report.injected, "line": report.line()}
    res["warmup_jit_calls"] = len(jit_calls)

    # every unit on each table shape that uses it: vLLM's __call__, fp64 reference
    gen = torch.Generator(device="cuda").manual_seed(0)
    checks, worst = 0, 0.0
    graph_ok = True
    first_call: dict[Any, float] = {}
    for (n, k), cfgs in SM90_TABLE.items():
        for m, cfg in enumerate(cfgs, start=1):
            config = sk.SkinnyGemmConfig(m, *cfg)
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            y = skinny(a, b, config)
            torch.cuda.synchronize()
            if config not in first_call:  # the first call loads the unit's cubin
                first_call[config] = time.perf_counter() - t1
            ref = a.double() @ b.double().t()
            err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, err)
            checks += 1
            if m <= 2 and n * k <= 7168 * 3072:  # one graph capture per small shape
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    yg = skinny(a, b, config)
                g.replay()
                torch.cuda.synchronize()
                graph_ok &= torch.equal(yg, y)
    res["numerics"] = {"checks": checks, "worst_rel_err_vs_fp64": worst, "graph_equal": graph_ok}
    res["jit_calls_total"] = len(jit_calls)
    res["first_calls_s"] = round(sum(first_call.values()), 4)  # cubin loads + first launches
    print(json.dumps(res, indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
    assert report.injected == len(configs) and not jit_calls and worst < 2e-2 and graph_ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("build", "device"))
    ap.add_argument("out", type=Path)
    ap.add_argument("--profile", default="k3-tp8-latency-stock")
    ap.add_argument("--vllm-src", type=Path, default=Path.home() / ".cache/kimictl/vllm-src/0.33.0")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.mode == "build":
        build(args.out, args.profile, args.vllm_src)
    else:
        device(args.out, args.json)


if __name__ == "__main__":
    main()
