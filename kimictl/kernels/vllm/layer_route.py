"""`[serve] kimictl_layer = true` (KIMICTL_VLLM_LAYER=1): which of vLLM 0.33's K3 decoder layers
kimictl's fused dense layer (kimictl.kernels.layer.chain) may serve, and why each other one keeps
vLLM's forward.

The fused layer runs three segments per GPU, built at the TP 8 shapes (kimictl.kernels.layer.ops):
a = add + RMSNorm -> qkv_a_g/kda_in -> norms, q_b/f_b; b = o_proj + residual -> RMSNorm -> router |
latent_down | shared_gate_up; c = RMSNorm of the routed latent, SiTU -> latent_up | shared_down.
It computes vLLM's layer only where vLLM runs that same math inside each segment, and vLLM 0.33's
KimiDecoderLayer does not, in three places (each cited in LAYER_FACTS and checked against the
wheel, and run, by tests/test_vllm_layer_route.py):
- AttnRes: with `attn_res_block_size` set (the K3 checkpoint) the layer's pre- and
  post-attention norms are attn_res(), a weighted sum over earlier residual blocks, not the
  add + RMSNorm that segments a and b open with;
- TP > 1: o_proj is a RowParallelLinear whose partial sums vLLM all-reduces before the residual
  add that segment b fuses into o_proj, and the routed latent is all-reduced before the RMSNorm
  that opens segment c (the shared expert's partial output apart);
- TP 1: the layer's shapes are not the TP 8 shapes the segments are built at.
So on every K3 deployment the switch installs nothing: the plugin logs, per model, how many
layers each reason stops (`LayerReport.line`), and doctor says the same before serve. Routing
needs segments cut at vLLM's collectives and AttnRes (docs/kernels.md, "The plugin's layer
switch").
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kimictl.runtime.deployment.spec import LAYER_ENV_VAR

__all__ = [
    "ATTENTION_KINDS",
    "BUILT_TP",
    "ENV_VAR",
    "LAYER_FACTS",
    "LayerReport",
    "LayerVerdict",
    "layer_enabled",
    "layer_report",
    "verdict",
]

ENV_VAR = LAYER_ENV_VAR
BUILT_TP = 8  # kimictl.kernels.layer.ops.dense_layer_ops' default: the segments' shapes
# vLLM's attention classes (model.py builds one per layer) and the fused layer's kind for each
ATTENTION_KINDS = {"MultiHeadLatentAttention": "mla", "KimiK3DeltaAttention": "kda"}
# (file in the vllm 0.33.0 wheel, line, text on it): where vLLM runs what a segment cannot
# contain. tests/test_vllm_layer_route.py checks each line against the wheel and runs the code.
_K3, _LINEAR = "vllm/models/kimi_k3/nvidia/", "vllm/model_executor/layers/linear.py"
LAYER_FACTS = (
    (_K3 + "model.py", 797, "self.use_attn_res = attn_res_block_size is not None"),
    (_K3 + "model.py", 850, "hidden_states = attn_res("),  # _pre_attn_norm
    (_K3 + "model.py", 883, "hidden_states = attn_res("),  # _post_attn_norm
    (_K3 + "mla.py", 297, "self.o_proj = RowParallelLinear("),  # reduce_results: its default
    (_K3 + "kda.py", 878, "self.o_proj = RowParallelLinear("),
    (_LINEAR, 1698, "reduce_results: bool = True,"),
    (_LINEAR, 1818, "output = tensor_model_parallel_all_reduce(output_parallel)"),
    (
        _K3 + "latent_moe_runner.py",
        424,
        "reduced = tensor_model_parallel_all_reduce(hidden_states)",
    ),  # fmt: skip
    (_K3 + "latent_moe_runner.py", 425, "return norm(reduced)"),
)

NOT_MOE = "a dense MLP layer (segments b and c are the MoE's)"
OTHER_ATTENTION = "an attention the fused layer is not built for"
ATTN_RES = "AttnRes norms (attn_res) where segments a and b open with add + RMSNorm"
TP_COLLECTIVES = "TP {tp}: vLLM all-reduces o_proj and the routed latent inside segments b and c"
TP_SHAPES = "TP {tp}: the segments are built at TP {built} shapes"
DTYPE = "dtype {dtype}, the segments are bfloat16"


def layer_enabled(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(ENV_VAR, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class LayerVerdict:
    index: int
    kind: str  # mla | kda | "" (another attention)
    reason: str  # why the fused layer does not compute this layer's math


def _is_decoder_layer(module: Any) -> bool:
    return all(hasattr(module, a) for a in ("self_attn", "is_moe_layer", "input_layernorm"))


def verdict(layer: Any, index: int, tp: int, dtype: Any, bf16: Any) -> LayerVerdict:
    """The first reason (in the order of the module docstring) the fused layer cannot serve
    vLLM's decoder layer `layer` at TP `tp`. Every (AttnRes, TP) has one, on purpose: a layer
    whose math the segments match needs a route that does not exist yet."""
    kind = ATTENTION_KINDS.get(type(layer.self_attn).__name__, "")
    if dtype != bf16:
        reason = DTYPE.format(dtype=dtype)
    elif not layer.is_moe_layer:
        reason = NOT_MOE
    elif not kind:
        reason = OTHER_ATTENTION
    elif getattr(layer, "use_attn_res", False):
        reason = ATTN_RES
    elif tp > 1:
        reason = TP_COLLECTIVES.format(tp=tp)
    else:  # TP 1: the only TP without collectives is not the TP the segments are built at
        reason = TP_SHAPES.format(tp=tp, built=BUILT_TP)
    return LayerVerdict(index, kind, reason)


@dataclass
class LayerReport:
    verdicts: list[LayerVerdict] = field(default_factory=list)

    def line(self) -> str:
        n = len(self.verdicts)
        if not n:
            return "kimictl layer: no K3 decoder layers in this model; vLLM's forward"
        why = Counter(v.reason for v in self.verdicts)
        parts = "; ".join(f"{c} layer{'s' * (c != 1)}: {r}" for r, c in why.most_common())
        return f"kimictl layer: installed on 0 of {n} decoder layers, vLLM's forward ({parts})"


def layer_report(module: Any, tp: int, dtype: Any, bf16: Any) -> LayerReport:
    """One verdict per vLLM decoder layer under `module` (the model vLLM's install hook gets)."""
    report = LayerReport()
    layers = [c for c in module.modules() if _is_decoder_layer(c)]
    for i, layer in enumerate(layers):
        report.verdicts.append(verdict(layer, int(getattr(layer, "layer_idx", i)), tp, dtype, bf16))
    return report
