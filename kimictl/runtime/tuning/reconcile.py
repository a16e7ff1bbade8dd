"""`kimictl tune --check BENCH.json PROFILE`: the model's prediction for a profile vs a measurement.

The bench JSON is `vllm bench serve --save-result` output or `kimictl bench --json` (its `runs`).
The load (concurrency), request shape (mean prompt and output tokens) and, when the server reported
it, the measured acceptance length are taken from the bench; the deployment from the profile.
Errors are (predicted - measured) / measured, per figure, never hidden.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kimictl.core.errors import InputError, Unsupported
from kimictl.deployment import k3
from kimictl.runtime.tuning.model import (
    MODEL_VERSION,
    Config,
    acceptance_rate_for,
    default_acceptance_rate,
    predict,
)
from kimictl.runtime.tuning.systems import SYSTEMS, System, get_system

__all__ = ["check_bench", "load_bench_runs"]

# the bench fields --check reads as numbers (vllm bench serve --save-result names)
_NUMERIC = (
    "completed",
    "max_concurrency",
    "total_input_tokens",
    "total_output_tokens",
    "spec_decode_acceptance_length",
    "output_throughput",
    "mean_tpot_ms",
    "mean_ttft_ms",
)


def load_bench_runs(path: str | Path) -> list[dict[str, Any]]:
    """The result dicts in a bench JSON file (one for vllm bench, one per run for kimictl bench)."""
    target = Path(path)
    try:
        doc = json.loads(target.read_text())
    except FileNotFoundError:
        raise InputError(f"bench file {target} does not exist.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"bench file {target} is not JSON ({exc}).") from exc
    runs = doc.get("runs") if isinstance(doc, dict) and "runs" in doc else [doc]
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise InputError(f"bench file {target}: 'runs' must be a list of result objects.")
    for index, run in enumerate(runs):
        kim = run.get("kimictl")
        mean = kim.get("interactivity_tok_s_per_user") if isinstance(kim, dict) else None
        fields = [(key, run.get(key)) for key in _NUMERIC]
        if isinstance(mean, dict):
            fields.append(("kimictl.interactivity_tok_s_per_user.mean", mean.get("mean")))
        for key, value in fields:
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if value is not None and not number:
                raise InputError(
                    f"bench file {target}, run {index}: {key} = {value!r} is not a number."
                )
    usable = [r for r in runs if r.get("completed")]
    if not usable:
        raise InputError(
            f"bench file {target} has no run with completed requests (key 'completed'); expected "
            f"`vllm bench serve --save-result` or `kimictl bench --json` output."
        )
    return usable


def _system_for(profile: Any, system: str | None) -> System:
    if system is not None:
        return get_system(system)
    inputs = profile.provenance.get("inputs") if isinstance(profile.provenance, dict) else None
    if isinstance(inputs, dict) and str(inputs.get("system", "")).lower() in SYSTEMS:
        return SYSTEMS[str(inputs["system"]).lower()]
    hardware = str(profile.provenance.get("hardware", "")).lower()
    for name in SYSTEMS:
        if hardware.startswith(name) or f"{name} " in hardware or f"{name}:" in hardware:
            return SYSTEMS[name]
    raise InputError(
        f"profile {profile.name} does not say which system it runs on; pass --system "
        f"({', '.join(SYSTEMS)})."
    )


def _measured_interactivity(run: dict[str, Any]) -> float | None:
    kim = run.get("kimictl") or {}
    mean = (kim.get("interactivity_tok_s_per_user") or {}).get("mean")
    if mean:
        return float(mean)
    tpot = run.get("mean_tpot_ms")
    return 1000.0 / float(tpot) if tpot else None


def _names(model: str | None) -> set[str]:
    """A model's names as a bench may record them: as given, and its last path part."""
    if not model:
        return set()
    text = str(model).strip().rstrip("/").lower()
    return {text, text.rsplit("/", 1)[-1]}


