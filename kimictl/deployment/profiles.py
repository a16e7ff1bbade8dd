"""Profiles: a DeploymentSpec plus intent, stored as TOML (through tomlkit, so comments and key
order survive every edit kimictl makes).

A profile file has an optional top-level `description` and these sections, each with a fixed set of
keys (anything else is an error naming the file, line and key, and the allowed keys):

    [model]        name (required), served_name, max_model_len, kv_cache_dtype,
                   mamba_cache_dtype, mamba_ssm_cache_dtype, enable_lora, use_replayssm
    [parallel]     tensor_parallel_size, pipeline_parallel_size, data_parallel_size,
                   decode_context_parallel_size, enable_expert_parallel, enable_dbo,
                   distributed_executor_backend
    [speculative]  vLLM's speculative_config keys (method, model, num_speculative_tokens, ...);
                   `extra` = inline table for keys kimictl does not list. No section: no speculation
    [batching]     max_num_seqs, max_num_batched_tokens, gpu_memory_utilization
    [compile]      enforce_eager, optimization_level, mode, cudagraph_mode,
                   cudagraph_capture_sizes, `extra` = inline table of other compilation_config keys
    [serve]        runtime ("gpu" | "cpu"), host, port, stock_twin, enable_sleep_mode,
                   decode_backend, mla_core, kda_decode_backend, kda_spec_decode_backend,
                   kda_prefill_backend, additional_config (inline table), extra_args (list),
                   kimictl_kernels (bool: render KIMICTL_VLLM_KERNELS=1, which enables kimictl's
                   vLLM plugin: the node-measured three-way decode-GEMM dispatch),
                   kimictl_layer (bool: render KIMICTL_VLLM_LAYER=1, which asks the plugin for
                   kimictl's fused dense decode layer; kimictl.kernels.vllm.layer_route says
                   which of vLLM's layers it may serve and logs why not),
                   prebuilt_units ("auto" | "off", default "auto": `kimictl serve` hands vLLM the
                   node's prebuilt CuTe unit cache for this deployment when one matches, as
                   KIMICTL_VLLM_PREBUILT; runtime.serving.prebuilt)
    [env]          VAR = "value" (strings)
    [provenance]   free-form: who or what produced the profile, for which hardware and vLLM version,
                   predicted or measured figures (tools add keys here with update_provenance)

Profiles are found by name in, in order: $KIMICTL_PROFILE_PATH (os.pathsep-separated folders),
<config>/kimictl/profiles (XDG_CONFIG_HOME or ~/.config), and the profiles/ folder shipped with
kimictl.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions

from kimictl.core.errors import InputError
from kimictl.core.resources import package_path
from kimictl.deployment import buckets, traces
from kimictl.deployment.cluster import CLUSTER_KEYS, ClusterSettings, cluster_settings
from kimictl.deployment.spec import (
    DEFAULT_HOST,
    FIELD_CHECKS,
    KERNELS_ENV_VAR,
    LAYER_ENV_VAR,
    PREBUILT_DEFAULT,
    PREBUILT_ENV_VAR,
    DeploymentSpec,
    ValueCheck,
    check_field,
    nonempty_text,
    one_of,
)

__all__ = [
    "PREBUILT_MODES",
    "PROFILE_SECTIONS",
    "Profile",
    "ProfileProblem",
    "diff_profiles",
    "list_profiles",
    "load_profile",
    "profile_dirs",
    "scan_profiles",
    "shipped_profiles_dir",
    "RUNTIMES",
]


RUNTIMES = ("gpu", "cpu")
PREBUILT_MODES = (PREBUILT_DEFAULT, "off")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    spec: DeploymentSpec
    provenance: dict[str, Any] = field(default_factory=dict)
    stock_twin: str | None = None
    runtime: str = "gpu"
    description: str = ""
    prebuilt_units: str = PREBUILT_DEFAULT  # one of PREBUILT_MODES
    cluster: ClusterSettings = field(default_factory=ClusterSettings)  # what a render needs

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "description": self.description,
            "runtime": self.runtime,
            "stock_twin": self.stock_twin,
            "prebuilt_units": self.prebuilt_units,
            "cluster": self.cluster.to_json(),
            "command": self.spec.to_command(),
            "spec": self.spec.to_json(),
            "provenance": self.provenance,
        }


@dataclass(frozen=True)
class ProfileProblem:
    """A profile file that could not be loaded (what `profiles list` shows instead of failing)."""

    name: str
    path: Path
    error: InputError


# ---------------------------------------------------------------- schema


def _speed_range(value: Any) -> list[float]:
    allowed = "two tokens/s/user figures, low then high, e.g. [20, 4000]"
    if (
        not isinstance(value, list)
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value)
        or not 0 < value[0] < value[1] < float("inf")
    ):
        raise ValueError(allowed)
    return [float(value[0]), float(value[1])]


def _table(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("an inline table, e.g. { key = 1 }")
    return dict(value)


def _same(*names: str) -> dict[str, str]:
    return {name: name for name in names}


def _json_keys(json_field: str) -> dict[str, str]:
    prefix = f"{json_field}."
    return {name[len(prefix) :]: name for name in FIELD_CHECKS if name.startswith(prefix)}


# profile key -> DeploymentSpec field (or `<json field>.<key>`), per section. Types and bounds are
# deployment.FIELD_CHECKS: the same checks `vllm serve` command lines go through.
_FIELD_OF: dict[str, dict[str, str]] = {
    "model": {
        "name": "model",
        "served_name": "served_model_name",
        **_same(
            "max_model_len",
            "kv_cache_dtype",
            "mamba_cache_dtype",
            "mamba_ssm_cache_dtype",
            "enable_lora",
            "use_replayssm",
        ),
    },  # fmt: skip
    "parallel": _same(
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "decode_context_parallel_size",
        "enable_expert_parallel",
        "enable_dbo",
        "distributed_executor_backend",
    ),  # fmt: skip
    "speculative": _json_keys("speculative_config"),
    "batching": _same("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"),
    "compile": {**_same("enforce_eager", "optimization_level"), **_json_keys("compilation_config")},
    "serve": {
        **_same("host", "port", "enable_sleep_mode"),
        **_json_keys("additional_config"),
        **_same("extra_args"),
    },
    "metrics": {},  # profile-only keys below: histogram buckets and the traces endpoint
}
# inline tables whose keys land in a JSON config: the keys kimictl knows are checked there too
_JSON_TABLES: dict[tuple[str, str], str] = {
    ("speculative", "extra"): "speculative_config",
    ("compile", "extra"): "compilation_config",
    ("serve", "additional_config"): "additional_config",
}
_PROFILE_ONLY: dict[str, dict[str, ValueCheck]] = {
    "speculative": {"extra": _table},
    "compile": {"extra": _table},
    "serve": {
        "runtime": one_of(*RUNTIMES),
        "stock_twin": nonempty_text,
        "additional_config": _table,
        "kimictl_kernels": FIELD_CHECKS["enable_sleep_mode"],  # a plain switch
        "kimictl_layer": FIELD_CHECKS["enable_sleep_mode"],
        "prebuilt_units": one_of(*PREBUILT_MODES),
    },
    "metrics": {
        "interactivity_range": _speed_range,
        "custom_histogram_buckets": buckets.check_buckets,
        "traces": traces.check_traces,
    },
}


def _section_schema(section: str, fields: dict[str, str]) -> dict[str, ValueCheck]:
    checks = {key: FIELD_CHECKS[name] for key, name in fields.items()}
    return checks | _PROFILE_ONLY.get(section, {})


PROFILE_SECTIONS: dict[str, dict[str, ValueCheck]] = {
    **{section: _section_schema(section, fields) for section, fields in _FIELD_OF.items()},
    "cluster": dict(CLUSTER_KEYS),  # rendered jobs only (`serve --render`)
    "env": {},  # any VAR = "value"
    "provenance": {},  # free-form
}
_TOP_LEVEL = {"description": nonempty_text}
_ADDITIONAL_KEYS = tuple(_json_keys("additional_config"))
_COMPILE_KEYS = tuple(_json_keys("compilation_config"))


# ---------------------------------------------------------------- locating


def shipped_profiles_dir() -> Path:
    """The profiles shipped inside the package (kimictl/profiles; `profiles/` at the top of a
    checkout is a link to it)."""
    return package_path("profiles")


def profile_dirs() -> list[Path]:
    dirs: list[Path] = []
    extra = os.environ.get("KIMICTL_PROFILE_PATH")
    if extra:
        dirs += [Path(p).expanduser() for p in extra.split(os.pathsep) if p]
    config = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    dirs.append(config / "kimictl" / "profiles")
    dirs.append(shipped_profiles_dir())
    return dirs


def _profile_files() -> dict[str, Path]:
    """name -> file; earlier folders shadow later ones."""
    found: dict[str, Path] = {}
    for folder in profile_dirs():
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found.setdefault(path.stem, path)
    return found


def _resolve(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.suffix == ".toml" or os.sep in text or "/" in text:
        if path.is_dir():
            raise InputError(f"Profile file {text} is a folder; name a .toml file.")
        if not path.is_file():
            raise InputError(f"Profile file {text} does not exist.", "kimictl profiles list")
        return path
    files = _profile_files()
    if text in files:
        return files[text]
    known = ", ".join(sorted(files)) or "none"
    raise InputError(
        f"Unknown profile {text!r}; known profiles: {known}.",
        "Run `kimictl profiles list`, or pass a path to a .toml file.",
    )


# ---------------------------------------------------------------- loading


def _line_of(text: str, section: str | None, key: str | None = None) -> int:
    """1-based line of `[section]` (or of `key` inside it; top level when section is None)."""
    current: str | None = None
    header = re.compile(r"^\s*\[\s*([^\]\s]+)\s*\]")
    key_re = re.compile(r"^\s*[\"']?" + re.escape(key) + r"[\"']?\s*=") if key else None
    for number, line in enumerate(text.splitlines(), start=1):
        match = header.match(line)
        if match:
            current = match.group(1)
            if key is None and current == section:
                return number
            continue
        if key_re is not None and current == section and key_re.match(line):
            return number
    return 1


def _parse_document(path: Path) -> tuple[tomlkit.TOMLDocument, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"Cannot read profile {path}: {exc.strerror or exc}.") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not valid TOML (not UTF-8 text at byte {exc.start}).") from exc
    try:
        return tomlkit.parse(text), text
    except tomlkit.exceptions.ParseError as exc:
        reason = (
            str(exc)
            .split(" at line")[0]
            .replace("Unexpected character: '\\x00'", "unexpected end of file")
            .rstrip(".")  # tomlkit >= 0.15.3 reports a key twice here, its sentence ending in "."
        )  # tomlkit reports the end of the text as a NUL character
        raise InputError(f"{path}:{exc.line}: not valid TOML ({reason}).") from exc
    except tomlkit.exceptions.TOMLKitError as exc:  # e.g. a key twice in one table: no line
        raise InputError(f"{path}: not valid TOML ({str(exc).rstrip('.')}).") from exc


def _validate(path: Path, text: str, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Check sections, keys and value types; return {section: {key: converted value}}."""
    clean: dict[str, dict[str, Any]] = {"": {}}
    for name, value in data.items():
        if name in PROFILE_SECTIONS:
            if not isinstance(value, dict):
                line = _line_of(text, None, name)
                raise InputError(f"{path}:{line}: {name} must be a section [{name}].")
            clean[name] = _validate_section(path, text, name, value)
        elif name in _TOP_LEVEL:
            try:
                clean[""][name] = _TOP_LEVEL[name](value)
            except ValueError as exc:
                line = _line_of(text, None, name)
                raise InputError(f"{path}:{line}: {name} must be {exc}.") from exc
        else:
            is_table = isinstance(value, dict)
            line = _line_of(text, name) if is_table else _line_of(text, None, name)
            allowed = ", ".join(f"[{s}]" for s in PROFILE_SECTIONS)
            what = f"section [{name}]" if is_table else f"top-level key {name!r}"
            raise InputError(
                f"{path}:{line}: unknown {what}; allowed sections: {allowed} "
                "(and top-level key description).",
            )
    return clean


