"""What `kimictl tune` calls: inputs, search, predict; every bad input is an InputError."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kimictl.core.errors import InputError
from kimictl.deployment import k3
from kimictl.runtime.tuning.model import (
    MODEL_VERSION,
    PARAMS,
    Config,
    acceptance_rate_for,
    default_acceptance_rate,
    predict,
    with_path,
)
from kimictl.runtime.tuning.published import PUBLISHED_SYSTEM, published_checks
from kimictl.runtime.tuning.published import calibrate as calibrate_params
from kimictl.runtime.tuning.search import SearchInputs, SearchResult, search
from kimictl.runtime.tuning.systems import SYSTEMS, System, get_system, system_from_report

__all__ = [
    "Acceptance",
    "SearchOutcome",
    "SearchRequest",
    "model_card",
    "parse_acceptance",
    "parse_tokens",
    "predict_pair",
    "resolve_system",
    "run_search",
]


def parse_tokens(text: str, *, flag: str) -> int:
    """`8192`, `8k` (8000), `8K` (8192), `1M`: vLLM's --max-model-len spelling; positive only."""
    from kimictl.deployment.spec import parse_max_model_len

    value = parse_max_model_len(text, flag=flag)
    if value <= 0:
        raise InputError(
            f"{flag} must be a positive number of tokens like 8k or 8192, got {text!r}."
        )
    if flag == "--context" and value > k3.K3_SHAPES["max_context"]:
        raise InputError(
            f"--context {text!r} is beyond Kimi K3's maximum context of "
            f"{k3.K3_SHAPES['max_context']} tokens."
        )
    return value


@dataclass(frozen=True)
class Acceptance:
    """A measured acceptance length `length` at `draft_tokens` (None = the published assumption)."""

    length: float | None
    draft_tokens: int = k3.MAX_SPECULATIVE_TOKENS

    @property
    def rate(self) -> float:
        if self.length is None:
            return default_acceptance_rate()
        return acceptance_rate_for(self.length, self.draft_tokens)


_ACCEPTANCE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(?:@\s*([0-9]+))?\s*$")


def parse_acceptance(text: str | None, *, default_draft_tokens: int | None = None) -> Acceptance:
    """`6` (AL 6 at 7 draft tokens, or at `default_draft_tokens`) or `3.1@3` (AL 3.1 at 3)."""
    at = default_draft_tokens or k3.MAX_SPECULATIVE_TOKENS
    if text is None:
        return Acceptance(None, at)
    match = _ACCEPTANCE.match(text)
    if not match:
        raise InputError(
            f"--draft-acceptance {text!r} is not an acceptance length; use AL or AL@DRAFT_TOKENS, "
            f"e.g. 6 or 3.1@3."
        )
    length = float(match.group(1))
    draft = int(match.group(2)) if match.group(2) else at
    if not 1 <= draft <= k3.MAX_SPECULATIVE_TOKENS:
        raise InputError(
            f"--draft-acceptance {text!r}: draft tokens must be 1 to {k3.MAX_SPECULATIVE_TOKENS}."
        )
    if not 1.0 <= length <= draft + 1:
        raise InputError(
            f"--draft-acceptance {text!r}: an acceptance length with {draft} draft tokens must be "
            f"between 1 and {draft + 1}."
        )
    return Acceptance(length, draft)


def resolve_system(
    system: str | None, gpus: int | None, snapshots: Sequence[str | Path] | None
) -> tuple[System, int, str]:
    """(system, GPU count, where they came from) from --system/--gpus or --from-snapshot."""
    if snapshots:
        if system is not None:
            raise InputError("--system and --from-snapshot both given; pass one of them.")
        from kimictl.runtime.checks.hardware import load_snapshots

        report = load_snapshots(list(snapshots))
        found, count = system_from_report(report)
        if gpus is not None and gpus != count:
            raise InputError(
                f"--gpus {gpus} disagrees with the snapshot, which lists {count} GPU(s); drop "
                f"--gpus or fix the snapshot."
            )
        return found, count, f"snapshot ({', '.join(str(s) for s in snapshots)})"
    if system is None:
        return _local_system(gpus)
    found = get_system(system)
    if gpus is None:
        raise InputError(f"--system {system} needs --gpus N (8 or 16 per replica).")
    return found, gpus, "--system"


