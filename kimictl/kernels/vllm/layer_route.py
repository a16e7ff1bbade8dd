"""`[serve] kimictl_layer = true` (KIMICTL_VLLM_LAYER=1): the fused front segment
(kimictl.kernels.layer.chain, segment f) serves the start of vLLM 0.33's K3 attention.

vLLM's K3 decoder layer runs, per GPU: AttnRes (or add + RMSNorm) -> the attention's projections
and norms -> the attention core -> o_proj and its TP all-reduce -> AttnRes -> the MoE, whose
routed latent and shared output are all-reduced. Segment f is the only fused segment no
collective or AttnRes cuts: it starts from the normed input the attention gets and ends where the
attention core starts. It replaces, where it measured faster than vLLM's plan (SERVED: MLA at
M = 1 and 2):
- MLA: fused_qkv_a_g_proj (q_a | kv_a + rope | gate), fused_q_kv_rmsnorm and q_b_proj: vLLM's
  `_forward_q_lora` (both its forms: the gate on vLLM's aux stream, or with qkv_a) becomes one
  launch, then vLLM's own `_attention` with the same tensors;
- KDA (built, verified and routable, not in SERVED: it measured no faster): in_proj_qkvgfab and
  f_b_proj (vLLM's two-stream projection overlap under capture, two GEMMs in eager steps): vLLM's
  own `forward` runs with the two projections answered from the one launch (`_Front.answer`),
  its overlap held off for that call.
Everything else keeps vLLM's forward: other M, another dtype or shape (TP other than 8: the
segments are built at TP 8 shapes), quantized weights, non-contiguous input, a layer with
another attention. Segments b and c are not routed: AttnRes and the TP all-reduces of o_proj and
of the routed latent fall inside them (LAYER_FACTS, checked against the wheel and run by
tests/test_vllm_layer_route.py).

The segment reads its weights as one flat buffer: at install (vLLM's install hook runs in the
model's constructor, before the weights load) each front parameter becomes a view into the
layer's buffer, so vLLM's loaders write into it in place and no weight is held twice.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from kimictl.deployment.spec import LAYER_ENV_VAR
from kimictl.kernels.layer.chain import BUILT_TP

__all__ = [
    "ATTENTION_KINDS",
    "ENV_VAR",
    "FRONT_PARAMS",
    "LAYER_FACTS",
    "LayerReport",
    "LayerVerdict",
    "SERVED",
    "front_variants",
    "install",
    "layer_enabled",
    "verdict",
]

ENV_VAR = LAYER_ENV_VAR
SEGMENT = "f"
# (kind, M) where segment f measured faster than vLLM's own path, inside vLLM's attention code on
# the H200 (lab/bench/layer_front_h200.sh; tests/fixtures/kernels/layer_front_h200.json): MLA
# 0.908x / 0.949x vLLM's SM90 plan at M = 1 / 2, four launches become one. KDA measured 1.078x /
# 0.998x: vLLM runs its packed projection and a 0.4 MB f_b back to back, and the grid barrier
# before f_b costs what the saved launch gains, so KDA keeps vLLM's forward.
SERVED = frozenset({("mla", 1), ("mla", 2)})
# vLLM's attention classes (model.py builds one per layer) and the fused layer's kind for each
ATTENTION_KINDS = {"MultiHeadLatentAttention": "mla", "KimiK3DeltaAttention": "kda"}
# the parameters segment f reads, in the order of its flat weight buffer (chain.segment "f")
FRONT_PARAMS = {
    "mla": ("fused_qkv_a_g_proj.weight", "q_a_layernorm.weight", "kv_a_layernorm.weight",
            "q_b_proj.weight"),
    "kda": ("in_proj_qkvgfab.weight", "f_b_proj.weight"),
}  # fmt: skip
# (file in the vllm 0.33.0 wheel, line, text on it). tests/test_vllm_layer_route.py checks each
# line against the wheel and runs the code around it.
_K3, _LINEAR = "vllm/models/kimi_k3/nvidia/", "vllm/model_executor/layers/linear.py"
LAYER_FACTS = (
    # what the route replaces and calls
    (_K3 + "mla.py", 627, "attn_out, gate = self._forward_q_lora(positions, hidden_states)"),
    (
        _K3 + "mla.py",
        614,
        "self._attention(positions, q, kv_c_normed, k_pe.unsqueeze(1), attn_out)",
    ),
    (_K3 + "kda.py", 920, "0 < num_tokens <= self._projection_overlap_max_tokens"),
    (_K3 + "kda.py", 942, "projected_qkvgfab = self.in_proj_qkvgfab(hidden_states)[0]"),
    (_K3 + "kda.py", 953, "g1 = self.f_b_proj(f_a)[0]"),
    # why segments a, b and c are not routed
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

OTHER_ATTENTION = "an attention the fused layer is not built for"
NO_GATE = "MLA without q-LoRA and the output gate (not segment f's projections)"
SHAPES = "TP {tp}: the attention's shapes are not the TP {built} shapes segment f is built at"
QUANTIZED = "quantized front weights (segment f reads bfloat16)"
DTYPE = "dtype {dtype}, the segments are bfloat16"
NO_BUILD = "no layer build for this GPU"
NOT_FASTER = "segment f measured no faster than vLLM's plan for {kind} at any M it is built for"
REST = ("AttnRes, o_proj + all-reduce and the MoE stay vLLM's: collectives and AttnRes cut "
        "segments b and c")  # fmt: skip


def layer_enabled(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(ENV_VAR, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def front_variants(names: list[str] | tuple[str, ...]) -> dict[tuple[str, int], str]:
    """{(kind, M): variant} of segment f among a layer build's kernel `names` (its manifest)."""
    from kimictl.kernels.layer.chain import CHAIN_SHIPPED

    have = set(names)
    return {(c.layer, c.m): c.name for c in CHAIN_SHIPPED if c.seg == SEGMENT and c.name in have}