def _validate_section(path: Path, text: str, section: str, table: dict[str, Any]) -> dict[str, Any]:
    schema = PROFILE_SECTIONS[section]
    out: dict[str, Any] = {}
    for key, value in table.items():
        line = _line_of(text, section, key)
        if section == "provenance":
            out[key] = value
            continue
        if section == "env":
            if not _ENV_NAME.match(key):
                raise InputError(
                    f"{path}:{line}: [env] {key!r} is not an environment variable name."
                )
            if not isinstance(value, str):
                raise InputError(
                    f'{path}:{line}: [env] {key} must be a string, e.g. {key} = "{value}".',
                )
            out[key] = value
            continue
        validator = schema.get(key)
        if validator is None:
            raise InputError(
                f"{path}:{line}: unknown key {key!r} in [{section}]; allowed keys: "
                f"{', '.join(schema)}.",
            )
        out[key] = _checked(validator, value, f"{path}:{line}: [{section}] {key}")
        json_field = _JSON_TABLES.get((section, key))
        if json_field is not None:  # keys kimictl knows are checked inside inline tables too
            for inner, item in out[key].items():
                check = partial(check_field, f"{json_field}.{inner}")
                out[key][inner] = _checked(check, item, f"{path}:{line}: [{section}] {key}.{inner}")
    return out


