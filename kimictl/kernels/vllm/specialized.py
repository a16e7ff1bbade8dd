"""Prebuilt specialized-decode CuTe units for vLLM 0.33.0 on SM100/SM103: build, then load.

Families (plan.py): the o-projection producer / consumer / fused kernels
(`oproj/prepared.py::compile_oproj`) and the AttnRes consumers
(`attn_res/prepared.py::compile_consumer`). Their keys do not depend on anything vLLM sizes at
start-up, so `kimictl kernels install --vllm PROFILE --arch sm_103a` can build them ahead of time.
Kept on vLLM's JIT (listed in `JIT_FAMILIES` with the reason): the KDA and MLA cores (their
compiled layouts hold the KV cache shape, whose block count vLLM sizes from free GPU memory at
start), the split-K input projection (no host object exports), and the families plan.py
does not derive (MoE, ...).

Build: vLLM's own compile body (`compile_oproj.__wrapped__`, `compile_consumer.__wrapped__`) with
the arguments vLLM's Prepared* classes pass, once per distinct effective key; the result is
exported to one host object (`export_to_c`, or `dump_to_object` where the DSL's C header generator
refuses the signature: every unit of these families today), under the versioned cache folder of
cache.py, with a manifest entry per vLLM key.

Load (the vLLM plugin): both compile functions are `functools.cache`'d on their arguments and
looked up as module globals by the Prepared* classes at call time. The plugin replaces each with
a cached wrapper: a key in the manifest loads its object (`cute.runtime.load_module`) instead of
compiling; a miss, another arch, an object that changed since the build, or a load error calls
vLLM's original compile, with one log line. Loading on Blackwell has never been run here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimictl.core.outputs import atomic_write
from kimictl.kernels.vllm.cache import MANIFEST
from kimictl.kernels.vllm.plan import CompileUnit

__all__ = [
    "BASE",
    "COMPILERS",
    "FAMILIES",
    "JIT_FAMILIES",
    "WrapReport",
    "build_specialized",
    "compile_modules",
    "export_object",
    "install_wrappers",
    "vllm_args",
    "wrap_compile",
    "bare_parents",
]

BASE = "vllm.models.kimi_k3.nvidia.specialized_decode.cutedsl"
# group -> (vLLM module, its @cache'd compile function)
COMPILERS: dict[str, tuple[str, str]] = {
    "oproj": (f"{BASE}.oproj.prepared", "compile_oproj"),
    "attn_res": (f"{BASE}.attn_res.prepared", "compile_consumer"),
}
# plan.py family -> group
FAMILIES: dict[str, str] = {
    "oproj.producer": "oproj",
    "oproj.consumer": "oproj",
    "oproj.fused": "oproj",
    "attn_res": "attn_res",
}
JIT_FAMILIES: dict[str, str] = {
    "kda_core": "its key holds the KV cache shape (block count sized by vLLM at start)",
    "mla_core": "its key holds the KV cache shape (block count sized by vLLM at start)",
    "mla_dcp_value": "not built (no DCP profile tried)",
    "splitk_projection": "no host object exports (device fat binary only)",
    "skinny_projection": "not wrapped yet (SkinnyProjection's own compile cache)",
    "not derived": "MoE, dense MLP, embedding, prefetch, low-latency GEMM warmups",
}
EXPORT = "object (cute.runtime.load_module(path), function by symbol)"
log = logging.getLogger("vllm.kimictl")


def vllm_args(family: str, key: Iterable[Any], arch: str) -> tuple[Any, ...]:
    """The compile function's arguments for a plan key: compile_oproj's key is its argument
    list; compile_consumer's key leaves out the arch (nb, delta, write, final, slots, cap, aux)."""
    k = tuple(key)
    if FAMILIES[family] == "attn_res":
        return (*k[:6], arch, k[6])
    return k


def _split(group: str, values: list[Any]) -> tuple[list[Any], str | None]:
    """(manifest key, arch argument or None) of one call's bound arguments."""
    if group == "attn_res":
        return [*values[:6], values[7]], values[6]
    return values, None


def _key_text(key: Iterable[Any]) -> str:
    return json.dumps(list(key))  # tuples and lists alike; bools stay bools


# ---------------------------------------------------------------- build