@dataclass(frozen=True)
class LayerVerdict:
    index: int
    kind: str  # mla | kda | "" (another attention)
    reason: str  # "" when segment f serves this layer's attention front


def _is_decoder_layer(module: Any) -> bool:
    return all(hasattr(module, a) for a in ("self_attn", "is_moe_layer", "input_layernorm"))


def _param(module: Any, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part, None)
    return module


def _expected_shapes(kind: str) -> list[tuple[int, ...]]:
    """The shapes of FRONT_PARAMS[kind] segment f is built at (TP 8, from chain.segment)."""
    from kimictl.kernels.layer.chain import segment

    s1, s2 = segment(kind, SEGMENT, 1)[0]
    if kind == "mla":
        return [(s1.n, s1.k), (s2.k,), (s2.side[1],), (s2.n, s2.k)]
    return [(s1.n, s1.k), (s2.n, s2.k)]


def verdict(layer: Any, index: int, tp: int, dtype: Any, bf16: Any) -> LayerVerdict:
    """Whether segment f serves the attention of vLLM's decoder layer `layer`, and if not the
    first reason it does not."""
    attn = layer.self_attn
    kind = ATTENTION_KINDS.get(type(attn).__name__, "")
    params = [_param(attn, p) for p in FRONT_PARAMS.get(kind, ())]
    if dtype != bf16:
        reason = DTYPE.format(dtype=dtype)
    elif not kind:
        reason = OTHER_ATTENTION
    elif any(p is None for p in params):
        reason = NO_GATE
    elif any(p.dtype != bf16 for p in params):
        reason = QUANTIZED
    elif [tuple(p.shape) for p in params] != _expected_shapes(kind):
        reason = SHAPES.format(tp=tp, built=BUILT_TP)
    else:
        reason = ""
    return LayerVerdict(index, kind, reason)