def _checked(check: ValueCheck, value: Any, where: str) -> Any:
    try:
        return check(value)
    except ValueError as exc:
        raise InputError(f"{where} = {_show(value)} is not allowed; it must be {exc}.") from exc


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{traces.shown(value)}"'  # a URL's user:password@ is never echoed
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _spec_from_sections(path: Path, text: str, s: dict[str, dict[str, Any]]) -> DeploymentSpec:
    model = s.get("model", {})
    if "name" not in model:
        line = _line_of(text, "model") if "model" in s else 1
        raise InputError(
            f'{path}:{line}: [model] name is required, e.g. name = "moonshotai/Kimi-K3".'
        )
    parallel = s.get("parallel", {})
    batching = s.get("batching", {})
    compile_ = s.get("compile", {})
    serve = s.get("serve", {})
    metrics = s.get("metrics", {})
    histogram_buckets = dict(metrics.get("custom_histogram_buckets", {}))
    if "interactivity_range" in metrics:
        if buckets.FAMILY in histogram_buckets:
            line = _line_of(text, "metrics", "interactivity_range")
            raise InputError(
                f"{path}:{line}: [metrics] sets {buckets.FAMILY} twice (interactivity_range and "
                "custom_histogram_buckets); keep one."
            )
        histogram_buckets[buckets.FAMILY] = buckets.interactivity_buckets(
            *metrics["interactivity_range"]
        )

    speculative: dict[str, Any] | None = None
    if "speculative" in s:
        speculative = {k: v for k, v in s["speculative"].items() if k != "extra"}
        speculative.update(s["speculative"].get("extra", {}))

    compilation = {k: compile_[k] for k in _COMPILE_KEYS if k in compile_}
    compilation.update(compile_.get("extra", {}))

    additional = {k: serve[k] for k in _ADDITIONAL_KEYS if k in serve}
    for key, value in serve.get("additional_config", {}).items():
        if key in additional:
            line = _line_of(text, "serve", "additional_config")
            raise InputError(
                f"{path}:{line}: [serve] additional_config repeats {key!r}; set it once, "
                f"as [serve] {key}.",
            )
        additional[key] = value

    env = dict(s.get("env", {}))
    for key, var in (("kimictl_kernels", KERNELS_ENV_VAR), ("kimictl_layer", LAYER_ENV_VAR)):
        if serve.get(key):
            if env.get(var, "1") != "1":
                line = _line_of(text, "serve", key)
                raise InputError(
                    f"{path}:{line}: [serve] {key} = true but [env] {var} = "
                    f'"{env[var]}"; set one of them.'
                )
            env[var] = "1"
    if serve.get("prebuilt_units") == "off" and PREBUILT_ENV_VAR in env:
        line = _line_of(text, "serve", "prebuilt_units")
        raise InputError(
            f'{path}:{line}: [serve] prebuilt_units = "off" but [env] {PREBUILT_ENV_VAR} names '
            "a cache; set one of them."
        )

    values: dict[str, Any] = {
        "model": model["name"],
        "served_model_name": model.get("served_name"),
        "max_model_len": model.get("max_model_len"),
        "kv_cache_dtype": model.get("kv_cache_dtype", "auto"),
        "mamba_cache_dtype": model.get("mamba_cache_dtype", "auto"),
        "mamba_ssm_cache_dtype": model.get("mamba_ssm_cache_dtype", "auto"),
        "enable_lora": model.get("enable_lora", False),
        "use_replayssm": model.get("use_replayssm", False),
        "tensor_parallel_size": parallel.get("tensor_parallel_size", 1),
        "pipeline_parallel_size": parallel.get("pipeline_parallel_size", 1),
        "data_parallel_size": parallel.get("data_parallel_size", 1),
        "decode_context_parallel_size": parallel.get("decode_context_parallel_size", 1),
        "enable_expert_parallel": parallel.get("enable_expert_parallel", False),
        "enable_dbo": parallel.get("enable_dbo", False),
        "distributed_executor_backend": parallel.get("distributed_executor_backend"),
        "max_num_seqs": batching.get("max_num_seqs"),
        "max_num_batched_tokens": batching.get("max_num_batched_tokens"),
        "gpu_memory_utilization": batching.get("gpu_memory_utilization"),
        "speculative_config": speculative,
        "compilation_config": compilation,
        "optimization_level": compile_.get("optimization_level"),
        "enforce_eager": compile_.get("enforce_eager", False),
        "additional_config": additional,
        "enable_sleep_mode": serve.get("enable_sleep_mode", False),
        "host": serve.get("host", DEFAULT_HOST),
        "port": serve.get("port"),
        "env": env,
        "extra_args": serve.get("extra_args", []),
        "otlp_traces_endpoint": traces.resolve_traces(metrics.get("traces")),
        "custom_histogram_buckets": histogram_buckets or None,
    }
    return DeploymentSpec(**values)


