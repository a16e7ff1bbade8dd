"""vLLM 0.33.0's real Python sources, importable on a machine without torch or a GPU.

Used by tests/test_doctor_vs_vllm.py (and the docs' example) to run vLLM's own argument parser,
`create_engine_config()` and the Kimi K3 gate beside kimictl's rules.

- Sources: the `vllm==0.33.0` wheel, plus `transformers` and `huggingface_hub` wheels (vLLM builds
  its model config with them), fetched ONCE with `pip download --no-deps` into
  ~/.cache/kimictl/vllm-src/0.33.0 and unpacked to `.py` files only (no compiled code). With the
  cache present nothing touches the network.
- Stubs: every module that is not installed (torch, triton, CUDA libraries, tokenizers, ...) is a
  permissive stub; torch gets real dtype objects (the gate compares KDA dtypes). vLLM's platform
  answers as one GB300 (SM103). vLLM's model-class inspection runs in-process instead of in a
  CUDA-free subprocess (the subprocess would not see the stubs).

The stubs change how imports behave for the whole process, so they run in a CHILD process only:
`python tests/vllm_src.py worker` answers one JSON line per request on stdin
(`{"args": [...], "env": {...}}` -> kimictl.runtime.checks.vllm_gate.VllmVerdict as JSON), and
`python tests/vllm_src.py kimictl ARGS...` runs the kimictl CLI with vLLM importable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import re
import subprocess
import sys
import tempfile
import types
import typing
import zipfile
from pathlib import Path
from typing import Any

VLLM_VERSION = "0.33.0"
# vLLM 0.33.0 wants transformers>=5.16.1,<5.21.0; transformers 5.17 huggingface-hub>=1.5,<2
WHEELS = (f"vllm=={VLLM_VERSION}", "transformers==5.17.0", "huggingface_hub==1.33.0")
PACKAGES = ("vllm", "transformers", "huggingface_hub")
_MARKER = ".kimictl-complete"


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kimictl" / "vllm-src" / VLLM_VERSION


def unpack(wheels: list[Path], target: Path) -> None:
    """The .py files (and transformers' .json data) of `wheels` into `target`, then the marker."""
    target.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                top = info.filename.split("/", 1)[0]
                if top in PACKAGES and info.filename.endswith((".py", ".json")):
                    archive.extract(info, target)
    (target / _MARKER).write_text(" ".join(WHEELS) + "\n")


def ensure_sources() -> tuple[Path | None, str]:
    """(the source folder, "") or (None, why it cannot be had). Downloads only when not cached."""
    target = cache_dir()
    if (target / _MARKER).is_file():
        return target, ""
    with tempfile.TemporaryDirectory(prefix="kimictl-vllm-wheels-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--dest", tmp, *WHEELS]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"pip download of {' '.join(WHEELS)} failed: {exc}"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            return None, f"pip download of {' '.join(WHEELS)} failed: {' '.join(tail)}"
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != len(WHEELS):
            return None, f"pip download gave {len(wheels)} wheels, expected {len(WHEELS)}"
        partial = target.with_name(target.name + ".partial")
        unpack(wheels, partial)
        partial.replace(target)
    return target, ""


# ---------------------------------------------------------------- stubs


class _StubMeta(type(typing.Protocol)):  # type: ignore[misc]
    """Metaclass of stub classes: any attribute is another stub; a stub used as a decorator
    returns the function; it derives from Protocol's metaclass so vLLM classes may mix a stub
    base (nn.Module) with ABCs and Protocols."""

    def __getattr__(cls, name: str) -> Any:
        if (name.startswith("__") and name.endswith("__")) or (
            not cls.__dict__.get("_stub_root") and cls.__module__.startswith("vllm")
        ):
            raise AttributeError(name)
        sub = _new_stub(name)
        type.__setattr__(cls, name, sub)
        return sub

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.__dict__.get("_stub_root") and len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __len__(cls) -> int:
        return 0


class _StubBase:
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _new_stub(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _new_stub("result")()

    def __iter__(self) -> Any:
        return iter(())

    def __deepcopy__(self, memo: Any) -> Any:
        return self

    def __copy__(self) -> Any:
        return self

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _StubBase)

    def __hash__(self) -> int:
        return 0

    def __or__(self, other: Any) -> Any:
        return other

    def __ror__(self, other: Any) -> Any:
        return other

    def __len__(self) -> int:
        return 0

    def __add__(self, other: Any) -> Any:
        return other

    def __radd__(self, other: Any) -> Any:
        return other

    def __bool__(self) -> bool:
        return False


def _new_stub(name: str) -> Any:
    return _StubMeta(name, (_StubBase,), {"_stub_root": True})


class _StubModule(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__file__ = f"<stub {name}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        sub = _new_stub(name)
        setattr(self, name, sub)
        return sub

    def __or__(self, other: Any) -> Any:
        return other

    def __ror__(self, other: Any) -> Any:
        return other

    def __deepcopy__(self, memo: Any) -> Any:
        return self

    def __copy__(self) -> Any:
        return self


class _Dtype:
    """torch.dtype: the gate compares (conv, recurrent) KDA dtypes with torch.bfloat16/float32."""

    def __init__(self, name: str, itemsize: int) -> None:
        self.name, self.itemsize = name, itemsize
        self.is_floating_point = name.startswith(("float", "bfloat"))

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    def __reduce__(self) -> Any:
        return (getattr, (sys.modules["torch"], self.name))


_DTYPES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8,
}  # fmt: skip
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "long": "int64"}


