"""Prebuilt CuTe DSL units for vLLM 0.33.0's ShapeDynamicSkinnyGemm: build ahead of time, inject.

Build (`kimictl kernels install --vllm PROFILE`): each unit of skinny.py is compiled by
vLLM's OWN compile body (`ShapeDynamicSkinnyGemm._compile` of the vLLM module given: its fake
tensors, kernel class and `cute.compile` options, recorded into the manifest as seen), with two
seams overridden for a machine without a GPU: the stream is a fake CUstream, and PDL is on for
arches >= SM90 (vLLM's `is_arch_support_pdl()`: capability major >= 9). The TVM-FFI function
vLLM would have stored is exported with `export_to_c` into one object per distinct effective key,
under cache.py's versioned folder, with a manifest.

Load (the vLLM plugin, before warmup): each unit's object is loaded back
(`cute.runtime.load_module(..., enable_tvm_ffi=True)`: the same callable type vLLM stores) into the
singleton's `_compiled` dict under vLLM's own key, and the instance's `_compile` is wrapped so that
vLLM's warmup (which calls every requested unit's compile unconditionally,
model_executor/warmup/cutedsl_warmup.py) skips the injected keys. Anything else runs vLLM's JIT:
no cache, a manifest for another stack, a unit not in the cache, an object that fails to load.

On SM100/SM103 the same command and plugin step handle the specialized decode's o-proj and
AttnRes units instead (specialized.py); the cache folder and manifest stack fields are shared.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimictl.core.outputs import atomic_write, read_json_object
from kimictl.deployment.spec import PREBUILT_ENV_VAR
from kimictl.kernels.vllm.cache import MANIFEST
from kimictl.kernels.vllm.skinny import SkinnyUnit

__all__ = [
    "PREBUILT_ENV",
    "SKINNY_MODULE",
    "LoadReport",
    "build_skinny",
    "inject_prebuilt",
    "load_prebuilt",
    "skinny_from_sources",
    "install_vllm_units",
    "torch_standin",
]

PREBUILT_ENV = PREBUILT_ENV_VAR  # a deployment folder written by `kernels install --vllm`
SKINNY_MODULE = "vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm"
FAMILY = "skinny_gemm"
log = logging.getLogger("vllm.kimictl")


# ---------------------------------------------------------------- build


def torch_standin() -> types.ModuleType:
    """A stand-in `torch` (registered in sys.modules) holding the dtypes vLLM's compile bodies
    compare, for a build machine without torch; marked `__kimictl_standin__`."""

    torch = types.ModuleType("torch")

    class dtype:  # torch's name
        def __init__(self, name: str) -> None:
            self.name = name

        def __repr__(self) -> str:
            return f"torch.{self.name}"

    torch.dtype = dtype  # type: ignore[attr-defined]
    torch.bfloat16, torch.float16 = dtype("bfloat16"), dtype("float16")  # type: ignore[attr-defined]
    torch.Tensor = object  # type: ignore[attr-defined]
    torch.__kimictl_standin__ = True  # type: ignore[attr-defined]
    sys.modules["torch"] = torch
    return torch


def skinny_from_sources(root: Path) -> types.ModuleType:
    """vLLM's skinny_gemm.py (and _skinny_gemm.py) from an unpacked vLLM wheel at `root`, for a
    build machine without vLLM or torch: torch is then a stand-in holding the two dtypes the
    compile body compares, and quack's `compile_utils.py` is loaded without quack's package
    __init__ (which needs torch). The compile body itself is vLLM's, unchanged."""
    import importlib.util

    path = root / (SKINNY_MODULE.replace(".", "/") + ".py")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not an unpacked vLLM 0.33 wheel")
    try:  # tvm_ffi probes torch at import: import it before any stand-in exists
        importlib.import_module("tvm_ffi")
    except ImportError:
        pass
    if importlib.util.find_spec("torch") is None and "torch" not in sys.modules:
        torch_standin()
    if "quack.compile_utils" not in sys.modules:
        spec = importlib.util.find_spec("quack")
        if spec is not None and spec.submodule_search_locations:
            quack = types.ModuleType("quack")
            quack.__path__ = list(spec.submodule_search_locations)
            sys.modules.setdefault("quack", quack)
    from kimictl.kernels.vllm.specialized import bare_parents

    bare_parents(root, SKINNY_MODULE)
    spec = importlib.util.spec_from_file_location(SKINNY_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[SKINNY_MODULE] = module
    spec.loader.exec_module(module)
    return module


def _aot_class(module: Any, arch: str) -> Any:
    import cutlass.cute as cute

    pdl = int(arch[3:5]) >= 9  # sm_90a, sm_100a, sm_103a: vLLM's is_arch_support_pdl()

    class AotSkinnyGemm(module.ShapeDynamicSkinnyGemm):  # type: ignore[misc,name-defined]
        @staticmethod
        def _stream() -> Any:
            return cute.runtime.make_fake_stream()

        @staticmethod
        def _use_pdl() -> bool:
            return pdl

    return AotSkinnyGemm


@dataclass
class BuildReport:
    folder: Path
    units: int  # vLLM keys covered
    distinct: int  # objects compiled (one per effective key)
    seconds: float
    bytes: int
    failed: dict[str, str] = field(default_factory=dict)


def build_skinny(
    units: Iterable[SkinnyUnit],
    folder: Path,
    *,
    module: Any,
    arch: str,
    stack: Mapping[str, str],
    progress: Callable[[int, int, str], None] | None = None,
) -> BuildReport:
    """Compile and export `units` with vLLM's compile body into `folder`; `stack` holds the
    manifest's cutlass_dsl, vllm, arch and deployment fields. A unit that fails to build is
    recorded (vLLM then JIT-compiles it) and the rest go on."""
    from kimictl.kernels.toolchain.build import embedded_sm

    os.environ["CUTE_DSL_ARCH"] = arch
    import cutlass.cute as cute

    folder.mkdir(parents=True, exist_ok=True)
    obj = _aot_class(module, arch)()
    dtype = sys.modules["torch"].bfloat16
    groups: dict[tuple[object, ...], list[SkinnyUnit]] = {}
    for unit in units:
        groups.setdefault(unit.effective, []).append(unit)
    seen_options: list[str] = []
    real_compile = cute.compile

    def recording_compile(*args: Any, **kwargs: Any) -> Any:
        seen_options.append(str(kwargs.get("options", "")))
        return real_compile(*args, **kwargs)

    entries: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    t_all = time.perf_counter()
    cute.compile = recording_compile  # type: ignore[assignment]
    try:
        for i, (effective, members) in enumerate(groups.items()):
            first = members[0]
            if progress:
                progress(i, len(groups), first.name)
            config = module.SkinnyGemmConfig(*first.config)
            path = folder / f"{first.name}.o"
            t0 = time.perf_counter()
            try:
                obj._compile(dtype, config, first.has_residual)
                compiled = obj._compiled.pop((dtype, config, first.has_residual))
                compiled.export_to_c(str(path), first.name)
                sm = embedded_sm(path)
                if sm != int(arch[3:-1]):
                    raise RuntimeError(f"the object holds a cubin for sm_{sm}, not {arch}")
            except Exception as exc:  # one bad unit must not lose the others
                failed[first.name] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
                path.unlink(missing_ok=True)
                continue
            seconds = time.perf_counter() - t0
            data = path.read_bytes()
            for unit in members:
                entries.append(
                    {
                        "family": FAMILY,
                        "name": unit.name,
                        "key": list(unit.key),
                        "effective": list(effective),
                        "object": path.name,
                        "symbol": first.name,
                        "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()[:16],
                        "seconds": round(seconds, 3) if unit is first else 0.0,
                    }
                )
    finally:
        cute.compile = real_compile
    total = time.perf_counter() - t_all
    manifest = {
        **stack,
        "arch": arch,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "compile_body": f"{SKINNY_MODULE}.ShapeDynamicSkinnyGemm._compile",
        "compile_options": sorted(set(seen_options)),
        "export": "tvm-ffi object (cute.runtime.load_module(path, enable_tvm_ffi=True))",
        "units": entries,
        "failed": failed,
        "seconds": round(total, 2),
    }
    atomic_write(folder / MANIFEST, json.dumps(manifest, indent=1))
    size = sum((folder / o).stat().st_size for o in {e["object"] for e in entries})
    return BuildReport(folder, len(entries), len(groups) - len(failed), total, size, failed)


# ---------------------------------------------------------------- load


@dataclass
class LoadReport:
    injected: int = 0
    cached_units: int = 0
    missing: list[str] = field(default_factory=list)  # in the manifest, object file absent
    failed: list[str] = field(default_factory=list)  # object present, load raised
    skipped: str = ""  # why nothing was injected
    specialized: Any = None  # specialized.WrapReport when the manifest was accepted

    def line(self) -> str:
        if self.skipped:
            return f"kimictl prebuilt kernels: none loaded ({self.skipped}); vLLM compiles them"
        text = (
            f"kimictl prebuilt kernels: {self.injected} of {self.cached_units} skinny GEMM units "
            "loaded; vLLM compiles any other"
        )
        if self.missing or self.failed:
            text += f" ({len(self.missing)} missing, {len(self.failed)} failed to load)"
        return text


def _default_loader() -> Callable[[Path, str], Any]:
    import cutlass.cute as cute

    modules: dict[Path, Any] = {}

    def load(path: Path, symbol: str) -> Any:
        if path not in modules:
            modules[path] = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
        return getattr(modules[path], symbol)

    return load


def stack_problem(manifest: Mapping[str, Any], installed: Mapping[str, str | None]) -> str:
    """Why a manifest does not fit this process's stack ("" when it does)."""
    wrong = [
        f"{k} {manifest.get(k)!r} (this process: {v!r})"
        for k, v in installed.items()
        if manifest.get(k) != v
    ]
    return "cache built for another stack: " + ", ".join(wrong) if wrong else ""


def inject_prebuilt(
    skinny: Any,
    folder: Path | None,
    *,
    dtype: Any,
    config_cls: Any,
    installed: Mapping[str, str | None],
    loader: Callable[[Path, str], Any] | None = None,
) -> LoadReport:
    """Put the cached units of `folder` into `skinny._compiled` under vLLM's keys and make its
    `_compile` skip them. `installed`: the cutlass_dsl, vllm and arch of this process; a manifest
    naming others is not used."""
    report = LoadReport()
    if folder is None:
        report.skipped = f"{PREBUILT_ENV} not set"
        return report
    manifest = read_json_object(folder / MANIFEST)
    if manifest is None:
        report.skipped = f"no readable {MANIFEST} in {folder}"
        return report
    wrong = stack_problem(manifest, installed)
    if wrong:
        report.skipped = wrong
        return report
    units = [u for u in manifest.get("units", []) if u.get("family") == FAMILY]
    report.cached_units = len(units)
    try:
        load = loader or _default_loader()
    except Exception as exc:  # no DSL runtime in this process
        report.skipped = f"cannot load objects here ({type(exc).__name__}: {exc})"
        return report
    injected: set[Any] = set()
    for unit in units:
        _, *config, has_residual = unit["key"]
        key = (dtype, config_cls(*config), bool(has_residual))
        path = folder / unit["object"]
        if not path.is_file():
            report.missing.append(unit["name"])
            continue
        try:
            fn = load(path, unit["symbol"])
        except Exception as exc:
            report.failed.append(unit["name"])
            log.debug("kimictl prebuilt kernels: %s failed to load: %s", unit["name"], exc)
            continue
        skinny._compiled[key] = fn
        injected.add(key)
    report.injected = len(injected)
    if injected:
        _skip_injected(skinny, injected)
    return report


def _skip_injected(skinny: Any, keys: set[Any]) -> None:
    """vLLM's warmup calls `_compile` for every requested unit whether compiled or not."""
    original = skinny._compile

    def _compile(dtype: Any, config: Any, has_residual: bool) -> None:
        key = (dtype, config, has_residual)
        if key in keys and key in skinny._compiled:
            return
        original(dtype, config, has_residual)

    _compile.__wrapped__ = original  # type: ignore[attr-defined]
    skinny._compile = _compile


def _installed_stack() -> dict[str, str | None]:
    """This process's cutlass-dsl, vLLM and GPU arch. The arch comes from vLLM's platform (NVML on
    CUDA): the plugin runs in vLLM's API-server process too, where initializing CUDA would force
    vLLM's workers to spawn."""
    from importlib.metadata import PackageNotFoundError, version

    from kimictl.kernels.toolchain.harness import arch_of

    def ver(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    arch = None
    try:
        from vllm.platforms import current_platform

        cap = current_platform.get_device_capability()
        arch = arch_of((cap.major, cap.minor)) if cap is not None else None
    except Exception:  # no GPU visible: the arch check below refuses the cache
        arch = None
    return {"cutlass_dsl": ver("nvidia-cutlass-dsl"), "vllm": ver("vllm"), "arch": arch}


def load_prebuilt(
    env: Mapping[str, str] | None = None,
    *,
    installed: Mapping[str, str | None] | None = None,
    loader: Callable[[Path, str], Any] | None = None,
) -> LoadReport | None:
    """The plugin's step: inject the cache named by KIMICTL_VLLM_PREBUILT into vLLM's skinny GEMM
    singleton; None when the variable is unset. Never raises: vLLM's JIT is the fall-back."""
    value = (os.environ if env is None else env).get(PREBUILT_ENV, "").strip()
    if not value:
        return None
    try:
        module = importlib.import_module(SKINNY_MODULE)
        import torch

        report = inject_prebuilt(
            module.shape_dynamic_skinny_gemm,
            Path(value),
            dtype=torch.bfloat16,
            config_cls=module.SkinnyGemmConfig,
            installed=_installed_stack() if installed is None else installed,
            loader=loader,
        )
    except Exception as exc:  # a broken cache or module must not take the server down
        report = LoadReport(skipped=f"{type(exc).__name__}: {exc}")
    if report.skipped or report.cached_units:
        log.info("%s", report.line())
    if not report.skipped.startswith(("cache built for another stack", "no readable")):
        report.specialized = _load_specialized(Path(value), installed, loader)
    return report


def _load_specialized(
    folder: Path,
    installed: Mapping[str, str | None] | None,
    loader: Callable[[Path, str], Any] | None,
) -> Any:
    """The specialized decode families (specialized.py) of an accepted cache: wrap vLLM's
    compile functions. Never raises."""
    from kimictl.kernels.vllm.specialized import WrapReport, install_wrappers

    try:
        manifest = read_json_object(folder / MANIFEST)
        if manifest is None:
            return None
        wrong = stack_problem(manifest, _installed_stack() if installed is None else installed)
        if wrong:
            report = WrapReport(skipped=wrong)
        else:
            report = install_wrappers(manifest, folder, loader=loader)
            if report.skipped == "none in the cache":
                return report
    except Exception as exc:  # vLLM's JIT is the fall-back
        report = WrapReport(skipped=f"{type(exc).__name__}: {exc}")
    log.info("%s", report.line())
    return report


# ---------------------------------------------------------------- install


def _sources_version(root: Path) -> str | None:
    """__version__ of an unpacked vLLM wheel (its vllm/_version.py), read without importing."""
    import re

    path = root / "vllm" / "_version.py"
    if not path.is_file():
        return None
    found = re.search(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)""", path.read_text())
    return found.group(1) if found else None


def install_vllm_units(
    spec: Any,
    arch: str,
    *,
    sources: Path | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    """`kimictl kernels install --vllm`: prebuild `spec`'s units for `arch` into the versioned
    cache doctor looks in: the skinny GEMM units on sm_90a, the specialized decode units whose
    keys vLLM does not size at start (specialized.py) on SM100/SM103. `sources`: an
    unpacked vLLM wheel to take the compile bodies from when vLLM itself is not importable (a
    build machine without torch)."""
    from importlib.metadata import PackageNotFoundError, version

    from kimictl.core.errors import InputError, Unsupported
    from kimictl.kernels.toolchain.build import dsl_version
    from kimictl.kernels.vllm.cache import deployment_hash, find_cache
    from kimictl.kernels.vllm.plan import plan_units
    from kimictl.kernels.vllm.skinny import skinny_units
    from kimictl.kernels.vllm.specialized import FAMILIES, JIT_FAMILIES, compile_modules

    units = skinny_units(arch, spec.tensor_parallel_size)
    plan = plan_units(spec, arch=arch)
    specialized = [u for u in plan.units if u.family in FAMILIES]
    if units is None and not specialized:
        raise Unsupported(
            f"no vLLM 0.33 unit of this profile is prebuilt for {arch} (skinny GEMM units are "
            "derived for sm_90a, the specialized decode units for latency_specialized profiles)",
            hint="vLLM keeps compiling them at start-up",
        )
    dsl = dsl_version()
    if dsl is None:
        raise Unsupported(
            "nvidia-cutlass-dsl is not installed", hint="kimictl kernels install --stack"
        )
    if sources is not None and not sources.is_dir():
        raise InputError(f"--vllm-src {sources}: no such folder")
    os.environ["CUTE_DSL_ARCH"] = arch  # before the DSL is imported: no GPU to ask
    module: Any = None
    try:
        if units is not None:
            module = (
                skinny_from_sources(sources)
                if sources is not None
                else importlib.import_module(SKINNY_MODULE)
            )
        else:
            module = compile_modules(sources)
        vllm = _sources_version(sources) if sources is not None else version("vllm")
    except (ImportError, PackageNotFoundError) as exc:
        raise Unsupported(
            f"vLLM is not importable here ({exc})",
            hint="run it in vLLM's environment, or pass --vllm-src with an unpacked wheel",
        ) from exc
    if vllm is None:
        raise InputError("cannot tell the vLLM version of the sources (no vllm/_version.py)")
    folder = find_cache(plan, dsl=dsl, vllm=vllm, arch=arch).folder
    stack = {"cutlass_dsl": dsl, "vllm": vllm, "deployment": deployment_hash(plan)}
    result: dict[str, Any] = {"arch": arch, "cutlass_dsl": dsl, "vllm": vllm}
    if units is not None:
        report = build_skinny(
            units, folder, module=module, arch=arch, stack=stack, progress=progress
        )
        result["families"] = {FAMILY: {"units": report.units, "objects": report.distinct}}
        result["jit"] = {}
        result["loading"] = "run on the H200 (sm_90a)"
    else:
        from kimictl.kernels.vllm.specialized import build_specialized

        built = build_specialized(
            specialized, folder, modules=module, arch=arch, stack=stack, progress=progress
        )
        report = BuildReport(
            built.folder, built.units, built.distinct, built.seconds, built.bytes, built.failed
        )
        result["families"] = built.families
        left = sorted({u.family for u in plan.units} - set(FAMILIES))
        result["jit"] = {f: JIT_FAMILIES.get(f, "not prebuilt") for f in left}
        result["jit"]["not derived"] = JIT_FAMILIES["not derived"]
        result["loading"] = f"never run on {arch} here (no such GPU lent): built and exported only"
    result.update(
        folder=str(report.folder),
        units=report.units,
        compiled=report.distinct,
        failed=report.failed,
        seconds=round(report.seconds, 2),
        bytes=report.bytes,
        env={PREBUILT_ENV: str(report.folder)},
    )
    return result