def _local_system(gpus: int | None) -> tuple[System, int, str]:
    """This machine's GPUs (the doctor's live probe) when no --system or snapshot is given."""
    from kimictl.runtime.checks.hardware import probe_local

    report = probe_local(include_stack=False)
    reasons = [node.no_driver_reason for node in report.nodes if node.no_driver_reason]
    if not report.gpus:
        why = f" ({reasons[0]})" if reasons else ""
        raise InputError(
            f"no hardware given and this machine has no GPU{why}; pass --system "
            f"({', '.join(SYSTEMS)}) and --gpus N, or --from-snapshot FILE."
        )
    found, count = system_from_report(report)
    if gpus is not None:
        count = gpus  # this node's GPU model, the whole deployment's GPU count
    return found, count, f"this machine ({len(report.gpus)} GPU(s) probed)"


def run_search(
    *,
    system: System,
    gpus: int,
    context: int,
    output_len: int,
    concurrency: int,
    slo_text: str | None,
    acceptance: Acceptance,
) -> SearchResult:
    """Parse the SLO and search (the one call `kimictl tune` makes for a model search)."""
    slo = None
    if slo_text is not None:
        from kimictl.runtime.load.slo import parse_slo

        slo = parse_slo(slo_text)
    return search(
        SearchInputs(
            system=system,
            gpus=gpus,
            context=context,
            output_len=output_len,
            concurrency=concurrency,
            slo=slo,
            acceptance_length=acceptance.length,
            acceptance_draft_tokens=acceptance.draft_tokens,
        )
    )


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """`kimictl tune`'s model search as asked: hardware (a --system, snapshots or this machine),
    workload, SLO and what to write. `run()` checks it, searches and writes."""

    system: str | None = None
    gpus: int | None = None
    snapshots: tuple[Path, ...] = ()
    context: str = "8k"
    output_len: str = "1k"
    concurrency: int = 1
    slo: str | None = None
    draft_acceptance: str | None = None
    comm_curve: Path | None = None
    write: Path | None = None
    plot: Path | None = None
    force: bool = False  # replace the --write and --plot files

    def run(self) -> SearchOutcome:
        """The search on the hardware asked for, with this node's measured kernel overheads when
        it measured the GPU modelled (layer_overhead); the profile and plot written if asked."""
        from kimictl.runtime.tuning.layer_overhead import with_node_overheads

        if self.plot is not None:  # refuse a bad --plot before anything is written
            from kimictl.runtime.tuning.plot import check_png_target

            check_png_target(self.plot, overwrite=self.force)
        hw, count, source = resolve_system(self.system, self.gpus, self.snapshots)
        hw = with_node_overheads(with_comm_curve(hw, self.comm_curve))
        result = run_search(
            system=hw,
            gpus=count,
            context=parse_tokens(self.context, flag="--context"),
            output_len=parse_tokens(self.output_len, flag="--output-len"),
            concurrency=self.concurrency,
            slo_text=self.slo,
            acceptance=parse_acceptance(self.draft_acceptance),
        )
        written = None
        if self.write is not None and result.choice is not None:
            from kimictl.runtime.tuning.choice_profile import write_choice

            written = write_choice(result, self.write, overwrite=self.force, hardware_source=source)
        png = None
        if self.plot is not None:
            from kimictl.runtime.tuning.plot import save_png

            png = save_png(result, self.plot, overwrite=self.force)
        return SearchOutcome(result=result, source=source, written=written, png=png)


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """A search and what came of it: where the hardware came from, the files written."""

    result: SearchResult
    source: str  # where the hardware figures came from, in words
    written: Path | None = None  # the --write profile
    png: Path | None = None  # the --plot file

    @property
    def system(self) -> System:
        """The system searched, with the all-reduce curve and kernel overheads it used."""
        return self.result.inputs.system

    def to_json(self) -> dict[str, Any]:
        """`kimictl tune --json`: the search, the sources of its terms, the files written."""
        from kimictl.runtime.tuning.layer_overhead import overheads_report

        doc = self.result.to_json()
        doc["hardware_source"] = self.source
        doc["communication"] = self.system.communication()
        doc["kernel_overheads"] = overheads_report(self.system)
        doc["model"] = model_card()["published_figures"]
        if self.written is not None:
            doc["written"] = str(self.written)
        if self.png is not None:
            doc["plot"] = str(self.png)
        return doc


