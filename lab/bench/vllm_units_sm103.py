"""Build every sm_103a unit of `kimictl kernels plan k3-tp8-latency` on this CPU machine.

One fresh process per family runs vLLM 0.33.0's REAL compile body (wheel sources via
tests/vllm_src.py, torch stubbed, CUTE_DSL_ARCH=sm_103a, no GPU, no libcuda) once per distinct
effective key of the plan, with the arguments vLLM's own code hands it:
- plain keys: o-projection (`oproj/prepared.py::compile_oproj`) and AttnRes
  (`attn_res/prepared.py::compile_consumer`) through the product's build code
  (kimictl/kernels/vllm/specialized.py: vLLM's argument order, export), split-K input projection
  (`gemm/projection.py::compile_projection`: symbolic fake tensors; its kernel imports FlashInfer's
  `dense_bf16_gemm_sm100_splitk`, taken from an unpacked flashinfer-python wheel named by
  $FLASHINFER_SRC), skinny projection (`ShapeDynamicSkinnyGemm._compile` through
  kimictl/kernels/vllm/prebuilt.py's AOT seams; needs quack-kernels and apache-tvm-ffi on
  PYTHONPATH);
- prepared layouts: the KDA and MLA cores compile from the layouts of real weights and KV views.
  vLLM's own `PreparedKda.prepare_caches` / `PreparedMla.prepare_cache` run here on strided
  tensors without data (`_Fake`) shaped as nvidia/kda.py, nvidia/mla.py and vLLM's state-shape
  code make them; the compile function's arguments are recorded, then each is compiled.
Each result is exported with vllm_specialized.export_object (`export_to_c`, falling back to
`dump_to_object` where the C header generator refuses the signature), and to the device fat
binary where no host object dumps. Per
unit: compile seconds, compile + export seconds, bytes, the embedded SM, or the error. Nothing
here loads or runs on Blackwell (no GB300 is lent).

    FLASHINFER_SRC=DIR PYTHONPATH=$PWD:<quack+tvm-ffi> python lab/bench/vllm_units_sm103.py \
        [--profile P] [--families F,G] [--smem-per-sm BYTES] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

from kimictl.kernels.toolchain.build import embedded_sm
from kimictl.kernels.vllm.plan import K3_LAYOUT, _kda_pitch, _mla_pitch
from kimictl.kernels.vllm.specialized import (
    COMPILERS,
    FAMILIES,
    compile_modules,
    export_object,
    vllm_args,
)

ROOT = Path(__file__).resolve().parents[2]
ARCH = "sm_103a"
K3_HEADS = K3_LAYOUT.heads
# KV cache blocks in the fake KDA state / MLA page views: a static dimension of the compiled
# layouts that vLLM sizes from free GPU memory at start-up (an assumption here).
KV_BLOCKS = 1024
# family -> [(plan key, the compile function's arguments vLLM's Prepared* class passed)]
RECORDED: dict[str, list[tuple[Any, tuple[Any, ...]]]] = {}


def _text(exc: BaseException) -> str:
    """The DSL's message without colour codes and boilerplate, one line."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    text = text.replace("The compiler hit an internal DSL problem while compiling your code.", "")
    text = text.replace("note: This is a bug in the DSL, not a mistake in your kernel.", "")
    text = text.split("suggestion:")[0]
    return " ".join(text.split())[:400]


