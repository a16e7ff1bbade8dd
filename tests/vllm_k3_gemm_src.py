"""vLLM 0.33.0's REAL `low_latency_gemm.py` and `linear.py`, loaded on a CPU box without torch.

Sources: the `vllm==0.33.0` wheel fetched once with `pip download --no-deps` into
~/.cache/kimictl/vllm-src/0.33.0, `.py` files only (the cache tests/vllm_src.py of issue 14
shares). Everything those two files import is stubbed here, by hand where behaviour matters:

- torch: dtypes, an nn.Module that tracks children, and FakeTensor (shape, stride, dtype, device;
  no data). Every GEMM path returns a FakeTensor whose `made_by` names the path that ran, so a
  test can see which of {vLLM's CuTe, vLLM's dsv3, vLLM's cuBLAS fallback, cuBLAS, a kimictl op}
  served each call.
- vLLM's platform answers SM90 (the H200's table, KIMI_K3_PROJECTIONS_SM90), CUDA.
- other vllm.* modules linear.py imports at module level are permissive stubs.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

VLLM_VERSION = "0.33.0"
LLG = "vllm/models/kimi_k3/nvidia/low_latency_gemm.py"
LINEAR = "vllm/model_executor/layers/linear.py"
SKINNY = "vllm/model_executor/kernels/linear/cute_dsl/skinny_gemm.py"


def cache_dir() -> Path:
    import os

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kimictl" / "vllm-src" / VLLM_VERSION


def ensure_sources() -> tuple[Path | None, str]:
    root = cache_dir()
    if (root / LLG).is_file() and (root / LINEAR).is_file():
        return root, ""
    with tempfile.TemporaryDirectory(prefix="kimictl-vllm-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--dest", tmp, f"vllm=={VLLM_VERSION}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        wheels = sorted(Path(tmp).glob("vllm-*.whl"))
        if done.returncode != 0 or not wheels:
            return None, f"pip download vllm=={VLLM_VERSION} failed: {done.stderr[-300:]}"
        with zipfile.ZipFile(wheels[0]) as archive:
            for info in archive.infolist():
                if info.filename.startswith("vllm/") and info.filename.endswith(".py"):
                    archive.extract(info, root)
    return root, ""


# ---------------------------------------------------------------- torch


class dtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


bfloat16, float16, float32 = dtype("bfloat16"), dtype("float16"), dtype("float32")


class Tensor:
    pass


class FakeTensor(Tensor):
    def __init__(
        self,
        shape: tuple[int, ...],
        dtype_: dtype = bfloat16,
        *,
        device: str = "cuda:0",
        stride: tuple[int, ...] | None = None,
        made_by: str = "",
    ) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype_
        self.device = device
        self._stride = stride or tuple(_prod(self.shape[i + 1 :]) for i in range(len(self.shape)))
        self.made_by = made_by

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def dim(self) -> int:
        return len(self.shape)

    def element_size(self) -> int:
        return 4 if self.dtype is float32 else 2

    def data_ptr(self) -> int:
        return 0  # 16-byte aligned, as vLLM's skinny GEMM checks

    def stride(self, i: int | None = None) -> Any:
        return self._stride if i is None else self._stride[i]

    def size(self, i: int | None = None) -> Any:
        return self.shape if i is None else self.shape[i]

    def is_contiguous(self) -> bool:
        return self._stride == tuple(_prod(self.shape[i + 1 :]) for i in range(len(self.shape)))

    def t(self) -> FakeTensor:
        return FakeTensor(
            self.shape[::-1], self.dtype, device=self.device, stride=self._stride[::-1]
        )

    def new_empty(self, shape: tuple[int, ...]) -> FakeTensor:
        return FakeTensor(shape, self.dtype, device=self.device)


def _prod(xs: tuple[int, ...]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


class Module:
    def __init__(self) -> None:
        object.__setattr__(self, "_children", {})

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Module):
            self.__dict__.setdefault("_children", {})[name] = value
        object.__setattr__(self, name, value)

    def modules(self) -> Any:
        yield self
        for child in self.__dict__.get("_children", {}).values():
            yield from child.modules()


def _out(x: FakeTensor, n: int, made_by: str) -> FakeTensor:
    return FakeTensor((x.shape[0], n), x.dtype, device=x.device, made_by=made_by)


def make_torch(calls: list[str]) -> dict[str, types.ModuleType]:
    torch = types.ModuleType("torch")
    nn = types.ModuleType("torch.nn")
    functional = types.ModuleType("torch.nn.functional")
    parameter = types.ModuleType("torch.nn.parameter")

    def linear(x: FakeTensor, w: FakeTensor, bias: Any = None) -> FakeTensor:
        calls.append("cublas")
        return _out(x, w.shape[0], "cublas" if bias is None else "cublas+bias")

    def empty(shape: Any, *a: Any, dtype: dtype = bfloat16, device: str = "cuda:0") -> FakeTensor:
        return FakeTensor(tuple(shape), dtype, device=device)

    def addmm(r: FakeTensor, x: FakeTensor, wt: FakeTensor) -> FakeTensor:
        calls.append("cublas-addmm")
        return _out(x, wt.shape[1], "cublas-addmm")

    def kimictl_op(x: FakeTensor, w: FakeTensor, variant: str) -> FakeTensor:
        calls.append(f"kimictl:{variant}")
        return _out(x, w.shape[0], f"kimictl:{variant}")

    functional.linear = linear  # type: ignore[attr-defined]
    nn.Module = Module  # type: ignore[attr-defined]
    nn.functional = functional  # type: ignore[attr-defined]
    nn.parameter = parameter  # type: ignore[attr-defined]
    parameter.Parameter = FakeTensor  # type: ignore[attr-defined]
    ops = types.SimpleNamespace(
        _C=types.SimpleNamespace(dsv3_fused_a_gemm=object()),
        kimictl=types.SimpleNamespace(decode_gemm=kimictl_op),
    )
    cuda = types.SimpleNamespace(Stream=object, Event=object)
    registered: dict[str, Any] = {}

    def custom_op(name: str, mutates_args: Any, schema: str | None = None) -> Any:
        def wrap(fn: Any) -> Any:
            fn.register_fake = lambda fake: registered.setdefault(f"{name}/fake", fake)
            registered[name] = fn
            return fn

        return wrap

    library = types.SimpleNamespace(custom_op=custom_op, registered=registered)
    torch.__dict__.update(
        dtype=dtype, bfloat16=bfloat16, float16=float16, float32=float32, Tensor=Tensor,
        nn=nn, ops=ops, cuda=cuda, library=library, empty=empty, addmm=addmm, mm=None, Size=tuple,
    )  # fmt: skip
    return {
        "torch": torch,
        "torch.nn": nn,
        "torch.nn.functional": functional,
        "torch.nn.parameter": parameter,
    }


# ---------------------------------------------------------------- vllm


class _AnyMeta(type):
    """Stub classes: an unknown class attribute is a decorator factory (`X.register("n")`)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: lambda f: f


