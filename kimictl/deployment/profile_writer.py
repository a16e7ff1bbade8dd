"""Writing profiles: a DeploymentSpec -> TOML (the exact inverse of loading), new files and
provenance edits, both atomic."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import Table

from kimictl.core.errors import InputError
from kimictl.core.outputs import atomic_write, check_new_file, save_or_keep
from kimictl.deployment import buckets, k3, traces
from kimictl.deployment.profiles import (
    _ADDITIONAL_KEYS,
    _COMPILE_KEYS,
    PREBUILT_MODES,
    PROFILE_SECTIONS,
    RUNTIMES,
    _parse_document,
    _validate,
)
from kimictl.deployment.spec import (
    PREBUILT_DEFAULT,
    DeploymentSpec,
)

__all__ = [
    "profile_from_spec",
    "render_profile",
    "update_provenance",
    "write_profile",
]


# ---------------------------------------------------------------- writing


def profile_from_spec(
    spec: DeploymentSpec,
    *,
    provenance: Mapping[str, Any] | None = None,
    description: str = "",
    runtime: str = "gpu",
    stock_twin: str | None = None,
    prebuilt_units: str = PREBUILT_DEFAULT,
) -> tomlkit.TOMLDocument:
    """A TOML document for `spec` (the exact inverse of loading it)."""
    if runtime not in RUNTIMES:
        raise InputError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}.")
    if prebuilt_units not in PREBUILT_MODES:
        raise InputError(
            f"prebuilt_units must be one of {', '.join(PREBUILT_MODES)}, got {prebuilt_units!r}."
        )
    doc = tomlkit.document()
    if description:
        doc.add("description", description)

    def section(name: str, items: Iterable[tuple[str, Any]]) -> None:
        table = tomlkit.table()
        for key, value in items:
            if value is not None:
                table.add(key, _inline(value))
        if len(table) or name in ("model",):
            doc.add(name, table)

    section(
        "model",
        [
            ("name", spec.model),
            ("served_name", spec.served_model_name),
            ("max_model_len", _opt_len(spec.max_model_len)),
            ("kv_cache_dtype", _nondefault(spec.kv_cache_dtype, "auto")),
            ("mamba_cache_dtype", _nondefault(spec.mamba_cache_dtype, "auto")),
            ("mamba_ssm_cache_dtype", _nondefault(spec.mamba_ssm_cache_dtype, "auto")),
            ("enable_lora", spec.enable_lora or None),
            ("use_replayssm", spec.use_replayssm or None),
        ],
    )
    section(
        "parallel",
        [
            ("tensor_parallel_size", spec.tensor_parallel_size),
            ("pipeline_parallel_size", _nondefault(spec.pipeline_parallel_size, 1)),
            ("data_parallel_size", _nondefault(spec.data_parallel_size, 1)),
            ("decode_context_parallel_size", _nondefault(spec.decode_context_parallel_size, 1)),
            ("enable_expert_parallel", spec.enable_expert_parallel or None),
            ("enable_dbo", spec.enable_dbo or None),
            ("distributed_executor_backend", spec.distributed_executor_backend),
        ],
    )
    if spec.speculative_config is not None:
        listed = PROFILE_SECTIONS["speculative"]
        items = [(k, v) for k, v in spec.speculative_config.items() if k in listed and k != "extra"]
        extra = {
            k: v for k, v in spec.speculative_config.items() if k not in listed or k == "extra"
        }
        table = tomlkit.table()
        for key, value in items:
            table.add(key, _inline(value))
        if extra:
            table.add("extra", _inline(extra))
        doc.add("speculative", table)
    section(
        "batching",
        [
            ("max_num_seqs", spec.max_num_seqs),
            ("max_num_batched_tokens", spec.max_num_batched_tokens),
            ("gpu_memory_utilization", spec.gpu_memory_utilization),
        ],
    )
    cc = spec.compilation_config
    compile_extra = {k: v for k, v in cc.items() if k not in _COMPILE_KEYS}
    section(
        "compile",
        [
            ("enforce_eager", spec.enforce_eager or None),
            ("optimization_level", spec.optimization_level),
            *[(k, cc[k]) for k in _COMPILE_KEYS if k in cc],
            ("extra", compile_extra or None),
        ],
    )
    ac = spec.additional_config
    listed_ac = [(k, ac[k]) for k in _ADDITIONAL_KEYS if k in ac and _valid_choice(k, ac[k])]
    other_ac = {k: v for k, v in ac.items() if k not in dict(listed_ac)}
    section(
        "serve",
        [
            ("runtime", runtime),
            ("host", spec.host),
            ("port", spec.port),
            ("stock_twin", stock_twin),
            ("prebuilt_units", _nondefault(prebuilt_units, PREBUILT_DEFAULT)),
            ("enable_sleep_mode", spec.enable_sleep_mode or None),
            *listed_ac,
            ("additional_config", other_ac or None),
            ("extra_args", list(spec.extra_args) or None),
        ],
    )
    hb = dict(spec.custom_histogram_buckets or {})
    derived = buckets.range_of(hb.get(buckets.FAMILY, []))
    if derived is not None:
        del hb[buckets.FAMILY]
    endpoint = spec.otlp_traces_endpoint
    section(
        "metrics",
        [
            ("interactivity_range", [_whole_if(v) for v in derived] if derived else None),
            ("custom_histogram_buckets", hb or None),
            ("traces", traces.KIMICTL if endpoint == traces.kimictl_endpoint() else endpoint),
        ],
    )
    if spec.env:
        env = tomlkit.table()
        for key, value in spec.env.items():
            env.add(key, value)
        doc.add("env", env)
    if provenance:
        prov = tomlkit.table()
        for key, value in provenance.items():
            if value is not None:
                prov.add(key, _inline(value))
        doc.add("provenance", prov)
    return doc


def render_profile(spec: DeploymentSpec, **kwargs: Any) -> str:
    return tomlkit.dumps(profile_from_spec(spec, **kwargs))


def write_profile(
    path: str | Path,
    spec: DeploymentSpec,
    provenance: Mapping[str, Any] | None = None,
    *,
    description: str = "",
    runtime: str = "gpu",
    stock_twin: str | None = None,
    prebuilt_units: str = PREBUILT_DEFAULT,
    overwrite: bool = False,
    flag: str = "--write",
) -> Path:
    """Write a new profile whole (the one no-overwrite writer): an existing file is never replaced
    unless `overwrite`, a folder never (InputError, before anything is rendered). A write that
    still fails (the name taken meanwhile, a read-only folder) keeps the profile in the state
    folder and raises WriteFailed (exit 1): a tune's finished sweep is not lost."""
    target = check_new_file(path, flag=flag, overwrite=overwrite)
    text = render_profile(
        spec,
        provenance=provenance,
        description=description,
        runtime=runtime,
        stock_twin=stock_twin,
        prebuilt_units=prebuilt_units,
    )
    return save_or_keep(target, text, flag=flag, overwrite=overwrite)