def _torch_standin() -> None:
    """A stand-in `torch` holding the dtypes vLLM's compile bodies hash and compare, and the
    modules they import by name, for a build machine without torch. Adds to an earlier
    stand-in (prebuilt.py's), never to a real torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        from kimictl.kernels.vllm.prebuilt import torch_standin

        torch = torch_standin()
    if not getattr(torch, "__kimictl_standin__", False):
        return
    for name in ("float32", "int32", "int64", "uint8", "uint32"):
        if not hasattr(torch, name):
            setattr(torch, name, torch.dtype(name))
    for sub in ("distributed", "distributed._symmetric_memory"):
        full = f"torch.{sub}"
        if full not in sys.modules:
            sys.modules[full] = types.ModuleType(full)
    torch.distributed = sys.modules["torch.distributed"]  # type: ignore[attr-defined]
    torch.distributed._symmetric_memory = sys.modules["torch.distributed._symmetric_memory"]  # type: ignore[attr-defined]


def bare_parents(root: Path, dotted: str) -> None:
    """Register the packages above `dotted` from the sources at `root` without running their
    __init__ (vllm's imports torch and its whole runtime)."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root.joinpath(*parts[:i]))]
            sys.modules[name] = pkg


def compile_modules(sources: Path | None = None) -> dict[str, Any]:
    """group -> vLLM's module holding the compile function. `sources`: an unpacked vLLM wheel
    to import them from when vLLM is not importable (a build machine without torch)."""
    if sources is not None:
        path = sources / (COMPILERS["oproj"][0].replace(".", "/") + ".py")
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: not an unpacked vLLM 0.33 wheel")
        try:  # tvm_ffi probes torch at import: import it before any stand-in exists
            importlib.import_module("tvm_ffi")
        except ImportError:
            pass
        if importlib.util.find_spec("torch") is None or "torch" in sys.modules:
            _torch_standin()
        primitives = "vllm.models.kimi_k3.nvidia.ops.cute_dsl.latent_moe_tail.primitives"
        for name in (*(m for m, _ in COMPILERS.values()), primitives):
            bare_parents(sources, name)
    return {group: importlib.import_module(mod) for group, (mod, _) in COMPILERS.items()}


def export_object(compiled: Any, folder: Path, symbol: str) -> tuple[Path, str]:
    """Write `compiled`'s host object (the cubin inside) as `folder/symbol.o`; how it exported.
    The DSL's C header generator refuses some signatures (unannotated varargs): then the object
    alone, which `cute.runtime.load_module` reads the same way."""
    path = folder / f"{symbol}.o"
    try:
        compiled.export_to_c(str(folder), symbol, function_prefix=symbol)
        return path, "export_to_c"
    except Exception:
        path.write_bytes(compiled.dump_to_object(symbol))
        return path, "dump_to_object"


@dataclass
class BuildReport:
    folder: Path
    units: int  # vLLM keys covered
    distinct: int  # objects built (one per effective key)
    seconds: float
    bytes: int
    families: dict[str, dict[str, int]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def _embedded_sm(path: Path) -> int | None:
    from kimictl.kernels.toolchain.build import embedded_sm

    return embedded_sm(path)


def build_specialized(
    units: Iterable[CompileUnit],
    folder: Path,
    *,
    modules: Mapping[str, Any],
    arch: str,
    stack: Mapping[str, str],
    progress: Callable[[int, int, str], None] | None = None,
    compiled_hook: Callable[[CompileUnit, Any], None] | None = None,
) -> BuildReport:
    """Compile and export the units of FAMILIES in `units` with vLLM's compile bodies (`modules`:
    compile_modules()) into `folder`, one object per distinct (family, effective key), and write
    the manifest (`stack`: its cutlass_dsl, vllm and deployment). A unit that fails is recorded
    (vLLM then compiles it) and the rest go on."""
    folder.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, Any], list[CompileUnit]] = {}
    for unit in units:
        if unit.family in FAMILIES:
            groups.setdefault((unit.family, unit.effective), []).append(unit)
    entries: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    families: dict[str, dict[str, int]] = {}
    t_all = time.perf_counter()
    for i, ((family, effective), members) in enumerate(groups.items()):
        first = members[0]
        symbol = f"{family.replace('.', '_')}_{i:03d}"
        if progress:
            progress(i, len(groups), f"{family} {list(first.key)}")
        module, name = modules[FAMILIES[family]], COMPILERS[FAMILIES[family]][1]
        body = getattr(module, name)
        body = getattr(body, "__wrapped__", body)  # vLLM's body, not its functools cache
        t0 = time.perf_counter()
        try:
            compiled = body(*vllm_args(family, first.key, arch))
            if compiled_hook is not None:
                compiled_hook(first, compiled)
            path, how = export_object(compiled, folder, symbol)
            sm = _embedded_sm(path)
            if sm != int(arch[3:-1]):
                raise RuntimeError(f"the object holds a cubin for sm_{sm}, not {arch}")
        except Exception as exc:  # one bad unit must not lose the others
            failed[symbol] = f"{family} {list(first.key)}: {type(exc).__name__}: {_text(exc)}"
            (folder / f"{symbol}.o").unlink(missing_ok=True)
            continue
        seconds = time.perf_counter() - t0
        data = path.read_bytes()
        fam = families.setdefault(family, {"units": 0, "objects": 0, "bytes": 0})
        fam["objects"] += 1
        fam["bytes"] += len(data)
        for unit in members:
            fam["units"] += 1
            entries.append(
                {
                    "family": family,
                    "key": list(unit.key),
                    "effective": list(effective),
                    "object": path.name,
                    "symbol": symbol,
                    "export": how,
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest()[:16],
                    "seconds": round(seconds, 3) if unit is first else 0.0,
                }
            )
    total = time.perf_counter() - t_all
    manifest = {
        **stack,
        "arch": arch,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "compile_body": {g: f"{m}.{f}" for g, (m, f) in COMPILERS.items()},
        "export": EXPORT,
        "jit_families": JIT_FAMILIES,
        "units": entries,
        "failed": failed,
        "seconds": round(total, 2),
    }
    atomic_write(folder / MANIFEST, json.dumps(manifest, indent=1))
    size = sum((folder / o).stat().st_size for o in {e["object"] for e in entries})
    built = len(groups) - len(failed)
    return BuildReport(folder, len(entries), built, total, size, families, failed)


