"""The dense part of one Kimi K3 decode layer, per GPU, as vLLM 0.33.0's stock forward runs it.

"Dense part" = every op of a MoE decode layer that is neither the attention core nor the routed
experts. Shapes are derived here from `K3_SHAPES` (the one table of K3's dimensions)
and the tensor-parallel size; each op names the vLLM source line that runs it and the line that
builds its module, relative to `VLLM_K3`. lab/tests/test_layer_ops.py checks both lines and every
GEMM shape against the vLLM wheel, so this list cannot drift from vLLM silently.

What the stock forward does that this list leaves out, on purpose:
- tensor-parallel collectives (o_proj's all-reduce; the latent + shared all-reduce that
  LatentMoERunner merges into one): a one-GPU benchmark has none;
- vLLM's side streams (the MLA gate GEMM and the MoE latent down-projection run on an aux stream
  at small M): the list is the op sequence, not the schedule;
- AttnRes: with `attn_res_block_size` set (the K3 checkpoint; the specialized decode always
  prepares it) `attn_res()` (model.py:850/883) replaces the two fused add + RMSNorm ops by a
  block-weighted sum over the layer's residual blocks, then the same RMSNorm. The list keeps the
  plain fused add + RMSNorm the model runs without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimictl.deployment.k3 import K3_SHAPES

__all__ = ["KINDS", "VLLM_K3", "DenseOp", "dense_layer_ops"]

VLLM_K3 = "vllm/models/kimi_k3/nvidia/"
KINDS = ("mla", "kda")
# vLLM pads the KDA packed projection's per-rank rows to a multiple of this (kda.py:650)
KDA_IN_ALIGN = 16


@dataclass(frozen=True)
class DenseOp:
    """One op of the layer. kind: add_rmsnorm (residual += x; x = norm(residual)), rmsnorm,
    gemm (y[M, n] = x[M, k] @ w[n, k]^T, bf16 weight), sigmoid_mul, situ_mul, or standin (the
    attention core / routed experts the benchmark replaces by a fixed-cost identity)."""

    name: str
    kind: str
    k: int  # input width per token
    n: int  # output width per token
    call: str  # "file.py:line" (under VLLM_K3) of the forward call
    call_text: str  # text on that line
    built: str = ""  # "file.py:line" where the module is constructed ("" for plain functions)
    built_text: str = ""
    vllm_name: str = ""  # vLLM's label for the projection (its low-latency GEMM tables)
    fp32_out: bool = False  # the router's logits are fp32 (GateLinear out_dtype)
    residual: bool = False  # the output is added into a running sum (addmm_ epilogue)
    note: str = ""


def _attention_ops(kind: str, tp: int) -> list[DenseOp]:
    s, h = K3_SHAPES, K3_SHAPES["hidden_size"]
    if kind == "mla":
        heads = s["mla_heads"] // tp
        lat = s["q_lora_rank"] + s["kv_lora_rank"] + s["qk_rope_head_dim"]
        v = heads * s["v_head_dim"]
        qk = heads * (s["qk_nope_head_dim"] + s["qk_rope_head_dim"])
        # fmt: off
        return [
            DenseOp("qkv_a_g", "gemm", h, lat + v, "mla.py:582",
                    "qkv_lora, gate = qkv_a_proj(hidden_states)[0].split(",
                    "mla.py:222", "self.fused_qkv_a_g_proj = KimiK3MergedQKVGateLinear(",
                    "fused_qkv_a_proj/mla_g_proj",
                    note=f"q_a {s['q_lora_rank']}, kv_a+rope "
                    f"{s['kv_lora_rank'] + s['qk_rope_head_dim']} (both replicated), gate {v}"),
            DenseOp("q_kv_a_norm", "rmsnorm", s["q_lora_rank"] + s["kv_lora_rank"],
                    s["q_lora_rank"] + s["kv_lora_rank"], "mla.py:528",
                    "q_c, kv_c_normed = fused_q_kv_rmsnorm(", "mla.py:252",
                    "self.q_a_layernorm = RMSNorm(self.q_lora_rank",
                    note="q_a_layernorm (q_lora_rank) and kv_a_layernorm (kv_lora_rank), one call"),
            DenseOp("q_b", "gemm", s["q_lora_rank"], qk, "mla.py:535",
                    "q = self.q_b_proj(q_c)[0]", "mla.py:253",
                    "self.q_b_proj = ColumnParallelLinear(", "q_b_proj"),
            DenseOp("attention_core", "standin", qk, v, "mla.py:542",
                    "self._attention(positions, q, kv_c_normed",
                    note="MLA core (kv_b absorbed, RoPE, cache write): not dense"),
            DenseOp("out_gate", "sigmoid_mul", v, v, "mla.py:630",
                    "attn_out = _gate_sigmoid_mul(attn_out, gate)"),
            DenseOp("o_proj", "gemm", v, h, "mla.py:635", "return self.o_proj(attn_out)[0]",
                    "mla.py:297", "self.o_proj = RowParallelLinear(", "o_proj",
                    note="RowParallel: TP all-reduce follows"),
        ]
        # fmt: on
    heads = s["kda_heads"] // tp
    d = s["kda_head_dim"]
    proj = heads * d
    packed = 4 * proj + d + heads  # q k v, g, f_a, beta
    packed += -packed % KDA_IN_ALIGN
    # fmt: off
    return [
        DenseOp("kda_in", "gemm", h, packed, "kda.py:942",
                "projected_qkvgfab = self.in_proj_qkvgfab(hidden_states)[0]", "kda.py:653",
                "self.in_proj_qkvgfab = _KimiGDNMergedColumnParallelLinear(", "in_proj_qkvgfab",
                note=f"q k v {3 * proj}, g {proj}, f_a {d}, beta {heads}, pad to {KDA_IN_ALIGN}"),
        DenseOp("f_b", "gemm", d, proj, "kda.py:953", "g1 = self.f_b_proj(f_a)[0]",
                "kda.py:664", "self.f_b_proj = ColumnParallelLinear(", "f_b_proj"),
        DenseOp("attention_core", "standin", 4 * proj + heads, proj, "kda.py:963",
                "self._forward(",
                note="short conv, KDA recurrence and the gated o_norm: not dense"),
        DenseOp("o_proj", "gemm", proj, h, "kda.py:973",
                "return self.o_proj(core_attn_out)[0]", "kda.py:878",
                "self.o_proj = RowParallelLinear(", "o_proj",
                note="RowParallel: TP all-reduce follows"),
    ]
    # fmt: on


def _moe_ops(tp: int) -> list[DenseOp]:
    s, h = K3_SHAPES, K3_SHAPES["hidden_size"]
    lat = s["latent_moe_width"]
    inter = s["moe_intermediate_size"] * s["num_shared_experts"] // tp
    # fmt: off
    return [
        DenseOp("router", "gemm", h, s["num_experts"], "model.py:611",
                "router_logits, _ = self.gate(hidden_states)", "model.py:437",
                "self.gate = GateLinear(", "gate", fp32_out=True, note="replicated, fp32 logits"),
        DenseOp("latent_down", "gemm", h, lat, "model.py:634", "lambda: down_proj(hidden_states)",
                "model.py:477", "self.routed_expert_down_proj = ReplicatedLinear(",
                "routed_expert_down_proj", note="replicated"),
        DenseOp("routed_experts", "standin", lat, lat, "model.py:675",
                "final_hidden_states = self.experts(",
                note="top-16 of 896 routing + MXFP4 experts: not dense"),
        DenseOp("shared_gate_up", "gemm", h, 2 * inter, "model.py:295",
                "gate_up, _ = self.gate_up_proj(x)", "model.py:241",
                "self.gate_up_proj = MergedColumnParallelLinear(", "shared_gate_up_proj"),
        DenseOp("shared_act", "situ_mul", 2 * inter, inter, "model.py:296",
                "x = self.act_fn(gate_up)", "model.py:278", "self.act_fn = SituAndMul(",
                note="SiTU: beta*tanh(g/beta)*sigmoid(g) * lb*tanh(u/lb)"),
        DenseOp("shared_down", "gemm", inter, h, "model.py:301", "x, _ = self.down_proj(x)",
                "model.py:249", "self.down_proj = RowParallelLinear(", "shared_down_proj",
                note="reduce_results=False: reduced with the latent in one all-reduce"),
        DenseOp("latent_norm", "rmsnorm", lat, lat, "model.py:332",
                "hidden_states = self.norm(hidden_states)", "model.py:485",
                "RMSNorm(self.moe_hidden_size, eps=config.rms_norm_eps)"),
        DenseOp("latent_up", "gemm", lat, h, "model.py:336",
                "return residual.addmm_(hidden_states, self.up_proj.weight.t())",
                "model.py:494", "self.routed_expert_up_proj = ReplicatedLinear(",
                "routed_expert_up_proj", residual=True,
                note="replicated; adds into the shared expert's output"),
    ]
    # fmt: on


def dense_layer_ops(kind: str, tp: int = 8) -> tuple[DenseOp, ...]:
    """The op sequence of one MoE decode layer (`kind` "mla" or "kda") on one of `tp` GPUs."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    h = K3_SHAPES["hidden_size"]
    # fmt: off
    norm_in = DenseOp("input_norm", "add_rmsnorm", h, h, "model.py:845",
                      "hidden_states, residual = self.input_layernorm(hidden_states, residual)",
                      "model.py:791", "self.input_layernorm = RMSNorm(config.hidden_size")
    norm_post = DenseOp("post_attention_norm", "add_rmsnorm", h, h, "model.py:871",
                        "hidden_states, residual = self.post_attention_layernorm(",
                        "model.py:792", "self.post_attention_layernorm = RMSNorm(")
    # fmt: on
    return (norm_in, *_attention_ops(kind, tp), norm_post, *_moe_ops(tp))