def update_provenance(path: str | Path, updates: Mapping[str, Any]) -> None:
    """Set keys in [provenance] (added at the end if missing; a None value removes the key),
    keeping comments, key order and every other byte of the file."""
    target = Path(path).expanduser()
    document, text = _parse_document(target)
    _validate(target, text, document.unwrap())  # refuse to edit a file that is already wrong
    section = document.get("provenance")
    if section is None:
        section = tomlkit.table()
        document.add("provenance", section)
    assert isinstance(section, Table)
    for key, value in updates.items():
        if value is None:  # None removes the key
            if key in section:
                del section[key]
        else:
            section[key] = _inline(value)
    atomic_write(target, tomlkit.dumps(document))


def _inline(value: Any) -> Any:
    """A TOML value: nested dicts become inline tables (a section stays one flat block), tuples
    become arrays, None entries inside tables are left out, other objects become strings."""
    if isinstance(value, Mapping):
        table = tomlkit.inline_table()
        for key, item in value.items():
            if item is not None:
                table[str(key)] = _inline(item)
        return table
    if isinstance(value, (list, tuple)):
        array = tomlkit.array()
        for item in value:
            array.append(_inline(item))
        return array
    if isinstance(value, (str, bool, int, float)):
        return value
    return str(value)


def _whole_if(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _nondefault(value: Any, default: Any) -> Any:
    return None if value == default else value


def _opt_len(value: int | None) -> int | str | None:
    if value == -1:
        return "auto"
    return value


def _valid_choice(key: str, value: Any) -> bool:
    return value in k3.ADDITIONAL_CONFIG_CHOICES.get(key, ())