class _Fake:
    """A strided tensor without data: shape, strides and dtype as the real one would have them,
    views keep strides (what `layout()` reads and `fake()` hands to cute.compile)."""

    def __init__(self, shape: Any, dtype: Any, stride: Any = None) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        self._stride = tuple(stride) if stride is not None else _rowmajor(self.shape)
        self.device = types.SimpleNamespace(index=0, type="cuda")
        self.is_cuda = False
        self.ndim = len(self.shape)

    def stride(self, i: int | None = None) -> Any:
        return self._stride if i is None else self._stride[i]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return int(self.dtype.itemsize)

    def __getitem__(self, item: Any) -> _Fake:
        items = item if isinstance(item, tuple) else (item,)
        shape, stride = [], []
        for i, (n, st) in enumerate(zip(self.shape, self._stride, strict=True)):
            cut = items[i] if i < len(items) else slice(None)
            if isinstance(cut, slice):
                shape.append(len(range(*cut.indices(n))))
                stride.append(st * (cut.step or 1))
        return _Fake(shape, self.dtype, stride)

    def transpose(self, a: int, b: int) -> _Fake:
        shape, stride = list(self.shape), list(self._stride)
        shape[a], shape[b], stride[a], stride[b] = shape[b], shape[a], stride[b], stride[a]
        return _Fake(shape, self.dtype, stride)

    def permute(self, *order: int) -> _Fake:
        return _Fake([self.shape[i] for i in order], self.dtype, [self._stride[i] for i in order])

    def view(self, *shape: Any) -> _Fake:
        if len(shape) == 1 and not isinstance(shape[0], (int, tuple, list)):  # view(dtype)
            return self if shape[0] is self.dtype else _Fake(self.shape, shape[0], self._stride)
        shape = tuple(shape[0]) if isinstance(shape[0], (tuple, list)) else shape
        if -1 in shape:
            rest = math.prod(n for n in shape if n != -1)
            shape = tuple(self.numel() // rest if n == -1 else n for n in shape)
        assert self._stride == _rowmajor(self.shape), "view of a non-contiguous fake"
        return _Fake(shape, self.dtype)

    def contiguous(self) -> _Fake:
        return _Fake(self.shape, self.dtype)

    def detach(self) -> _Fake:
        return self

    def float(self) -> _Fake:
        return _Fake(self.shape, sys.modules["torch"].float32)


def _rowmajor(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def _empty(*shape: Any, dtype: Any = None, **kw: Any) -> _Fake:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return _Fake(shape, dtype if dtype is not None else sys.modules["torch"].bfloat16)


def _kda_attention(torch: Any, tp: int) -> Any:
    """The KDA layer's tensors as nvidia/kda.py makes them (TP-local): conv1d.weight [3D, 1, 4]
    fp32 (params_dtype, unsqueezed), no conv bias, dt_bias [D] fp32, A_log [H] fp32, f_b_proj
    [D, 128] bf16, o_norm [128] (FusedRMSNormGated(head_dim)), gate_lower_bound."""
    h = K3_HEADS // tp
    d = h * 128
    ns = types.SimpleNamespace
    return ns(
        conv1d=ns(bias=None, weight=_Fake((3 * d, 1, 4), torch.float32)),
        dt_bias=_Fake((d,), torch.float32),
        A_log=_Fake((h,), torch.float32),
        f_b_proj=ns(weight=_Fake((d, 128), torch.bfloat16)),
        o_norm=ns(weight=_Fake((128,), torch.bfloat16), eps=1e-6),
        gate_lower_bound=-5.0,
    )


def _kda_caches(torch: Any, tp: int, q: int) -> list[_Fake]:
    """vLLM's KDA state views (MambaStateShapeCalculator.kda_state_shape, default "SD" conv
    layout, bf16 conv / fp32 recurrent state for mamba dtypes "auto"): per block one page
    holding both states (gpu_model_runner's as_strided views: dim 0 strides by the page)."""
    h = K3_HEADS // tp
    conv = (q - 1 + 3, 3 * h * 128)  # (state_len, dim): conv_kernel_size - 1 + num_spec
    state = (h, 128, 128)
    page = math.prod(conv) * 2 + math.prod(state) * 4  # bytes, unpadded
    blocks = KV_BLOCKS
    return [
        _Fake((blocks, *conv), torch.bfloat16, (page // 2, *_rowmajor(conv))),
        _Fake((blocks, *state), torch.float32, (page // 4, *_rowmajor(state))),
    ]


def _mla_attention(torch: Any, tp: int) -> Any:
    """The MLA layer's tensors as nvidia/mla.py leaves them after process_weights_after_loading:
    W_UK_T / W_UV are permuted / transposed views of kv_b_proj's dequantised [H*256, 512]
    weight (split_kv_b_proj: weight.T.view(512, H, 256).split), not contiguous copies."""
    h = K3_HEADS // tp
    ns = types.SimpleNamespace
    w_uk = _Fake((512, h, 128), torch.bfloat16, (1, 256 * 512, 512))
    return ns(
        W_UK_T=w_uk.permute(1, 2, 0),
        W_UV=w_uk.transpose(0, 1),  # same strides as W_UK, offset by 128 columns
        q_a_layernorm=ns(weight=_Fake((1536,), torch.bfloat16)),
        kv_a_layernorm=ns(weight=_Fake((512,), torch.bfloat16)),
        q_b_proj=ns(weight=_Fake((h * 192, 1536), torch.bfloat16)),
        _q_scale_inv=_Fake((1,), torch.float32),
        _k_scale_inv=_Fake((1,), torch.float32),
        _k_scale_float=1.0,
        _q_scale_float=1.0,
        scale=192**-0.5,
        rms_norm_eps=1e-6,
    )


def _recorded(module: Any, name: str) -> list[tuple[Any, ...]]:
    """Replace `module.name` (an @cache'd compile function) by a recorder; its argument list."""
    seen: list[tuple[Any, ...]] = []
    setattr(module, name, lambda *a: seen.append(a) or (None, None))
    return seen


def _vllm_units(family: str, keys: list[list[Any]], tp: int, q: int) -> list[tuple[Any, Any]]:
    """(key, thunk) per unit: the thunk runs vLLM's real compile body on the arguments vLLM's own
    Prepared* class passes it; it returns the compiled kernels."""
    sys.path.insert(0, str(ROOT / "tests"))
    if family == "skinny_projection":  # vLLM's ShapeDynamicSkinnyGemm, kimictl's AOT seams
        from kimictl.kernels.vllm.prebuilt import _aot_class, skinny_from_sources

        sources = _sources()
        module = skinny_from_sources(sources)
        obj = _aot_class(module, ARCH)()
        dtype = sys.modules["torch"].bfloat16

        def skinny(cfg: list[Any], residual: bool) -> Any:
            config = module.SkinnyGemmConfig(*cfg)
            obj._compile(dtype, config, residual)
            return [obj._compiled.pop((dtype, config, residual))]

        return [(k, lambda k=k: skinny(k[1], k[2])) for k in keys]
    import importlib

    import vllm_src

    vllm_src.load(_sources())
    torch = sys.modules["torch"]
    if os.environ.get("KIMICTL_SMEM_PER_SM"):  # after the stubs: the DSL imports torch
        _smem_standin(int(os.environ["KIMICTL_SMEM_PER_SM"]))
    base = "vllm.models.kimi_k3.nvidia.specialized_decode.cutedsl"
    if family in FAMILIES:  # o-proj, AttnRes: the product's build (kernels/vllm/specialized.py)
        group = FAMILIES[family]
        module = compile_modules()[group]  # vllm_src's stubs already made vLLM importable
        body = getattr(module, COMPILERS[group][1]).__wrapped__
        return [(k, lambda k=k: [body(*vllm_args(family, k, ARCH))]) for k in keys]
    if family == "splitk_projection":  # gemm/projection.py: plain key (tactic, dtype, arch)
        # vLLM probes for FlashInfer at import (utils/flashinfer.py): let it find none first
        importlib.import_module("vllm.utils.flashinfer")
        _bare_packages("flashinfer.gemm.kernels")  # splitk.py imports FlashInfer's CuTe core
        proj = importlib.import_module(f"{base}.gemm.projection").compile_projection
        dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
        return [(k, lambda k=k: [proj.__wrapped__(tuple(k[0]), dtypes[k[1]], ARCH)]) for k in keys]
    if family == "kda_core":
        kda = importlib.import_module(f"{base}.kda.prepared")
        real = kda.executable.__wrapped__
        kda.torch.empty = _empty
        seen = _recorded(kda, "executable")
        pitch = _kda_pitch(tp, K3_LAYOUT)
        policies = {}
        for batch, _h, mode, tokens in keys:  # providers.py Attention: batch or (requests, q)
            policies[batch if tokens == 1 else (batch // tokens, tokens)] = (pitch, mode)
        prepared = kda.PreparedKda(_kda_attention(torch, tp), policies, False)  # "SD" layout
        prepared.prepare_caches(_kda_caches(torch, tp, q))
        units = []
        for key, args in zip(keys, seen, strict=True):
            specs, heads, mode, bias, device, tokens = args
            assert [specs[0][0][0], heads, mode, tokens] == list(key), (key, args)
            units.append((key, lambda a=args: [real(*a)]))
        RECORDED[family] = list(zip(keys, seen, strict=True))
        return units
    if family == "mla_core":
        mla = importlib.import_module(f"{base}.mla.prepared")
        real = mla.compile_core.__wrapped__
        mla.torch.empty = _empty
        mla.to_cute = lambda t, *a: t
        # host.prepare_shared_carveout sets a driver function attribute on the loaded kernel
        # (cuLibrary*/cuFuncSetAttribute): a load step that needs libcuda, skipped here.
        mla.prepare_shared_carveout = lambda kernel, device, percent: kernel
        props = types.SimpleNamespace(multi_processor_count=148)  # GB300
        mla.torch.cuda.get_device_properties = lambda d: props
        seen = _recorded(mla, "compile_core")
        batches = sorted({k[0] for k in keys})
        queries = tuple(sorted({k[4] for k in keys}))
        pitch = _mla_pitch(tp, K3_LAYOUT)
        scratch = _Fake((64, K3_HEADS // tp, 576), torch.uint8)
        prepared = mla.PreparedMla(
            _mla_attention(torch, tp), dict.fromkeys(batches, pitch), scratch, queries=queries
        )
        prepared.prepare_cache(_Fake((KV_BLOCKS, 64, 656), torch.uint8))  # fp8_ds_mla pages
        by_key = {(a[0], a[1], a[2], a[5], a[7]): a for a in seen}
        RECORDED[family] = [(k, by_key[tuple(k)]) for k in keys]
        return [(k, lambda a=by_key[tuple(k)]: list(real(*a))) for k in keys]
    raise ValueError(f"no builder for family {family}")


def _bare_packages(dotted: str) -> None:
    """Register the packages of `dotted` under $FLASHINFER_SRC (an unpacked flashinfer-python
    wheel) without running their __init__ (FlashInfer's imports torch and its JIT): vLLM's
    splitk.py needs one DSL module of it."""
    import importlib.machinery

    root = Path(os.environ.get("FLASHINFER_SRC", "")) / dotted.split(".")[0]
    if not root.is_dir():
        raise SystemExit(f"FLASHINFER_SRC must name an unpacked flashinfer-python wheel: {root}")
    parts = dotted.split(".")
    for i in range(1, len(parts) + 1):
        pkg = types.ModuleType(".".join(parts[:i]))
        pkg.__path__ = [str(root.joinpath(*parts[1:i]))]
        pkg.__spec__ = importlib.machinery.ModuleSpec(pkg.__name__, None, is_package=True)
        sys.modules.setdefault(pkg.__name__, pkg)


def _kernels_binary(compiled: Any) -> bytes | None:
    """The device fat binary of a compiled function whose host part did not export."""
    from cutlass._mlir import ir

    found: list[bytes] = []

    def visit(op: Any) -> Any:
        if op.name == "llvm.mlir.global" and str(op.attributes["sym_name"]) == '"kernels_binary"':
            found.append(bytes(ir.StringAttr(op.attributes["value"]).value_bytes))
        return ir.WalkResult.ADVANCE

    compiled.ir_module.operation.walk(visit)
    return found[0] if found else None


def _sources() -> Path:
    import vllm_src

    sources, why = vllm_src.ensure_sources()
    if sources is None:
        raise SystemExit(why)
    return sources


def _smem_standin(value: int) -> None:
    """Answer the DSL's one driver query (MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, asked while
    compiling a kernel launched with min_blocks_per_mp > 1 and no carveout) without libcuda."""
    from cutlass.base_dsl.runtime import cuda as helpers

    attributes = helpers.cuda.CUdevice_attribute
    wanted = attributes.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    real = helpers.get_device_attribute

    def answer(attribute: Any, device_id: int = 0) -> Any:
        return value if attribute == wanted else real(attribute, device_id)

    helpers.get_device_attribute = answer


def _child(family: str, keys: list[list[Any]], out: Path, tp: int, q: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (key, thunk) in enumerate(_vllm_units(family, keys, tp, q)):
        name = f"{family.replace('.', '_')}_{i:03d}"
        start = time.perf_counter()
        try:
            kernels = thunk()
            compile_s = time.perf_counter() - start
        except Exception as exc:
            rows.append({"key": key, "error": f"compile: {type(exc).__name__}: {_text(exc)}"})
            continue
        row: dict[str, Any] = {"key": key, "compile_s": round(compile_s, 3), "bytes": 0}
        for j, compiled in enumerate(kernels):  # MLA: query and value kernels
            part = name if len(kernels) == 1 else f"{name}_{j}"
            obj = out / f"{part}.o"
            try:
                if "function_prefix" in inspect.signature(compiled.export_to_c).parameters:
                    obj, how = export_object(compiled, out, part)  # the product's export
                    if how != "export_to_c":
                        row["header_error"] = "the C header generator refused the signature"
                else:  # the TVM-FFI variant (skinny GEMM): (object path, symbol)
                    compiled.export_to_c(str(obj), part)
            except Exception as exc:
                # cute.experimental.compile (split-K): the host object will not dump; the
                # device code is the fat binary held in the module's `kernels_binary`
                row["export_error"] = f"{type(exc).__name__}: {_text(exc)}"
                fatbin = _kernels_binary(compiled)
                if fatbin is None:
                    row["error"] = f"export: {row['export_error']}"
                    break
                obj = out / f"{part}.fatbin"
                obj.write_bytes(fatbin)
                row["device_only"] = True
            row["bytes"] += obj.stat().st_size
            row["sm"] = embedded_sm(obj)
        row["seconds"] = round(time.perf_counter() - start, 3)
        rows.append(row)
    sys.__stdout__.write(json.dumps(rows) + "\n")  # type: ignore[union-attr]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="k3-tp8-latency")
    ap.add_argument("--out", type=Path, default=ROOT / "lab/_vllm_units_sm103a")
    ap.add_argument("--json", type=Path, default=ROOT / "lab/results/vllm_units_sm103a.json")
    ap.add_argument(
        "--smem-per-sm",
        type=int,
        help="answer the DSL's shared-memory-per-SM driver query with this value (no libcuda "
        "here); results go under the family's `with_smem_standin`",
    )
    ap.add_argument(
        "--families",
        help="comma-separated families to (re)build; the JSON keeps the other families' rows",
    )
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import cutlass

    from kimictl.deployment.profiles import load_profile
    from kimictl.kernels.vllm.plan import plan_units

    plan = plan_units(load_profile(args.profile).spec)
    wanted = set(args.families.split(",")) if args.families else None
    old = json.loads(args.json.read_text()) if wanted and args.json.is_file() else {}
    families: dict[str, Any] = old.get("families", {})
    t_all = time.perf_counter()
    for fam in plan.families():
        if wanted is not None and fam.family not in wanted:
            continue
        picked: dict[Any, list[Any]] = {}
        for unit in plan.units:
            if unit.family == fam.family:
                picked.setdefault(unit.effective, list(unit.key))
        row: dict[str, Any] = {"vllm_units": fam.units, "distinct": fam.distinct}
        row["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        row["load_average_1m"] = round(os.getloadavg()[0], 2)
        keys = json.dumps(list(picked.values()))
        argv = [sys.executable, __file__, "--child", fam.family, keys, str(args.out / fam.family)]
        argv += [str(plan.tp), str(plan.q)]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "CUTE_DSL_ARCH": ARCH, "PYTHONPATH": path}
        if args.smem_per_sm:
            env["KIMICTL_SMEM_PER_SM"] = str(args.smem_per_sm)
            row["smem_per_sm_standin"] = args.smem_per_sm
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        row["load_average_1m_after"] = round(os.getloadavg()[0], 2)
        if done.returncode != 0:
            row["process_error"] = done.stderr[-600:]
            print(fam.family, row, flush=True)
            units = []
        else:
            units = json.loads(done.stdout.strip().splitlines()[-1])
        ok = [u for u in units if "error" not in u]
        secs = [u["seconds"] for u in ok]
        row.update(
            built=len(ok),
            failed=len(units) - len(ok),
            errors=sorted({u["error"] for u in units if "error" in u})[:5],
            header_errors=sorted({u["header_error"] for u in units if "header_error" in u})[:3],
            object_only=sum(
                "header_error" in u and not u.get("device_only") for u in units if "error" not in u
            ),
            device_only=sum(bool(u.get("device_only")) for u in units if "error" not in u),
            export_errors=sorted({u["export_error"] for u in units if "export_error" in u})[:2],
            sms=sorted({u.get("sm") for u in units if "error" not in u}, key=str),
            compile_s_median=round(statistics.median(u["compile_s"] for u in ok), 3)
            if ok
            else None,
            process_s=round(time.perf_counter() - t0, 1),
            seconds_total=round(sum(secs), 1),
            seconds_median=round(statistics.median(secs), 3) if secs else None,
            seconds_max=max(secs) if secs else None,
            bytes_total=sum(u["bytes"] for u in ok),
            bytes_median=int(statistics.median(u["bytes"] for u in ok)) if ok else None,
            units=units,
        )
        if args.smem_per_sm:  # beside the run without the stand-in
            families.setdefault(fam.family, {})["with_smem_standin"] = row
        else:
            families[fam.family] = row
        print(fam.family, {k: v for k, v in row.items() if k != "units"}, flush=True)
    doc = {
        "command": "FLASHINFER_SRC=<flashinfer-python 0.7.2.post1 wheel, unpacked> "
        "PYTHONPATH=$PWD:<quack-kernels 0.6.5 + apache-tvm-ffi 0.1.11> "
        "python lab/bench/vllm_units_sm103.py --profile "
        + args.profile
        + (f" --families {args.families}" if args.families else "")
        + (f" --smem-per-sm {args.smem_per_sm}" if args.smem_per_sm else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"CPU build machine ({os.cpu_count()} shared cores, no GPU, no libcuda)",
        "cutlass_dsl": cutlass.__version__,
        "arch": ARCH,
        "wall_s": round(time.perf_counter() - t_all, 1),
        "earlier_runs": [
            {k: v for k, v in old.items() if k not in ("families", "earlier_runs")},
            *old.get("earlier_runs", []),
        ]
        if old
        else [],
        "families": families,
    }
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        tp, q = int(sys.argv[5]), int(sys.argv[6])
        _child(sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4]), tp, q)
        sys.exit(0)
    sys.exit(main())
