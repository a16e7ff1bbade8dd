"""doctor's check that a deployment's histogram buckets resolve the interactivity tune predicts.

For a K3 deployment (TP 8/16) the range is the model's prediction on the published system, one
request up to max_num_seqs, fast path and stock twin, widened by `MARGIN` for the spread of
percentiles around the mean. Anything else (the CPU demo) has no prediction and is held to
buckets.DEFAULT_RANGE, what every shipped profile resolves.
"""

from __future__ import annotations

from kimictl.deployment import buckets, k3
from kimictl.deployment.spec import DeploymentSpec
from kimictl.runtime.checks.rules.base import Check, Section, Status

__all__ = ["MARGIN", "histogram_bucket_check", "predicted_interactivity"]

MARGIN = 1.25
CHECK_ID = "deployment.histogram_buckets"


def predicted_interactivity(spec: DeploymentSpec) -> tuple[float, float] | None:
    """(slowest, fastest) tokens/s/user tune's model predicts for `spec`; None off K3's shapes."""
    if spec.tensor_parallel_size not in k3.ALLOWED_TP:
        return None
    from kimictl.runtime.tuning.model import Config, predict
    from kimictl.runtime.tuning.published import PUBLISHED_SYSTEM
    from kimictl.runtime.tuning.systems import SYSTEMS

    system = SYSTEMS[PUBLISHED_SYSTEM]
    dcp = spec.decode_context_parallel_size
    speeds = [
        predict(
            system,
            Config(
                tp=spec.tensor_parallel_size,
                batch=batch,
                dcp=dcp if dcp in (1, spec.tensor_parallel_size) else 1,
                draft_tokens=min(spec.num_speculative_tokens, k3.MAX_SPECULATIVE_TOKENS),
                path=path,
            ),
        ).tokens_per_s_per_user
        for batch in sorted({1, spec.max_num_seqs or 1})
        for path in ("specialized", "stock")
    ]
    return min(speeds), max(speeds)


def histogram_bucket_check(spec: DeploymentSpec) -> Check:
    """WARN (with the exact flag) when the inter_token_latency buckets cannot resolve the range."""
    predicted = predicted_interactivity(spec)
    if predicted is not None:
        lo, hi = predicted[0] / MARGIN, predicted[1] * MARGIN
        why = f"tune predicts {predicted[0]:.0f}-{predicted[1]:.0f} tok/s/user for this deployment"
    else:
        lo, hi = buckets.DEFAULT_RANGE
        why = "no tune prediction for this shape; the shipped range"
    given = (spec.custom_histogram_buckets or {}).get(buckets.FAMILY)
    bounds = given or list(buckets.VLLM_DEFAULT_ITL_BUCKETS)
    gaps = buckets.unresolved_speeds(bounds, lo, hi)
    whose = "the custom" if given else "vLLM's default"
    if not gaps:
        return Check(
            CHECK_ID,
            Section.DEPLOYMENT,
            Status.PASS,
            f"interactivity buckets resolve {lo:.0f}-{hi:.0f} tok/s/user within ~5% ({why})",
        )
    shown = ", ".join(f"{a:.0f}-{b:.0f}" for a, b in gaps)
    want_lo, want_hi = min(lo, buckets.DEFAULT_RANGE[0]), max(hi, buckets.DEFAULT_RANGE[1])
    flag = buckets.flag_for({buckets.FAMILY: buckets.interactivity_buckets(want_lo, want_hi)})
    return Check(
        CHECK_ID,
        Section.DEPLOYMENT,
        Status.WARN,
        f"{whose} inter_token_latency buckets cannot resolve {shown} tok/s/user ({why}): "
        "monitor shows those percentiles as bounds",
        f"add to the vLLM command: {flag[0]} '{flag[1]}' (in a profile: [metrics] "
        f"interactivity_range = [{want_lo:.0f}, {want_hi:.0f}])",
    )