def _torch_module(name: str) -> types.ModuleType:
    module = _StubModule(name)
    if name == "torch.library":
        module.infer_schema = lambda *a, **k: "(Tensor x) -> Tensor"  # type: ignore[attr-defined]
    if name != "torch":
        return module
    module.__version__ = "2.14.0"  # vLLM 0.33.0's pin
    module.dtype = _Dtype  # type: ignore[attr-defined]
    for dtype_name, size in _DTYPES.items():
        setattr(module, dtype_name, _Dtype(dtype_name, size))
    for alias, dtype_name in _DTYPE_ALIASES.items():
        setattr(module, alias, getattr(module, dtype_name))

    def iinfo(dtype: _Dtype) -> Any:
        bits = 8 * dtype.itemsize
        if dtype.name.startswith("uint"):
            return types.SimpleNamespace(min=0, max=2**bits - 1, bits=bits)
        return types.SimpleNamespace(min=-(2 ** (bits - 1)), max=2 ** (bits - 1) - 1, bits=bits)

    def finfo(dtype: _Dtype) -> Any:
        import numpy as np

        info = np.finfo({2: np.float16, 8: np.float64}.get(dtype.itemsize, np.float32))
        return types.SimpleNamespace(
            min=float(info.min), max=float(info.max), eps=float(info.eps),
            tiny=float(info.tiny), bits=8 * dtype.itemsize,
        )  # fmt: skip

    module.iinfo, module.finfo = iinfo, finfo  # type: ignore[attr-defined]
    return module


def _regex_module(name: str) -> types.ModuleType:
    return re if name == "regex" else _StubModule(name)  # `regex` is a superset of `re`


_SPECIAL = {"torch": _torch_module, "regex": _regex_module}

# Modules replaced by stubs although their source is present: vLLM's IR op registry (registers
# torch custom ops at import), its CuMem allocator (loads libcudart at import; sleep mode imports
# it), and transformers' tokenizer/processor/audio layers and its check of installed dependency
# versions (none of which the engine config needs).
_FORCED_STUBS = (
    "vllm.ir",
    "vllm.device_allocator.cumem",
    "transformers.dependency_versions_check",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.auto.image_processing_auto",
    "transformers.models.auto.processing_auto",
    "transformers.processing_utils",
    "transformers.image_processing_utils",
    "transformers.audio_utils",
    "transformers.feature_extraction_utils",
    "transformers.video_processing_utils",
)


class _Loader(importlib.abc.Loader):
    def __init__(self, factory: Any) -> None:
        self.factory = factory

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.factory(spec.name)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _spec(fullname: str, factory: Any) -> importlib.machinery.ModuleSpec:
    return importlib.machinery.ModuleSpec(fullname, _Loader(factory), is_package=True)