class _StubModule(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _AnyMeta(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls


class _StubFinder:
    """Any vllm.* module not set up by hand is a permissive stub (linear.py's many imports)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "vllm" or name.startswith("vllm."):
            return importlib.util.spec_from_loader(name, self)  # type: ignore[arg-type]
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class SkinnyGemmConfig(tuple):
    def __new__(cls, *args: Any, vector_width: int = 8, static_k: int | None = None) -> Any:
        return super().__new__(cls, (*args, vector_width, static_k))


class World:
    """The loaded sources and the knobs a test turns (batch-invariant mode, the platform)."""

    def __init__(self, root: Path, monkeypatch: Any, *, real_skinny: bool = False) -> None:
        """real_skinny: vLLM's real skinny_gemm.py (SkinnyGemmConfig, ShapeDynamicSkinnyGemm and
        its singleton) instead of the recording stand-in."""
        self.calls: list[str] = []
        mods = make_torch(self.calls)
        self.torch = mods["torch"]
        self.envs = types.SimpleNamespace(VLLM_BATCH_INVARIANT=False)
        self.capability = (9, 0)
        calls = self.calls

        class Skinny:
            def is_available(self) -> bool:
                return True

            def __call__(self, x: Any, w: Any, config: Any, residual: Any) -> Any:
                tag = "vllm-cute" + ("+res" if residual is not None else "")
                calls.append(tag)
                return _out(x, w.shape[0], tag)

            def request_warmup_configs(self, *a: Any, **k: Any) -> None:
                calls.append("vllm-warmup")

        def dsv3(out: Any, x: Any, wt: Any, enable_pdl: bool) -> None:
            calls.append("vllm-dsv3")
            out.made_by = "vllm-dsv3"

        world = self
        platform = types.SimpleNamespace(
            is_device_capability=lambda cap: tuple(cap) == world.capability,
            is_cuda_alike=lambda: True,
            is_xpu=lambda: False,
            is_cpu=lambda: False,
            is_rocm=lambda: False,
        )

        def gemm_impl(backend: str) -> Any:
            return lambda layer, x, w, bias: mods["torch.nn.functional"].linear(x, w, bias)  # type: ignore[attr-defined]

        def batch_invariant(x: Any, w: Any, bias: Any) -> Any:
            calls.append("vllm-batch-invariant")
            return _out(x, w.shape[0], "vllm-batch-invariant")

        finder = _StubFinder()
        monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
        for name in [n for n in sys.modules if n == "vllm" or n.startswith(("vllm.", "torch"))]:
            monkeypatch.delitem(sys.modules, name)
        for name, mod in mods.items():
            monkeypatch.setitem(sys.modules, name, mod)

        def stub(name: str, **attrs: Any) -> types.ModuleType:
            mod = _StubModule(name)
            mod.__dict__.update(attrs)
            monkeypatch.setitem(sys.modules, name, mod)
            parent, _, leaf = name.rpartition(".")
            if parent in sys.modules:  # `from vllm import _custom_ops` reads the attribute
                setattr(sys.modules[parent], leaf, mod)
            return mod

        class PluggableLayer(Module, metaclass=_AnyMeta):
            pass

        class ParallelLMHead(Module):
            pass

        class UnquantizedEmbeddingMethod:
            def apply(self, layer: Any, x: Any, bias: Any = None) -> Any:
                return mods["torch.nn.functional"].linear(x, layer.weight, bias)  # type: ignore[attr-defined]

        class KimiK3DeltaAttention(Module):
            pass

        stub("vllm", envs=self.envs)
        monkeypatch.setitem(sys.modules, "vllm.envs", self.envs)
        stub("vllm._custom_ops", dsv3_fused_a_gemm=dsv3)
        stub("vllm.platforms", current_platform=platform)
        stub("vllm.logger", init_logger=logging.getLogger)
        stub("vllm.config", get_current_vllm_config_or_none=lambda: None)
        stub("vllm.model_executor.custom_op", PluggableLayer=PluggableLayer)
        stub("vllm.model_executor.layers.utils", dispatch_unquantized_gemm=gemm_impl)
        stub(
            "vllm.model_executor.determinism.batch_invariant",
            linear_batch_invariant=batch_invariant,
        )
        if real_skinny:
            self.skinny_module = self._load(
                "vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm", root / SKINNY,
                monkeypatch,
            )  # fmt: skip
        else:
            stub(
                "vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm",
                SkinnyGemmConfig=SkinnyGemmConfig,
                shape_dynamic_skinny_gemm=Skinny(),
            )
        stub(
            "vllm.model_executor.layers.vocab_parallel_embedding",
            ParallelLMHead=ParallelLMHead,
            UnquantizedEmbeddingMethod=UnquantizedEmbeddingMethod,
        )
        stub("vllm.models.kimi_k3.nvidia.kda", KimiK3DeltaAttention=KimiK3DeltaAttention)
        self.linear = self._load("vllm.model_executor.layers.linear", root / LINEAR, monkeypatch)
        self.llg = self._load(
            "vllm.models.kimi_k3.nvidia.low_latency_gemm", root / LLG, monkeypatch
        )
        self.ParallelLMHead = ParallelLMHead
        self.KimiK3DeltaAttention = KimiK3DeltaAttention

    @staticmethod
    def _load(name: str, path: Path, monkeypatch: Any) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    # ------------------------------------------------------------ model pieces

    def linear_layer(self, n: int, k: int, *, quant_method: Any = None) -> Any:
        """A real vLLM ReplicatedLinear (its __init__ needs a vLLM config: bypassed) holding a
        bf16 [n, k] weight and vLLM's real UnquantizedLinearMethod."""
        cls = self.linear.ReplicatedLinear
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer.weight = FakeTensor((n, k))
        layer.quant_method = quant_method or self.linear.UnquantizedLinearMethod()
        return layer

    def lm_head(self, n: int, k: int) -> Any:
        vpe = sys.modules["vllm.model_executor.layers.vocab_parallel_embedding"]
        head = self.ParallelLMHead()
        head.weight = FakeTensor((n, k))
        head.quant_method = vpe.UnquantizedEmbeddingMethod()  # type: ignore[attr-defined]
        return head