def predict_pair(
    *,
    system: System,
    gpus: int,
    tp: int,
    dcp: int,
    batch: int,
    draft_tokens: int,
    acceptance: Acceptance,
    context: int,
    output_len: int,
) -> dict[str, Any]:
    """`kimictl tune predict`: one configuration on the specialized path and on stock."""
    if tp not in k3.ALLOWED_TP:
        raise InputError(f"--tp {tp} is not allowed by the K3 fast path; allowed: 8 or 16.")
    if dcp not in (1, tp):
        raise InputError(f"--dcp {dcp} must be 1 or equal to --tp ({tp}).")
    if gpus % tp:
        raise InputError(f"--gpus {gpus} is not a multiple of --tp {tp}.")
    if batch <= 0:
        raise InputError(f"--batch must be a positive number of requests, got {batch}.")
    if not 0 <= draft_tokens <= k3.MAX_SPECULATIVE_TOKENS:
        raise InputError(
            f"--draft-tokens {draft_tokens} is out of range; allowed: 0 to "
            f"{k3.MAX_SPECULATIVE_TOKENS}."
        )
    cfg = Config(
        tp=tp,
        batch=batch,
        dcp=dcp,
        draft_tokens=draft_tokens,
        acceptance=acceptance.rate,
        context=context,
        output_len=output_len,
        path="specialized",
    )
    own = predict(system, cfg)
    stock = predict(system, with_path(cfg, "stock"))
    from kimictl.runtime.tuning.search import allowed_paths

    reason = allowed_paths(system, tp)["specialized"]
    return {
        "model_version": MODEL_VERSION,
        "system": system.name,
        "gpus": gpus,
        "replicas": gpus // tp,
        "acceptance_length": round(own.tokens_per_step, 3),
        "acceptance_assumed": acceptance.length is None and draft_tokens > 0,
        "specialized": {**own.predicted(), "detail": own.to_json()},
        "stock": {**stock.predicted(), "detail": stock.to_json()},
        "speedup": round(own.tokens_per_s_per_user / stock.tokens_per_s_per_user, 3),
        "specialized_unavailable": reason,
        "communication": system.communication(tp),
        "spec_sheet_communication": _spec_sheet_pair(system, cfg),
    }


def _spec_sheet_pair(system: System, cfg: Config) -> dict[str, Any] | None:
    """With a measured curve: the same configuration priced with the spec-sheet constants (what
    the curve changed); None without one."""
    if system.comm is None:
        return None
    plain = replace(system, comm=None)
    own, stock = predict(plain, cfg), predict(plain, with_path(cfg, "stock"))
    return {
        "specialized": {**own.predicted(), "comm_us": round(own.breakdown.get("comm", 0.0), 2)},
        "stock": {**stock.predicted(), "comm_us": round(stock.breakdown.get("comm", 0.0), 2)},
    }


def with_comm_curve(system: System, path: str | Path | None) -> System:
    """`system` with its all-reduce term from a measured curve (`--comm-curve FILE`)."""
    if path is None:
        return system
    from kimictl.runtime.tuning.commcurve import load_comm_curve

    return replace(system, comm=load_comm_curve(path))


def model_card(
    *, calibrate: bool = False, kernel_bench: str | Path | None = None
) -> dict[str, Any]:
    """The model's version, parameters with sources, and its error on the published figures.

    `calibrate`: also refit the fitted parameters from the published figures (calibrate()) and
    report how far the stored values are from the refit.
    """
    system = SYSTEMS[PUBLISHED_SYSTEM]
    card = {
        "model_version": MODEL_VERSION,
        "parameters": {
            name: {
                "value": param.value,
                "unit": param.unit,
                "fitted": param.fitted,
                "source": param.source,
            }
            for name, param in PARAMS.items()
        },
        "published_figures": [check.to_json() for check in published_checks(system)],
    }
    if kernel_bench is not None:
        from kimictl.runtime.tuning.calibration import fit_kernel_bench

        fits = fit_kernel_bench(kernel_bench)
        card["kernel_bench"] = {
            "file": str(kernel_bench),
            "fits": {kind: fit.to_json() for kind, fit in fits.items()},
            "compare": {
                f"hbm_efficiency_{kind}": {
                    "stored": PARAMS[f"hbm_efficiency_{kind}"].value,
                    "measured": round(fit.efficiency, 4),
                }
                for kind, fit in fits.items()
            },
        }
    if calibrate:
        card["calibration"] = {
            name: {
                "stored": PARAMS[name].value,
                "refit": value,
                "drift": (PARAMS[name].value - value) / value if value else 0.0,
            }
            for name, value in calibrate_params(system).items()
        }
    return card