def _load_path(path: Path) -> Profile:
    document, text = _parse_document(path)
    sections = _validate(path, text, document.unwrap())
    spec = _spec_from_sections(path, text, sections)
    serve = sections.get("serve", {})
    try:
        cluster = cluster_settings(sections.get("cluster", {}))
    except ValueError as exc:
        line = _line_of(text, "cluster")
        raise InputError(f"{path}:{line}: [cluster] needs {exc}.") from exc
    return Profile(
        name=path.stem,
        path=path,
        spec=spec,
        provenance=dict(sections.get("provenance", {})),
        stock_twin=serve.get("stock_twin"),
        runtime=serve.get("runtime", "gpu"),
        prebuilt_units=serve.get("prebuilt_units", PREBUILT_DEFAULT),
        description=sections[""].get("description", ""),
        cluster=cluster,
    )


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped/user profile by name, or a .toml file by path. Bad input raises InputError."""
    return _load_path(_resolve(name_or_path))


def scan_profiles() -> tuple[list[Profile], list[ProfileProblem]]:
    """Every profile found (first folder wins for a name), and the ones that failed to load."""
    good: list[Profile] = []
    bad: list[ProfileProblem] = []
    for name, path in sorted(_profile_files().items()):
        try:
            good.append(_load_path(path))
        except InputError as error:
            bad.append(ProfileProblem(name=name, path=path, error=error))
    return good, bad


def list_profiles() -> list[Profile]:
    """The profiles that load (see scan_profiles for the broken ones)."""
    return scan_profiles()[0]


# ---------------------------------------------------------------- diff


def diff_profiles(a: Profile, b: Profile) -> list[tuple[str, Any, Any]]:
    """(field, value in a, value in b) for every DeploymentSpec field, runtime/twin that differs."""
    rows: list[tuple[str, Any, Any]] = []
    left, right = a.spec.to_json(), b.spec.to_json()
    for key in left:
        if key in ("additional_config", "compilation_config", "speculative_config", "env"):
            lv, rv = left[key] or {}, right[key] or {}
            if left[key] is None or right[key] is None:
                if left[key] != right[key]:
                    rows.append((key, left[key], right[key]))
                    continue
            for sub in list(dict.fromkeys([*lv, *rv])):
                if lv.get(sub) != rv.get(sub):
                    rows.append((f"{key}.{sub}", lv.get(sub), rv.get(sub)))
        elif left[key] != right[key]:
            rows.append((key, left[key], right[key]))
    for attr in ("runtime", "stock_twin"):
        if getattr(a, attr) != getattr(b, attr):
            rows.append((attr, getattr(a, attr), getattr(b, attr)))
    return rows