class _ForcedStubs(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if any(fullname == p or fullname.startswith(p + ".") for p in _FORCED_STUBS):
            return _spec(fullname, _StubModule)
        return None


class _MissingAsStub(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: an import that vLLM's (or transformers') own code makes of
    anything not installed gets a stub module. Imports made by packages really installed here
    fail as they would without us (their optional dependencies probe with try/except), and
    `importlib.util.find_spec()` (vLLM's "is X installed?") still says no."""

    def __init__(self, sources: Path) -> None:
        self.sources = str(sources)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.split(".", 1)[0]
        if top in sys.stdlib_module_names:
            return None
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if code.co_name == "find_spec" and "util" in code.co_filename:
                return None
            if not code.co_filename.startswith("<frozen") and "/importlib/" not in code.co_filename:
                break
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None or not frame.f_code.co_filename.startswith(self.sources):
            return None
        return _spec(fullname, _SPECIAL.get(top, _StubModule))


def _gb300_platform() -> None:
    """vLLM's CUDA platform class, answering as GB300 GPUs (SM103)."""
    import vllm.platforms as platforms  # type: ignore[import-not-found]
    from vllm.platforms.cuda import CudaPlatformBase  # type: ignore[import-not-found]
    from vllm.platforms.interface import DeviceCapability  # type: ignore[import-not-found]

    class GB300Platform(CudaPlatformBase):  # type: ignore[misc]
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return DeviceCapability(10, 3)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA GB300"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 288 * 1024**3

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def log_warnings(cls) -> None:
            pass

        def is_cumem_allocator_available(self) -> bool:
            return True  # vLLM's CUDA wheel ships the cumem allocator (sleep mode needs it)

        @classmethod
        def device_count(cls) -> int:
            return 64  # a GB300 NVL72 rack is one NVLink domain; TP16 fits

    platforms._current_platform = GB300Platform()


def load(sources: Path) -> None:
    """Make `import vllm` work in THIS process (irreversible: call it in a child process)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sys.path.insert(0, str(sources))
    sys.meta_path.insert(0, _ForcedStubs())
    sys.meta_path.append(_MissingAsStub(sources))
    _gb300_platform()
    import vllm.config.vllm as vllm_config_module  # type: ignore[import-not-found]
    import vllm.model_executor.models.registry as registry  # type: ignore[import-not-found]

    # The GPU node has Triton; without it vLLM 0.33 falls back to the V1 model runner.
    vllm_config_module.HAS_TRITON = True
    # Model-class inspection normally runs in a subprocess to keep CUDA out of the parent.
    registry._run_in_subprocess = lambda fn: fn()


def _worker() -> int:
    from kimictl.runtime.checks.vllm_gate import vllm_verdict

    for line in sys.stdin:
        request = json.loads(line)
        try:
            verdict = vllm_verdict(request["args"], request.get("env", {}))
            answer: dict[str, Any] = {
                "outcome": verdict.outcome,
                "reason": verdict.reason,
                "message": verdict.message,
            }
        except Exception as exc:
            answer = {"outcome": "harness_error", "reason": None, "message": repr(exc)}
        sys.__stdout__.write(json.dumps(answer) + "\n")  # type: ignore[union-attr]
        sys.__stdout__.flush()  # type: ignore[union-attr]
    return 0


def main(argv: list[str]) -> int:
    sources, why = ensure_sources()
    if sources is None:
        print(f"vLLM {VLLM_VERSION} sources unavailable: {why}", file=sys.stderr)
        return 3
    if argv[:1] == ["fetch"]:
        print(sources)
        return 0
    load(sources)
    if argv[:1] == ["worker"]:
        return _worker()
    if argv[:1] == ["kimictl"]:
        from kimictl.cli import main as kimictl_main

        sys.argv = ["kimictl", *argv[1:]]
        return int(kimictl_main() or 0)
    print("usage: vllm_src.py fetch | worker | kimictl ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