def _text(exc: BaseException) -> str:
    """The DSL's message without colour codes, one line."""
    import re

    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split())[:300]


# ---------------------------------------------------------------- load


@dataclass
class WrapReport:
    wrapped: list[str] = field(default_factory=list)  # compile functions wrapped
    cached_units: int = 0  # manifest entries of FAMILIES
    skipped: str = ""  # why nothing was wrapped

    def line(self) -> str:
        if self.skipped:
            return f"kimictl prebuilt kernels: specialized decode units not loaded ({self.skipped})"
        return (
            f"kimictl prebuilt kernels: {self.cached_units} specialized decode units "
            f"(o-proj, AttnRes) load from the cache through {', '.join(self.wrapped)}; vLLM "
            "compiles any other (KDA/MLA cores, split-K, MoE stay JIT)"
        )


def _object_loader() -> Callable[[Path, str], Any]:
    import cutlass.cute as cute

    modules: dict[Path, Any] = {}

    def load(path: Path, symbol: str) -> Any:
        if path not in modules:
            modules[path] = cute.runtime.load_module(str(path))
        return getattr(modules[path], symbol)

    return load


def wrap_compile(
    module: Any,
    group: str,
    entries: Iterable[Mapping[str, Any]],
    folder: Path,
    *,
    arch: str,
    load: Callable[[Path, str], Any],
) -> bool:
    """Replace `module`'s compile function of `group` by a functools-cached wrapper that loads
    the manifest's object for a key it holds and calls vLLM's original otherwise. False when it
    was already wrapped."""
    name = COMPILERS[group][1]
    original = getattr(module, name)
    if getattr(original, "__kimictl_wrapped__", False):
        return False
    signature = inspect.signature(original)
    table = {_key_text(e["key"]): e for e in entries}

    def fallback(values: list[Any], why: str, args: Any, kwargs: Any) -> Any:
        log.info("kimictl prebuilt kernels: %s%s %s; vLLM compiles it", name, tuple(values), why)
        return original(*args, **kwargs)

    @functools.cache
    def compile_fn(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = list(bound.arguments.values())
        key, wanted = _split(group, values)
        entry = table.get(_key_text(key))
        if entry is None:
            return fallback(values, "is not in the prebuilt cache", args, kwargs)
        if wanted is not None and wanted != arch:
            return fallback(values, f"asks for {wanted} (cache: {arch})", args, kwargs)
        path = folder / entry["object"]
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            if digest != entry.get("sha256"):
                raise ValueError(f"{path.name} changed since the build")
            return load(path, entry["symbol"])
        except Exception as exc:
            return fallback(values, f"did not load ({type(exc).__name__}: {exc})", args, kwargs)

    compile_fn.__wrapped__ = original  # type: ignore[attr-defined]
    compile_fn.__kimictl_wrapped__ = True  # type: ignore[attr-defined]
    setattr(module, name, compile_fn)
    return True


def install_wrappers(
    manifest: Mapping[str, Any],
    folder: Path,
    *,
    modules: Mapping[str, Any] | None = None,
    loader: Callable[[Path, str], Any] | None = None,
) -> WrapReport:
    """Wrap vLLM's compile functions for the FAMILIES units of an accepted `manifest` (its
    stack already checked against this process). `modules`: group -> vLLM module (default:
    imported here, only when the manifest has units of that group)."""
    report = WrapReport()
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for e in manifest.get("units", []):
        if e.get("family") in FAMILIES:
            by_group.setdefault(FAMILIES[e["family"]], []).append(e)
    report.cached_units = sum(len(v) for v in by_group.values())
    if not by_group:
        report.skipped = "none in the cache"
        return report
    try:
        load = loader or _object_loader()
        found = dict(modules) if modules is not None else {}
        for group in by_group:
            if group not in found:
                found[group] = importlib.import_module(COMPILERS[group][0])
    except Exception as exc:  # not an SM100/SM103 vLLM build, or no DSL runtime here
        report.skipped = f"{type(exc).__name__}: {exc}"
        return report
    arch = str(manifest.get("arch"))
    for group, entries in by_group.items():
        if wrap_compile(found[group], group, entries, folder, arch=arch, load=load):
            report.wrapped.append(COMPILERS[group][1])
    return report
