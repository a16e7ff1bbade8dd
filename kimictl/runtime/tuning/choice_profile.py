"""Turn a tuning choice into a profile TOML (and its stock twin) that passes the deployment rules.

The chosen TP/DCP/draft/max-num-seqs are applied to the shipped `k3-tp{8,16}-latency` profile
(model, DSpark draft, FULL CUDA graphs with the prepared batches, Model Runner V2), so everything
the model does not decide stays as the reviewed shipped profile has it. Before anything is written
the spec goes through `rules.deployment.deployment_checks`; a failing rule is a kimictl bug and
raises CheckFailed instead of writing a profile that `kimictl serve` would refuse.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kimictl.core.errors import CheckFailed, InputError
from kimictl.deployment import k3
from kimictl.deployment.spec import PREBUILT_DEFAULT, DeploymentSpec
from kimictl.runtime.checks.stack import VLLM_VERSION
from kimictl.runtime.tuning.model import MODEL_VERSION, Config, fitted_parameters
from kimictl.runtime.tuning.search import SearchResult

__all__ = ["check_write_target", "spec_for", "twin_path", "write_choice", "write_spec_pair"]


def _base_spec(tp: int, *, stock: bool) -> DeploymentSpec:
    from kimictl.deployment.profiles import load_profile

    name = f"k3-tp{tp}-latency" + ("-stock" if stock else "")
    return load_profile(name).spec


def spec_for(
    cfg: Config, *, max_num_seqs: int, stock: bool = False, base: DeploymentSpec | None = None
) -> DeploymentSpec:
    """The DeploymentSpec of one chosen configuration (stock=True: its decode_backend auto twin)."""
    spec = base if base is not None else _base_spec(cfg.tp, stock=stock)
    speculative = None
    if cfg.draft_tokens:
        speculative = dict(spec.speculative_config or {"method": k3.REQUIRED_SPEC_METHOD})
        speculative["num_speculative_tokens"] = cfg.draft_tokens
    backend = k3.DECODE_BACKEND_AUTO if stock else k3.DECODE_BACKEND_SPECIALIZED
    max_len = -(-(cfg.context + cfg.output_len) // 1024) * 1024  # whole 1K blocks
    return spec.with_(
        tensor_parallel_size=cfg.tp,
        decode_context_parallel_size=cfg.dcp,
        speculative_config=speculative,
        max_num_seqs=max_num_seqs,
        max_model_len=max(max_len, spec.max_model_len or 0) if cfg.context else spec.max_model_len,
        additional_config={**spec.additional_config, "decode_backend": backend},
    )


def _check_rules(spec: DeploymentSpec, path: Path) -> None:
    from kimictl.runtime.checks.rules.base import Status
    from kimictl.runtime.checks.rules.deployment import deployment_checks

    k3_config = {key: value for key, value in k3.K3_MOE_CONFIG.items()}
    failed = [
        check
        for check in deployment_checks(spec, None, model_config=k3_config)
        if check.status is Status.FAIL
    ]
    if failed:
        raise CheckFailed(
            f"the tuned profile for {path} would fail the deployment rule(s) "
            f"{', '.join(check.id for check in failed)}; nothing was written.",
            hint="this is a kimictl bug: report it with the command line",
        )


def twin_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}-stock{path.suffix or '.toml'}")


def check_write_target(path: str | Path, *, overwrite: bool, with_twin: bool = False) -> Path:
    """The --write file (and its stock twin): a .toml in an existing folder, not a folder, and
    not an existing file unless `overwrite`. Call it before long work (a sweep) as well."""
    from kimictl.core.outputs import check_new_file

    target = check_new_file(path, flag="--write", suffix=".toml", overwrite=overwrite)
    if with_twin:
        check_new_file(twin_path(target), flag="--write", suffix=".toml", overwrite=overwrite)
    return target


def write_spec_pair(
    path: str | Path,
    spec: DeploymentSpec,
    stock: DeploymentSpec | None,
    provenance: Mapping[str, Any],
    *,
    description: str,
    overwrite: bool = False,
    runtime: str = "gpu",
    prebuilt_units: tuple[str, str] = (PREBUILT_DEFAULT, PREBUILT_DEFAULT),
) -> Path:
    """Write `spec` at `path` and, when given, its stock twin beside it (`NAME-stock.toml`);
    `prebuilt_units` is each one's `[serve] prebuilt_units` (tuned, stock)."""
    from kimictl.deployment.profile_writer import write_profile

    target = check_write_target(path, overwrite=overwrite, with_twin=stock is not None)
    twin = twin_path(target)
    if runtime == "gpu":
        _check_rules(spec, target)
    if stock is not None:
        write_profile(
            twin,
            stock,
            {**provenance, "role": "stock twin of " + target.stem},
            description=f"Stock-decode twin of {target.stem} (decode_backend auto): A/B baseline",
            runtime=runtime,
            prebuilt_units=prebuilt_units[1],
            overwrite=overwrite,
        )
    return write_profile(
        target,
        spec,
        provenance,
        description=description,
        runtime=runtime,
        stock_twin=twin.stem if stock is not None else None,
        prebuilt_units=prebuilt_units[0],
        overwrite=overwrite,
    )


def write_choice(
    result: SearchResult, path: str | Path, *, overwrite: bool = False, hardware_source: str = ""
) -> Path:
    """Write the search's choice as a profile with provenance (inputs, model, predicted figures)."""
    choice = result.choice
    if choice is None:
        raise InputError(
            f"--write {str(path)!r}: the search found no configuration that fits, so there is "
            f"no profile to write."
        )
    cfg = choice.config
    specialized = cfg.path == "specialized"
    spec = spec_for(cfg, max_num_seqs=choice.max_num_seqs, stock=not specialized)
    stock = spec_for(cfg, max_num_seqs=choice.max_num_seqs, stock=True) if specialized else None
    provenance = {
        "source": "kimictl tune (model)",
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "model_version": MODEL_VERSION,
        "vllm_version": VLLM_VERSION,
        "hardware": f"{result.inputs.system.name} x {result.inputs.gpus} ({hardware_source})",
        "inputs": {k: v for k, v in result.inputs.to_json().items() if v is not None},
        "replicas": choice.replicas,
        "predicted": choice.prediction.predicted(),
        "predicted_stock": choice.stock.predicted(),
        "predicted_fallback_share": round(choice.prediction.fallback_share, 4),
        "bound_by": choice.bound_by,
        "why": choice.why,
        "fitted_parameters": fitted_parameters(result.inputs.system),
    }
    description = (
        f"Tuned by kimictl tune: {cfg.path} TP{cfg.tp} DCP{cfg.dcp} draft {cfg.draft_tokens}, "
        f"max-num-seqs {choice.max_num_seqs} on {result.inputs.system.name}"
    )
    return write_spec_pair(
        path, spec, stock, provenance, description=description, overwrite=overwrite
    )