def _refuse_other_model(runs: list[dict[str, Any]], spec: Any, bench: Any, profile: str) -> None:
    """A bench of another model says nothing about this profile's prediction: refuse it rather
    than report its distance from the model as an error."""
    ours = _names(spec.model) | _names(spec.served_model_name)
    for index, run in enumerate(runs):
        theirs = _names(run.get("model_id"))
        if theirs and not theirs & ours:
            raise InputError(
                f"bench file {bench}, run {index}: model_id {run.get('model_id')!r} is not "
                f"profile {profile}'s model ({spec.model}); --check needs a bench of that model."
            )


def check_bench(
    bench: str | Path, profile_name: str, *, system: str | None = None
) -> dict[str, Any]:
    """Compare each run in `bench` with the model's prediction for `profile_name`."""
    from kimictl.deployment.profiles import load_profile

    runs = load_bench_runs(bench)
    profile = load_profile(profile_name)
    if profile.runtime != "gpu":
        raise Unsupported(
            f"profile {profile.name} runs on kimictl's CPU runtime; the model describes Kimi K3 on "
            f"GPUs ({', '.join(SYSTEMS)}), so there is nothing to reconcile.",
            hint="run --check with a bench of a GPU profile; on CPU use `kimictl tune --measure`",
        )
    spec = profile.spec
    _refuse_other_model(runs, spec, bench, profile.name)
    hw = _system_for(profile, system)
    tp, dcp = spec.tensor_parallel_size, spec.decode_context_parallel_size
    if tp not in k3.ALLOWED_TP or dcp not in (1, tp):
        raise InputError(
            f"profile {profile.name} has TP {tp} / DCP {dcp}; the model covers TP 8 or 16 with "
            f"DCP 1 or TP."
        )
    draft = spec.num_speculative_tokens
    path = "specialized" if spec.decode_backend == k3.DECODE_BACKEND_SPECIALIZED else "stock"
    replicas = max(spec.data_parallel_size, 1)
    figures: list[dict[str, Any]] = []
    notes: list[str] = []
    for index, run in enumerate(runs):
        completed = int(run["completed"])
        concurrency = run.get("max_concurrency")
        if not concurrency:
            raise InputError(
                f"bench file {bench}, run {index}: no max_concurrency; --check models closed-loop "
                f"runs (bench --concurrency N)."
            )
        context = max(1, round(float(run.get("total_input_tokens", 0)) / completed))
        output = max(2, round(float(run.get("total_output_tokens", 0)) / completed))
        al = run.get("spec_decode_acceptance_length")
        if draft and al:
            rate = acceptance_rate_for(min(float(al), draft + 1.0), draft)
            al_note = f"measured acceptance length {float(al):.2f}"
        else:
            rate = default_acceptance_rate()
            al_note = "acceptance length ASSUMED (the bench has none)" if draft else "no drafts"
        cfg = Config(
            tp=tp,
            batch=max(1, math.ceil(int(concurrency) / replicas)),
            dcp=dcp,
            draft_tokens=draft,
            acceptance=rate,
            context=context,
            output_len=output,
            path=path,  # type: ignore[arg-type]
        )
        pred = predict(hw, cfg)
        label = f"run {index} (concurrency {concurrency}, {al_note})"
        rows = [
            ("output tokens/s", run.get("output_throughput"), pred.tokens_per_s * replicas),
            ("tokens/s/user (mean)", _measured_interactivity(run), pred.tokens_per_s_per_user),
            ("TTFT ms (mean)", run.get("mean_ttft_ms"), pred.ttft_ms),
        ]
        for name, measured, predicted in rows:
            if measured is None or float(measured) <= 0:
                notes.append(f"{label}: no measured {name}")
                continue
            figures.append(
                {
                    "run": index,
                    "figure": f"{label}: {name}",
                    "measured": float(measured),
                    "predicted": float(predicted),
                    "error": (float(predicted) - float(measured)) / float(measured),
                }
            )
    return {
        "model_version": MODEL_VERSION,
        "bench": str(bench),
        "profile": profile.name,
        "system": hw.name,
        "config": {"path": path, "tp": tp, "dcp": dcp, "draft_tokens": draft, "replicas": replicas},
        "figures": figures,
        "max_abs_error": max((abs(f["error"]) for f in figures), default=None),
        "notes": notes,
    }