@dataclass
class LayerReport:
    verdicts: list[LayerVerdict] = field(default_factory=list)
    ms: tuple[int, ...] = ()
    skipped: str = ""  # why no layer was looked at (no build)

    @property
    def served(self) -> int:
        return sum(not v.reason for v in self.verdicts)

    def line(self) -> str:
        n = len(self.verdicts)
        if self.skipped:
            return f"kimictl layer: not installed ({self.skipped}); vLLM's forward"
        if not n:
            return "kimictl layer: no K3 decoder layers in this model; vLLM's forward"
        served = Counter(v.kind.upper() for v in self.verdicts if not v.reason)
        kinds = ", ".join(f"{k} {c}" for k, c in sorted(served.items()))
        head = (
            f"kimictl layer: segment f on {sum(served.values())} of {n} decoder layers"
            + (f" ({kinds})" if kinds else "")
            + f" at M = {', '.join(map(str, self.ms))}: the attention's projections and norms "
            f"before its core as one kernel; {REST}"
        )
        why = Counter(v.reason for v in self.verdicts if v.reason)
        if not why:
            return head
        parts = "; ".join(f"{c} layer{'s' * (c != 1)}: {r}" for r, c in why.most_common())
        return f"{head}; vLLM's forward on the rest ({parts})"


def _pack(params: list[Any], counter: int, torch: Any) -> Any:
    """One flat buffer holding `params` back to back and a zeroed barrier word; each parameter
    becomes a view into it (its values kept), so loaders that copy in place fill the buffer."""
    total = sum(p.numel() for p in params) + counter
    flat = torch.empty(total, dtype=params[0].dtype, device=params[0].device)
    off = 0
    for p in params:
        view = flat[off : off + p.numel()].view(p.shape)
        view.copy_(p.data)
        p.data = view
        off += p.numel()
    flat[off:].zero_()
    return flat


def _servable(x: Any, flat: Any, bf16: Any) -> bool:
    return x.dim() == 2 and x.dtype == bf16 and x.is_contiguous() and x.device == flat.device


@dataclass
class _Front:
    """One attention's route: its flat weights, the variant per M, the op."""

    attn: Any
    kind: str
    flat: Any
    variants: dict[int, str]
    op: Callable[[Any, Any, str], Any]
    bf16: Any
    pending: dict[str, Any] = field(default_factory=dict)  # KDA: this call's answers
    stages: dict[int, Any] = field(init=False)  # M -> segment f's two stages

    def __post_init__(self) -> None:  # once here, not in every decode step's forward
        from kimictl.kernels.layer.chain import segment

        self.stages = {m: segment(self.kind, SEGMENT, m)[0] for m in self.variants}

    def run(self, x: Any) -> tuple[Any, Any, Any] | None:
        """(y, stage 1, stage 2) of segment f on x, or None where vLLM's forward serves x."""
        m = int(x.shape[0])
        variant = self.variants.get(m)
        if variant is None or not _servable(x, self.flat, self.bf16):
            return None
        s1, s2 = self.stages[m]
        return self.op(x, self.flat, variant), s1, s2

    def mla_forward_q_lora(self, original: Callable[..., Any]) -> Callable[..., Any]:
        attn = self.attn

        def forward_q_lora(positions: Any, hidden_states: Any) -> Any:
            got = self.run(hidden_states)
            if got is None:
                return original(positions, hidden_states)
            y, s1, s2 = got
            m, n1 = hidden_states.shape[0], s1.n
            q_a, kv = s2.k, s2.side[1]
            lora = q_a + kv + attn.qk_rope_head_dim  # q_a | kv_a | rope, then the gate
            qkv = y[: m * n1].view(m, n1)
            q = y[s2.out[0] : s2.out[0] + m * s2.n].view(m, attn.num_local_heads, -1)
            kv_c_normed = y[s2.side[3] : s2.side[3] + m * kv].view(m, kv)
            attn_out = hidden_states.new_empty((m, n1 - lora))
            attn._attention(positions, q, kv_c_normed, qkv[:, q_a + kv : lora].unsqueeze(1),
                            attn_out)  # fmt: skip
            return attn_out, qkv[:, lora:]

        return forward_q_lora

    def kda_forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        attn = self.attn

        def forward(hidden_states: Any, positions: Any) -> Any:
            got = self.run(hidden_states)
            if got is None:
                return original(hidden_states, positions)
            y, s1, s2 = got
            m = hidden_states.shape[0]
            projected = y[: m * s1.n].view(m, s1.n)
            fa = s2.src[1]  # f_a's column in the packed projection
            self.pending.update(x=hidden_states, projected=projected,
                                f_a=projected[:, fa : fa + s2.k],
                                g1=y[s2.out[0] : s2.out[0] + m * s2.n].view(m, s2.n))  # fmt: skip
            overlap = attn._projection_overlap_max_tokens
            attn._projection_overlap_max_tokens = 0  # vLLM's two-stream form: not this call
            try:
                return original(hidden_states, positions)
            finally:
                attn._projection_overlap_max_tokens = overlap
                self.pending.clear()

        return forward

    def answer(self, module: Any, key: str, arg: str) -> Callable[..., Any]:
        """`module`'s forward, answering from this call's launch when vLLM passes the tensor
        the route expects (`arg`), else `module`'s own forward."""
        own = module.forward

        def forward(x: Any, *a: Any, **k: Any) -> Any:
            want = self.pending.get(arg)
            if (want is not None and not a and not k and x.data_ptr() == want.data_ptr()
                    and x.shape == want.shape and x.stride() == want.stride()):  # fmt: skip
                out = self.pending[key]
                return (out, None) if getattr(module, "return_bias", True) else out
            return own(x, *a, **k)

        return forward


def _install_front(layer: Any, kind: str, variants: dict[int, str], op: Any, torch: Any) -> None:
    from kimictl.kernels.layer.chain import COUNTER

    attn = layer.self_attn
    flat = _pack([_param(attn, p) for p in FRONT_PARAMS[kind]], COUNTER, torch)
    front = _Front(attn, kind, flat, variants, op, torch.bfloat16)
    attn._kimictl_front = front
    if kind == "mla":
        attn._forward_q_lora = front.mla_forward_q_lora(attn._forward_q_lora)
    else:
        attn.in_proj_qkvgfab.forward = front.answer(attn.in_proj_qkvgfab, "projected", "x")
        attn.f_b_proj.forward = front.answer(attn.f_b_proj, "g1", "f_a")
        attn.forward = front.kda_forward(attn.forward)


def install(
    module: Any,
    tp: int,
    dtype: Any,
    torch: Any,
    *,
    variants: dict[tuple[str, int], str] | None,
    op: Callable[[], Callable[[Any, Any, str], Any]],
    served: Collection[tuple[str, int]] = SERVED,
) -> LayerReport:
    """Route segment f into every decoder layer of `module` (the model vLLM's install hook gets)
    that it computes, at the (kind, M) of `served` (default: where it measured faster).
    `variants`: the layer build's segment f per (kind, M) (None: no build); `op()` gives the
    torch op that launches one (registered on first need)."""
    if not variants:
        return LayerReport(skipped=NO_BUILD if variants is None else "no segment f in the build")
    layers = [c for c in module.modules() if _is_decoder_layer(c)]
    built = variants
    variants = {p: name for p, name in variants.items() if p in served}
    report = LayerReport(ms=tuple(sorted({m for _, m in variants})))
    launch = None
    for i, layer in enumerate(layers):
        v = verdict(layer, int(getattr(layer, "layer_idx", i)), tp, dtype, torch.bfloat16)
        ms = {m: name for (k, m), name in variants.items() if k == v.kind}
        if not v.reason and not ms:
            why = (NOT_FASTER.format(kind=v.kind.upper()) if any(k == v.kind for k, _ in built)
                   else f"no {v.kind.upper()} segment f in the build")  # fmt: skip
            v = LayerVerdict(v.index, v.kind, why)
        if not v.reason:
            launch = launch or op()
            _install_front(layer, v.kind, ms, launch, torch)
        report.verdicts.append(v)
    return report
