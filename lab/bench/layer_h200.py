"""One device call: the dense part of a K3 decode layer on the H200, side by side.

The layer is `kimictl.kernels.layer.ops.dense_layer_ops(kind)` (MLA and KDA, per GPU at TP8): fused
add + RMSNorm, input projection(s) and their norms, attention core, output gate, o_proj,
post-attention add + RMSNorm, router (fp32 logits), MoE latent down, routed experts, shared expert
gate_up / SiTU*mul / down, latent RMSNorm, latent up + shared output. The attention core and the
routed experts are a fixed-cost identity (one opaque copy op, the same in every variant), so only
the dense part differs. No TP collectives (one GPU). Variants, every one torch.compile'd (inductor,
only M dynamic) and replayed as one CUDA graph:
- stock: torch ops, GEMMs through F.linear / addmm (cuBLAS);
- kimictl: the same, every projection through an opaque op launching kimictl's AOT kernel that
  the H200 dispatch table (tests/fixtures/kernels/bench_h200_table.json, measured on this GPU
  model) picks for that (N, K, M), or cuBLAS where the table says cuBLAS; PDL as built;
- kimictl_hfused: kimictl + two fusions: router, latent down and shared gate_up read the same
  normed x, so one GEMM over their concatenated weights replaces three launches (N = 6016, kernel
  chosen as the table's pick for the closest measured shape 6288x7168); o_proj adds the residual
  in its epilogue (the post-attention norm then has no add);
- stock_hfused: the horizontal fusion on cuBLAS, to separate the fusion from the kernels.
- kimictl_elem: kimictl_hfused with the elementwise ops (add + RMSNorm, RMSNorm, the MLA q/kv
  norms and sigmoid gate, SiTU * mul with the fp32 router logits) as kimictl PDL kernels
  (kimictl/kernels/layer/elem.py) instead of inductor's Triton kernels; kimictl_elemnorm (M <= 8):
  the same on kimictl_norm's folded-norm GEMMs; kimictl_elem_all: kimictl_elem with a kimictl
  kernel for every measured projection (all_variant), o_proj and latent_up in their faster
  non-residual form (o_proj's add in the add + RMSNorm kernel, latent_up's output shared_down's
  residual); kimictl_tuned: kimictl_elem_all's layer whose GEMM picks are searched in the layer
  itself, per (kind, M), before the timing rounds (dispatch.descend: each GEMM in turn tries the
  table's fastest kimictl kernels, the wgmma residual tiles of layer_res_configs() and
  cuBLAS, the whole layer graph timed for each; every candidate checked against fp64 first);
  kimictl_tuned_fold (M <= 16): the same search with MLA's sigmoid gate folded into o_proj's and
  SiTU * mul into shared_down's x loads (tcpro kernels), one or two elementwise launches fewer;
  kimictl_tuned_cat(fold): latent_up and shared_down as one GEMM over their concatenated K.
- _pdlsi twins (stock, vllm_plan, the cat layers): the same layers with the two stand-ins as
  layer_elem's PDL copy (same bytes) in place of torch's copy, so the kernels after a stand-in may
  launch early, as after the fast path's PDL attention and expert kernels; `_late`: the copy
  triggers its dependents at its end. A twin's `vs_best` holds it against the faster stand-in
  form of stock and of vLLM's plan.
- kimictl_chain_pdlsi (M = 1, 2, 4): the cat layer as three persistent kernels, one per part
  between the PDL stand-ins (kimictl/kernels/layer/chain.py); each segment on the (math, ring,
  slot) variant a child preflight timed fastest alone among those whose output matched fp64, the
  layer checked against fp64 there first.
Timing: one graph per (variant, M) chaining COPIES layer calls, each on its own weight copy (each
copy is 230-261 MB, the L2 is 60 MB), median replay / COPIES, variants interleaved over rounds.
Checks: each variant's single-layer output (and residual) vs an fp64 run of the same op sequence,
the graph replay bit-identical to the eager (compiled) call; kernel nodes counted in the captured
graph (cuGraphGetNodes).

Usage (GPU node): python lab/bench/layer_h200.py --build lab/_build_layer --out DIR
                  python lab/bench/layer_h200.py --smoke   (CPU: op sequence and reference only)
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never multicast on the lent machines
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

MS = (1, 2, 4, 8, 16, 32, 64)
EPS = 1e-6  # rms_norm_eps is the checkpoint's; 1e-6 here (any value: same in every variant)
COPIES = 4
TABLE = ROOT / "tests" / "fixtures" / "kernels" / "bench_h200_table.json"
TOL = 2e-2  # relative (Frobenius) error of a bf16 layer vs fp64 through ~10 rounded stages
COPY_CEILING_TBPS = 4.3
FRONT = ("router", "latent_down", "shared_gate_up")  # GEMMs that read the post-attention x
HFUSED_PROXY = (6288, 7168)  # measured shape whose kernel choice the N=6016 front GEMM takes
VARIANTS = (
    "stock",
    "vllm_plan",
    "kimictl",
    "kimictl_hfused",
    "stock_hfused",
    "kimictl_norm",
    "kimictl_elem",
    "kimictl_elemnorm",
    "kimictl_elem_all",
    "kimictl_tuned",
    "kimictl_tuned_fold",
    "kimictl_tuned_cat",
    "kimictl_tuned_catfold",
    "stock_pdlsi",
    "vllm_plan_pdlsi",
    "kimictl_tuned_cat_pdlsi",
    "kimictl_tuned_catfold_pdlsi",
    "kimictl_tuned_cat_pdlsi_late",
    "kimictl_chain_pdlsi",
)
# twins whose two stand-ins are layer_elem's PDL copy (same bytes) instead of torch's copy: in the
# PDL chain, as the attention and expert kernels of the fast path are, so the kernels after a
# stand-in may launch and stream weights while it runs; twin -> its layer (same ops; the tuned
# twins search their own picks in their own layer)
PDLSI = {v + "_pdlsi": v for v in ("stock", "vllm_plan", "kimictl_tuned_cat",
                                   "kimictl_tuned_catfold")}  # fmt: skip
# the same with the stand-ins' trigger at their end: the next kernels launch only as one ends
PDLSI["kimictl_tuned_cat_pdlsi_late"] = "kimictl_tuned_cat"
# variants whose GEMM picks are searched in the layer -> their plan-key tag
TUNED = {"kimictl_tuned": "@tuned", "kimictl_tuned_fold": "@tunedf", "kimictl_tuned_cat": "@tunedc",
         "kimictl_tuned_catfold": "@tunedcf", "kimictl_tuned_cat_pdlsi": "@tunedcp",
         "kimictl_tuned_catfold_pdlsi": "@tunedcfp", "kimictl_tuned_cat_pdlsi_late": "@tunedcpl"
         }  # fmt: skip
ELEM = ("kimictl_elem", "kimictl_elemnorm", "kimictl_elem_all", *TUNED)  # elementwise: kimictl
FOLD_MS = (1, 2, 4, 8, 16)  # Ms with tcpro builds (kimictl_tuned_fold runs at these M only)
FOLD_VARIANT = "kimictl_tuned_fold"
# the fold variant's GEMMs that take an elementwise op on their loads -> (tcpro op, kinds)
FOLDED = {"o_proj_gate": ("gate", ("mla",)), "shared_down_situ": ("situ", ("mla", "kda"))}
CAT_VARIANT = "kimictl_tuned_cat"
CATFOLD_VARIANT = "kimictl_tuned_catfold"  # cat with MLA's gate folded into o_proj (MLA only)
FOLDS = {FOLD_VARIANT: tuple(FOLDED), CATFOLD_VARIANT: ("o_proj_gate",)}  # variant -> its folds
FOLDS |= {twin: FOLDS[b] for twin, b in PDLSI.items() if b in FOLDS}  # a twin: its layer's folds
CATS = (CAT_VARIANT, CATFOLD_VARIANT, *(v for v, base in PDLSI.items() if base in
                                      (CAT_VARIANT, CATFOLD_VARIANT)))  # fmt: skip
# the cat variants run these two as one GEMM over their concatenated K (both write the hidden
# rows the layer sums), searched among the table's fastest at latent_up's point and the front's
CAT = ("latent_up", "shared_down")
CAT_OP = "latent_up_cat"
ALL = "@all"  # plan-key suffix of kimictl_elem_all's GEMMs (all_variant)
TUNE_TOP = 4  # kimictl_tuned tries the table's 4 fastest kimictl kernels per GEMM (and cuBLAS)
# git-ignored: vLLM 0.33.0's SM90 GEMMs built AOT from the wheel (a harness outside this repo)
KBENCH = ROOT / ".kbench"
NORM_MS = (1, 2, 4, 8)  # Ms with a wsnorm build (the wstream loop it extends serves M <= 8)
NORM_VARIANTS = ("kimictl_norm", "kimictl_elemnorm")  # wsnorm GEMMs: M in NORM_MS only
# the dense part as three persistent kernels, the stand-ins PDL copies
# (kimictl/kernels/layer/chain.py, lab/kernels/layer_chain.py): M in CHAIN_MS only; held against
# the faster stand-in form like the _pdlsi twins
CHAIN_VARIANT = "kimictl_chain_pdlsi"
STANDIN_PDL = (*PDLSI, CHAIN_VARIANT)


def ops_by_name(kind: str) -> dict[str, Any]:
    from kimictl.kernels.layer.ops import dense_layer_ops

    return {op.name: op for op in dense_layer_ops(kind)}


def make_weights(kind: str, gen: Any, device: Any) -> dict[str, Any]:
    import torch

    w: dict[str, Any] = {}
    for op in ops_by_name(kind).values():
        if op.kind == "gemm":
            t = torch.randn((op.n, op.k), generator=gen, device=device) * op.k**-0.5
            w[op.name] = t.to(torch.bfloat16)
        elif op.kind in ("rmsnorm", "add_rmsnorm"):
            w[op.name] = (1 + 0.1 * torch.randn((op.k,), generator=gen, device=device)).to(
                torch.bfloat16
            )
    w["front"] = torch.cat([w[n] for n in FRONT]).contiguous()  # the horizontal fusion's weight
    w[CAT_OP] = torch.cat([w[n] for n in CAT], 1).contiguous()  # [latent_up | shared_down] on K
    # RMSNorm weights folded into the GEMM that follows the norm (the wsnorm kernels)
    for name, norm in (("front", "post_attention_norm"), ("latent_up", "latent_norm")):
        w[name + "_g"] = (w[name].float() * w[norm].float()).to(torch.bfloat16)
    from lab.kernels.layer_chain import chain_weights

    w.update(chain_weights(kind, w))  # the chain segments' flat buffers (and barrier words)
    return w


def make_layer(kind: str, mm: Callable[..., Any], mm_res: Callable[..., Any],
               standin: Callable[..., Any], *, hfused: bool = False, o_res: bool = False,
               norm_fold: bool = False, split_gate: bool = False,
               elem: dict[str, Callable[..., Any]] | None = None, all_k: bool = False,
               plan_tag: str = ALL, fold: bool = False, cat: bool = False
               ) -> Callable[..., Any]:  # fmt: skip
    """The layer's op sequence on any dtype (bf16 for the variants, float64 for the reference).
    `elem` (with hfused and o_res): the elementwise ops as kimictl kernels (elem_torch's
    signatures); the shared expert then runs before the routed stand-in, so the kernels from the
    front GEMM to shared_down form one PDL chain. `fold` (with elem and all_k): two elementwise
    kernels move into the next GEMM's loads (tcpro): MLA's sigmoid gate into o_proj (the fused
    qkv_a/gate output as its r), SiTU * mul into shared_down (the front GEMM's output as its x).
    The routed stand-in then takes the router's logits as the front GEMM wrote them (bf16): the
    SiTU kernel's fp32 copy holds the same values, and only exists because the front GEMM
    computes the router in bf16. `cat` (with elem and all_k): latent_up and shared_down as one
    GEMM over their concatenated K, its x row [rms(routed) * w | SiTU * mul] from one elementwise
    kernel (rmssitu) after the routed stand-in, which takes the bf16 logits as with `fold`."""
    import torch

    from kimictl.deployment.k3 import K3_MOE_CONFIG, K3_SHAPES

    ops = ops_by_name(kind)
    beta = float(K3_MOE_CONFIG["activation_situ_beta"])  # type: ignore[arg-type]
    lbeta = float(K3_MOE_CONFIG["activation_situ_linear_beta"])  # type: ignore[arg-type]
    front_n = [ops[n].n for n in FRONT]
    tag = plan_tag if all_k else ""  # all_k (with elem, hfused): o_proj and latent_up without a
    # residual (their non-residual kimictl kernels measured faster at every M), the o_proj add
    # moves into the post-attention add + RMSNorm kernel, the latent_up output is shared_down's
    # residual; every GEMM's kernel from all_plan
    core_n = ops["attention_core"].n
    lat = ops["routed_experts"].n

    def up(x: Any) -> Any:  # fp32 math for bf16, fp64 stays fp64
        return x if x.dtype == torch.float64 else x.float()

    def rms(x: Any, w: Any) -> Any:
        xf = up(x)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * up(w)).to(x.dtype)

    def add_rms(x: Any, r: Any, w: Any) -> tuple[Any, Any]:
        r = (up(x) + up(r)).to(x.dtype)
        return rms(r, w), r

    def layer(h: Any, res: Any, w: dict[str, Any]) -> tuple[Any, Any]:
        if elem:
            x, res = elem["addrms"](h, res, w["input_norm"])
        else:
            x, res = add_rms(h, res, w["input_norm"])
        if kind == "mla":
            q_a, kv_a = K3_SHAPES["q_lora_rank"], K3_SHAPES["kv_lora_rank"]
            rope = K3_SHAPES["qk_rope_head_dim"]
            if split_gate:  # vLLM below 512 tokens: qkv_a and the gate as two GEMMs (mla.py:562)
                rows = q_a + kv_a + rope
                q_c, kv_c, k_pe = mm(x, w["qkv_a_g"][:rows], "qkv_a").split([q_a, kv_a, rope], -1)
                gate = mm(x, w["qkv_a_g"][rows:], "mla_g")
            else:
                y = mm(x, w["qkv_a_g"], "qkv_a_g" + tag)
                q_c, kv_c, k_pe, gate = y.split([q_a, kv_a, rope, core_n], -1)
            # one op in vLLM (fused_q_kv_rmsnorm); one weight per part here
            if elem:
                q_c, kv_c = elem["qkvnorm"](y, w["q_kv_a_norm"])
            else:
                q_c = rms(q_c, w["q_kv_a_norm"][:q_a])
                kv_c = rms(kv_c, w["q_kv_a_norm"][q_a:])
            q = mm(q_c, w["q_b"], "q_b" + tag)
            a = standin([q, kv_c, k_pe], core_n)
            if fold:
                gate_src = y  # o_proj reads the gate columns of the fused qkv_a/gate output
            elif elem:
                a = elem["gate"](a, y)
            else:
                a = (up(a) * torch.sigmoid(up(gate))).to(a.dtype)
        else:
            d = K3_SHAPES["kda_head_dim"]
            heads = core_n // d  # local KDA heads
            y = mm(x, w["kda_in"], "kda_in" + tag)
            qkv, g2, f_a, b = y.split([3 * core_n, core_n, d, heads, y.shape[-1]
                                       - 4 * core_n - d - heads], -1)[:4]  # fmt: skip
            g1 = mm(f_a, w["f_b"], "f_b" + tag)
            a = standin([qkv, g1, g2, b], core_n)
        if all_k and elem:  # o_proj plain, its add in the norm kernel (same launch count)
            if fold and kind == "mla":
                o = mm_res(a, w["o_proj"], gate_src, "o_proj_gate" + tag)
            else:
                o = mm(a, w["o_proj"], "o_proj" + tag)
            x2, res = elem["addrms"](o, res, w["post_attention_norm"])
        elif o_res:  # residual added in the o_proj epilogue; the norm has no add left
            res = mm_res(a, w["o_proj"], res, "o_proj")
            if norm_fold:
                x2 = res
            elif elem:
                x2 = elem["rms"](res, w["post_attention_norm"])
            else:
                x2 = rms(res, w["post_attention_norm"])
        else:
            x2, res = add_rms(mm(a, w["o_proj"], "o_proj"), res, w["post_attention_norm"])
        if norm_fold:  # the front GEMM normalizes x itself (weights hold the norm weight)
            f = mm(x2, w["front_g"], "front_norm")
            logits, latent, gu = f.split(front_n, -1)
        elif hfused:
            f = mm(x2, w["front"], "front" + tag)
            logits, latent, gu = f.split(front_n, -1)
        else:
            logits = mm(x2, w["router"], "router")
            latent = mm(x2, w["latent_down"], "latent_down")
            gu = mm(x2, w["shared_gate_up"], "shared_gate_up")
        if elem and cat:  # out = [rms(routed) | act] @ [latent_up | shared_down]^T: one GEMM
            routed = standin([latent, logits], lat)
            xc = elem["rmssitu"](routed, w["latent_norm"], f)
            return mm(xc, w[CAT_OP], CAT_OP + tag), res
        if elem and fold:  # shared_down computes SiTU * mul from f as it loads it
            act, s = f, None
            routed = standin([latent, logits], lat)
        elif elem:  # SiTU * mul and the fp32 logits in one kernel, then shared_down (PDL chain)
            act, logits32 = elem["situ"](f)
            s = None if all_k else mm(act, w["shared_down"], "shared_down")
            routed = standin([latent, logits32], lat)
        else:
            routed = standin([latent, up(logits)], lat)
            g, u = up(gu).chunk(2, -1)
            act = beta * torch.tanh(g / beta) * torch.sigmoid(g) * lbeta * torch.tanh(u / lbeta)
            s = mm(act.to(x.dtype), w["shared_down"], "shared_down")
        if all_k and elem:  # latent_up first (plain), then shared_down adds it in its epilogue
            lo = mm(elem["rms"](routed, w["latent_norm"]), w["latent_up"], "latent_up" + tag)
            down = "shared_down_situ" if fold else "shared_down"
            return mm_res(act, w["shared_down"], lo, down + tag), res
        if norm_fold:
            out = mm_res(routed, w["latent_up_g"], s, "latent_up_norm")
        elif elem:
            out = mm_res(elem["rms"](routed, w["latent_norm"]), w["latent_up"], s, "latent_up")
        else:
            out = mm_res(rms(routed, w["latent_norm"]), w["latent_up"], s, "latent_up")
        return out, res

    return layer


def ref_layer(kind: str) -> Callable[..., Any]:
    """The reference every variant is checked against (run in fp64): the op sequence with plain
    matmuls and the stand-in as a copy of its first input's leading columns."""
    return make_layer(kind, lambda x, w, op: x @ w.t(), lambda x, w, r, op: r + x @ w.t(),
                      lambda xs, width: xs[0][:, :width].clone())  # fmt: skip


def register_ops(lib: Any, plan: dict[tuple[str, int, bool], str]) -> tuple[Any, Any, Any]:
    """Opaque ops: the stand-in (a copy) and the kimictl GEMMs, whose variant is looked up at
    launch time by (op, M), so one compiled graph serves every M."""
    import torch
    import torch.nn.functional as F

    @torch.library.custom_op("layerbench::standin", mutates_args=(),
                             schema="(Tensor[] xs, int width) -> Tensor")  # fmt: skip
    def standin(xs: list[torch.Tensor], width: int) -> torch.Tensor:
        return xs[0][:, :width].clone()

    @standin.register_fake
    def _(xs: list[torch.Tensor], width: int) -> torch.Tensor:
        return xs[0].new_empty((xs[0].shape[0], width))

    def launch(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor | None, op: str) -> torch.Tensor:
        variant = plan.get((op, x.shape[0], r is not None), "cublas")
        if variant == "cublas":
            return F.linear(x, w) if r is None else torch.addmm(r, x, w.t())
        y = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
        if not variant.startswith("wgstride"):  # wgstride reads x at its own row stride
            x = x.contiguous()
        lib.launch(variant, x, w, y, y if r is None else r.contiguous())
        return y

    @torch.library.custom_op("layerbench::gemm", mutates_args=(),
                             schema="(Tensor x, Tensor w, str op) -> Tensor")  # fmt: skip
    def gemm(x: torch.Tensor, w: torch.Tensor, op: str) -> torch.Tensor:
        return launch(x, w, None, op)

    @gemm.register_fake
    def _(x: torch.Tensor, w: torch.Tensor, op: str) -> torch.Tensor:
        return x.new_empty((x.shape[0], w.shape[0]))

    @torch.library.custom_op("layerbench::gemm_res", mutates_args=(),
                             schema="(Tensor x, Tensor w, Tensor r, str op) -> Tensor")  # fmt: skip
    def gemm_res(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, op: str) -> torch.Tensor:
        return launch(x, w, r, op)

    @gemm_res.register_fake
    def _(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, op: str) -> torch.Tensor:
        return x.new_empty((x.shape[0], w.shape[0]))

    return standin, gemm, gemm_res


def elem_torch(kind: str) -> dict[str, Callable[..., Any]]:
    """The `elem` ops of make_layer in torch (CPU smoke): each variant's fp64 reference
    (layer_elem.elem_ref) on the same tensors the kernels get, rounded back to bf16."""

    from lab.kernels.layer_elem import elem_configs, elem_ref

    proto = {c.op + ("" if c.op not in ("rms", "copy") else str(c.width)): c
             for c in elem_configs((kind,), (1,)) if c.op != "copy" or not c.x_w}  # fmt: skip

    def run(key: str, x: Any, w: Any, r: Any) -> tuple[Any, Any]:
        cfg = proto[key]
        y, r2 = elem_ref(cfg, x.double(), None if w is None else w.double(),
                         None if r is None else r.double())  # fmt: skip
        return y.to(x.dtype), r2

    def addrms(h: Any, res: Any, w: Any) -> tuple[Any, Any]:
        y = run("addrms", h, w, res)[0].view(2, *h.shape)
        return y[0], y[1]

    def rms(x: Any, w: Any) -> Any:
        return run(f"rms{x.shape[1]}", x, w, None)[0].view(x.shape)

    def qkvnorm(y: Any, w: Any) -> tuple[Any, Any]:
        c, m = proto["qkvnorm"], y.shape[0]
        out = run("qkvnorm", y, w, None)[0]
        return out[: m * c.width].view(m, c.width), out[m * c.width :].view(m, c.seg2)

    def gate(a: Any, y: Any) -> Any:
        return run("gate", a, None, y)[0].view(a.shape)

    def situ(f: Any) -> tuple[Any, Any]:
        act, logits = run("situ", f, None, None)
        return act.view(f.shape[0], -1), logits.float()

    def rmssitu(x: Any, w: Any, f: Any) -> Any:
        return run("rmssitu", x, w, f)[0].view(x.shape[0], -1)

    def standin(xs: list[Any], width: int) -> Any:
        return run(f"copy{width}", xs[0][:, :width], None, None)[0].view(-1, width)

    return {"addrms": addrms, "rms": rms, "qkvnorm": qkvnorm, "gate": gate, "situ": situ,
            "rmssitu": rmssitu, "standin": standin}  # fmt: skip


def register_elem_ops(launch: Callable[..., None], kinds: tuple[str, ...], device: str = "cuda"
                      ) -> dict[str, Callable[..., Any]]:  # fmt: skip
    """Opaque ops launching the layer_elem kernels through `launch(name, x, w, y, r)` (the
    library's; the variant looked up by op, M and width at launch time, like the GEMMs);
    returns make_layer's `elem` dict."""
    import torch

    from lab.kernels.layer_elem import elem_configs

    cfgs = elem_configs(kinds)
    names = {(c.op, c.m, c.width): c.name for c in cfgs if c.op != "copy"}
    copies = {(c.m, c.width, c.x_w, c.late): c.name for c in cfgs if c.op == "copy"}
    by_op = {c.op: c for c in cfgs}
    situ_cfg, cat_cfg = by_op["situ"], by_op["rmssitu"]
    q_w, kv_w = (by_op["qkvnorm"].width, by_op["qkvnorm"].seg2) if "qkvnorm" in by_op else (0, 0)
    dummy = torch.zeros((1, 8), dtype=torch.bfloat16, device=device)

    def go(op: str, width: int, x: Any, w: Any, y: Any, r: Any) -> None:
        launch(names[(op, x.shape[0], width)], x.contiguous(), w, y, r)

    @torch.library.custom_op("layerbench::e_addrms", mutates_args=(),
                             schema="(Tensor h, Tensor r, Tensor w) -> Tensor")  # fmt: skip
    def e_addrms(h: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = h.new_empty((2 * h.shape[0], h.shape[1]))
        go("addrms", h.shape[1], h, w.view(1, -1), y, r.contiguous())
        return y

    @e_addrms.register_fake
    def _(h: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return h.new_empty((2 * h.shape[0], h.shape[1]))

    @torch.library.custom_op("layerbench::e_rms", mutates_args=(),
                             schema="(Tensor x, Tensor w) -> Tensor")  # fmt: skip
    def e_rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x.new_empty(x.shape)
        go("rms", x.shape[1], x, w.view(1, -1), y, dummy)
        return y

    @e_rms.register_fake
    def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape)

    @torch.library.custom_op("layerbench::e_qkvnorm", mutates_args=(),
                             schema="(Tensor y, Tensor w) -> Tensor")  # fmt: skip
    def e_qkvnorm(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = y.new_empty((y.shape[0] * w.shape[0],))
        go("qkvnorm", q_w, y, w.view(1, -1), out, dummy)
        return out

    @e_qkvnorm.register_fake
    def _(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return y.new_empty((y.shape[0] * w.shape[0],))

    @torch.library.custom_op("layerbench::e_gate", mutates_args=(),
                             schema="(Tensor a, Tensor y) -> Tensor")  # fmt: skip
    def e_gate(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = a.new_empty(a.shape)
        go("gate", a.shape[1], a, dummy, out, y.contiguous())
        return out

    @e_gate.register_fake
    def _(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return a.new_empty(a.shape)

    @torch.library.custom_op("layerbench::e_situ", mutates_args=(),
                             schema="(Tensor f) -> (Tensor, Tensor)")  # fmt: skip
    def e_situ(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        act = f.new_empty((f.shape[0], situ_cfg.width))
        logits = f.new_empty((f.shape[0], situ_cfg.aux_w), dtype=torch.float32)
        go("situ", situ_cfg.width, f, dummy, act, logits)
        return act, logits

    @e_situ.register_fake
    def _(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (f.new_empty((f.shape[0], situ_cfg.width)),
                f.new_empty((f.shape[0], situ_cfg.aux_w), dtype=torch.float32))  # fmt: skip

    @torch.library.custom_op("layerbench::e_rmssitu", mutates_args=(),
                             schema="(Tensor x, Tensor w, Tensor f) -> Tensor")  # fmt: skip
    def e_rmssitu(x: torch.Tensor, w: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        y = x.new_empty((x.shape[0], cat_cfg.width + cat_cfg.seg2))
        go("rmssitu", x.shape[1], x, w.view(1, -1), y, f.contiguous())
        return y

    @e_rmssitu.register_fake
    def _(x: torch.Tensor, w: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0], cat_cfg.width + cat_cfg.seg2))

    @torch.library.custom_op("layerbench::e_standin", mutates_args=(),
                             schema="(Tensor[] xs, int width, bool late) -> Tensor")  # fmt: skip
    def e_standin(xs: list[torch.Tensor], width: int, late: bool) -> torch.Tensor:
        x = xs[0]  # read at its own row stride (a slice of a fused GEMM's output) where built
        stride = x.stride(0) if x.stride(1) == 1 else -1
        name = copies.get((x.shape[0], width, 0 if stride == width else stride, late))
        if name is None:
            x, name = x[:, :width].contiguous(), copies[(x.shape[0], width, 0, late)]
        y = x.new_empty((x.shape[0], width))
        launch(name, x, dummy, y, dummy)
        return y

    @e_standin.register_fake
    def _(xs: list[torch.Tensor], width: int, late: bool) -> torch.Tensor:
        return xs[0].new_empty((xs[0].shape[0], width))

    def addrms(h: Any, res: Any, w: Any) -> tuple[Any, Any]:
        y = e_addrms(h, res, w).unflatten(0, (2, -1))
        return y[0], y[1]

    def qkvnorm(y: Any, w: Any) -> tuple[Any, Any]:
        m = y.shape[0]
        out = e_qkvnorm(y, w)
        return out[: m * q_w].view(m, q_w), out[m * q_w :].view(m, kv_w)

    return {"addrms": addrms, "rms": e_rms, "qkvnorm": qkvnorm, "gate": e_gate, "situ": e_situ,
            "rmssitu": e_rmssitu, "standin": lambda xs, width: e_standin(xs, width, False),
            "standin_late": lambda xs, width: e_standin(xs, width, True)}  # fmt: skip


def load_vllm_plan(art: Path, shim: Path, tmp: Path, manifest: str = "manifest.json"
                   ) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """Link vLLM 0.33.0's AOT skinny GEMMs and the driver shim that launches its dsv3_fused_a
    cubin (built from the wheel into .kbench by a harness outside this repo); return a launcher
    (x, w) -> y following vLLM's SM90 plan per (N, K, M), cuBLAS where the plan says cuBLAS or
    has no entry (vLLM's UnquantizedLinearMethod), and what was used."""
    import torch
    import torch.nn.functional as F

    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    tmp.mkdir(parents=True, exist_ok=True)
    skinny, drv_so = tmp / "libvllm_skinny.so", tmp / "libdrv.so"
    for argv in (
        ["g++", "-O2", "-shared", "-fPIC", "-o", str(skinny), str(art / "shim.cpp"),
         *map(str, sorted(art.glob("*.o"))), str(art / "libcuda_dialect_runtime_static.a"),
         f"-I{cuda / 'include'}", f"-I{art}", str(cuda / "lib64" / "libcudart_static.a"),
         "-ldl", "-lrt", "-lpthread"],
        ["g++", "-O2", "-shared", "-fPIC", "-o", str(drv_so), str(shim), f"-I{cuda / 'include'}",
         "-ldl"],
    ):  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"linking {Path(argv[4]).name} failed: {proc.stderr[-800:]}")
    man = json.loads((art / manifest).read_text())
    lib = ctypes.CDLL(str(skinny))
    if lib.load_all() != 0:
        raise RuntimeError("vLLM skinny load_all failed")
    drv = ctypes.CDLL(str(drv_so))
    drv.drv_init.restype = ctypes.c_int
    drv.fa_load.argtypes = [ctypes.c_void_p]
    drv.fa_get.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]  # fmt: skip
    drv.fa_launch.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 6 + [ctypes.c_void_p]
    if drv.drv_init() != 0:
        raise RuntimeError("driver shim init failed")
    image = (art / man["dsv3_cubin"]).read_bytes()
    buf = ctypes.create_string_buffer(image, len(image))
    if drv.fa_load(ctypes.cast(buf, ctypes.c_void_p)) != 0:
        raise RuntimeError("loading vLLM's dsv3_fused_a cubin failed")
    plan = {(r["n"], r["k"], r["m"]): r for r in man["plan"]}
    fns: dict[str, Any] = {}
    used: dict[str, str] = {}

    def skinny_fn(name: str) -> Any:
        if name not in fns:
            f = getattr(lib, "run_" + name)
            f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p]
            f.restype = ctypes.c_int
            fns[name] = f
        return fns[name]

    def dsv3_fn(inst: dict[str, Any]) -> Any:
        key = inst["symbol"]
        if key not in fns:
            fn, regs, mt = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
            if drv.fa_get(key.encode(), inst["smem"], ctypes.byref(fn), ctypes.byref(regs),
                          ctypes.byref(mt)) != 0:  # fmt: skip
                raise RuntimeError(f"fa_get {key} failed")
            fns[key] = fn.value
        return fns[key]

    def mm(x: Any, w: Any) -> Any:
        m, k = x.shape
        n = w.shape[0]
        r = plan.get((n, k, m))
        how = r["dispatch"] if r else "cublas"
        used[f"{n}x{k}/m{m}"] = how if how != "cute" else r["tbl"]  # type: ignore[index]
        if how == "cublas" or (how == "dsv3_fused_a" and not r["dsv3"]):  # type: ignore[index]
            return F.linear(x, w)
        x = x.contiguous()
        y = torch.empty((m, n), dtype=x.dtype, device=x.device)
        stream = torch.cuda.current_stream().cuda_stream
        if how == "cute":
            rc = skinny_fn(r["tbl"])(x.data_ptr(), w.data_ptr(), y.data_ptr(), m, n, k, stream)  # type: ignore[index]
        else:  # dsv3_fused_a: the public launcher's grid, PDL on as vLLM launches it
            inst = r["dsv3"]  # type: ignore[index]
            tn = inst["tile_n"]
            rc = drv.fa_launch(dsv3_fn(inst), y.data_ptr(), w.data_ptr(), x.data_ptr(), m,
                               x.stride(0), inst["gemm_m"] // inst["tile_m"], (m + tn - 1) // tn,
                               inst["smem"], 1, stream)  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"vLLM plan {how} at {n}x{k} M={m}: error {rc}")
        return y

    return mm, {"used": used, "buf": buf}


def plan_shapes(kind: str) -> dict[str, tuple[int, int]]:
    """GEMM op -> the (N, K) point of the dispatch table whose measurements choose its kernel."""
    ops = ops_by_name(kind)
    shapes = {name: (op.n, op.k) for name, op in ops.items() if op.kind == "gemm"}
    if "qkv_a_g" in shapes:  # table shape: vLLM's fused_qkv_a (the gate rides along)
        shapes["qkv_a_g"] = (2112, 7168)
    shapes["front"] = HFUSED_PROXY
    return shapes


def kernel_plan(kinds: tuple[str, ...]) -> dict[tuple[str, int, bool], str]:
    """(op, M, residual) -> the dispatch table's pick (a kimictl variant or "cublas")."""
    from kimictl.kernels.toolchain.dispatch import DispatchTable

    table = DispatchTable.load(TABLE)
    plan: dict[tuple[str, int, bool], str] = {}
    for kind in kinds:
        shapes = plan_shapes(kind)
        for name, (n, k) in shapes.items():
            for m in MS:
                for res in (False, True):
                    plan[(name, m, res)] = table.choose(n, k, m, residual=res).name
        for m in NORM_MS:
            plan[("front_norm", m, False)] = norm_variant(table, *HFUSED_PROXY, m, False)
            plan[("latent_up_norm", m, True)] = norm_variant(table, 7168, 3584, m, True)
        for name, (n, k) in shapes.items():  # kimictl_elem_all: one residual form per GEMM
            res = name == "shared_down"
            for m in MS:
                plan[(name + ALL, m, res)] = all_variant(table, n, k, m, res)
                for variant in TUNED:
                    plan[(name + tuned_tag(kind, variant), m, res)] = plan[(name + ALL, m, res)]
        for key, tiles in folded_points(kind):
            plan[key] = tiles[0]
        for variant in CATS:
            for m in MS:
                plan[(CAT_OP + tuned_tag(kind, variant), m, False)] = plan[(CAT[0] + ALL, m, False)]
    return plan


def folded_points(kind: str) -> Iterator[tuple[tuple[str, int, bool], list[str]]]:
    """(plan key, tcpro builds) of each folded GEMM the fold variants launch in `kind`."""
    for variant, folds in FOLDS.items():
        for op in folds:
            pro, op_kinds = FOLDED[op]
            for m in FOLD_MS if kind in op_kinds else ():
                yield (op + tuned_tag(kind, variant), m, True), pro_tiles(pro, m)


def pro_tiles(op: str, m: int) -> list[str]:
    """The tcpro builds of `op` at M (the fold variant's candidates for that GEMM; no other
    kernel computes it, so the search never tries cuBLAS or another family there)."""
    from lab.kernels.tcpro_gemm import pro_configs

    return [c.name for c in pro_configs() if c.op == op and c.m == m]


def layer_res_configs() -> tuple[Any, ...]:
    """The fused residual at M = 1..8 and 32 on wgmma, where the shipped set has none and the
    layer's residual GEMM (shared_down, 7168 x 768) ran on tcstream's residual tile at 1.6-1.9x
    the time of the plain wgmma one: the plain winners' tiles with the residual epilogue. Not
    shipped (defined here, so the shipped source hash stays); kimictl_tuned's candidates."""
    from kimictl.kernels.gemm.wgmma_gemm import WgmmaConfig

    plain = (WgmmaConfig(m, 1, 128, 4, 1, evict_first=m < 8, residual=True) for m in (1, 2, 4, 8))
    ring = ((2, 128, 12), (4, 128, 12), (8, 128, 12), (32, 128, 8))
    return (*plain, *(WgmmaConfig(m, 1, bk, st, 1, True, True, ws=True) for m, bk, st in ring))


def fb_tile(m: int) -> str:
    """KDA's f_b (1536 x 128) has no table point: kimictl_tuned tries wgmma's shipped plain tile
    at M (unsplit, fewest stages; TMA loads, so K = 128, one k tile, needs no K multiple). Its x
    is a 128-column slice of kda_in's output: contiguous at M = 1, copied at M >= 2 (the copy
    is in the layer it is timed in)."""
    from kimictl.kernels.gemm.wgmma_gemm import WGMMA_CONFIGS

    tiles = [c for c in WGMMA_CONFIGS if c.m == m and c.splits == 1 and not c.residual and c.pdl]
    return min(tiles, key=lambda c: (c.stages, -c.bk, c.name)).name


def tuned_tag(kind: str, variant: str = "kimictl_tuned") -> str:
    """Plan-key suffix of a tuned variant's GEMMs: per kind, since MLA and KDA share op names."""
    return f"{TUNED[variant]}-{kind}"


def tune_candidates(kinds: tuple[str, ...]) -> dict[tuple[str, int, bool], list[str]]:
    """The tuned variants' search space per plan key: its start (kimictl_elem_all's pick), then
    the table's TUNE_TOP fastest kimictl kernels at that point (PDL builds only), the residual
    tiles of layer_res_configs() at that M for the residual GEMM, and cuBLAS; for the fold
    variant's folded GEMMs (FOLDED), their tcpro builds only, and not the GEMMs they replace."""
    from kimictl.kernels.toolchain.dispatch import DispatchTable
    from lab.kernels.wgstride_gemm import stride_configs

    table = DispatchTable.load(TABLE)
    start = kernel_plan(kinds)
    res_tiles, stride_tiles = layer_res_configs(), stride_configs()
    out: dict[tuple[str, int, bool], list[str]] = {}
    for kind in kinds:
        for name, (n, k) in plan_shapes(kind).items():
            if name in FRONT:  # the tuned layer runs them as the one `front` GEMM
                continue
            res = name == "shared_down"
            for m in MS:
                names = fastest(table, (n, k), m, res)
                names += [c.name for c in res_tiles if res and c.m == m]
                if name == "f_b" and (n, k, m, res) not in table.measurements:  # wgmma plain
                    names.append(fb_tile(m))  # tile at M; at M >= 2 also at f_a's row stride
                    names += [c.name for c in stride_tiles if c.m == m]
                for variant in TUNED:
                    if variant in FOLDS and folded_away(name, kind, FOLDS[variant]):
                        continue
                    if variant in CATS and name in CAT:
                        if name == CAT[0]:  # the one GEMM (K 4352): latent_up's kernels (K 3584)
                            key = (CAT_OP + tuned_tag(kind, variant), m, False)  # and the
                            cat = fastest(table, HFUSED_PROXY, m, False)  # front's (K 7168)
                            out[key] = list(dict.fromkeys([start[key], *names, *cat, "cublas"]))
                        continue
                    key = (name + tuned_tag(kind, variant), m, res)
                    out[key] = list(dict.fromkeys([start[key], *names, "cublas"]))
        out.update(folded_points(kind))
    return out


def fastest(table: Any, nk: tuple[int, int], m: int, res: bool) -> list[str]:
    """The table's TUNE_TOP fastest kimictl kernels (PDL builds) at a point."""
    meas = table.measurements.get((*nk, m, res))
    timed = sorted((us, v) for v, us in (meas.kernels if meas else {}).items()
                   if us > 0 and "nopdl" not in v)  # fmt: skip
    return [v for _, v in timed[:TUNE_TOP]]


def folded_away(name: str, kind: str, folds: tuple[str, ...] = tuple(FOLDED)) -> bool:
    """Whether a variant with these folds (FOLDED keys) launches a folded GEMM in place of
    `name` in `kind`."""
    return any(op.rsplit("_", 1)[0] == name and kind in FOLDED[op][1] for op in folds)


def all_variant(table: Any, n: int, k: int, m: int, residual: bool) -> str:
    """kimictl_elem_all's kernel at a point: the table's pick where it is a kimictl kernel, else
    the fastest kimictl kernel measured there (within the table's families at that M) even
    though cuBLAS measured faster; cuBLAS only where no kimictl kernel was measured."""
    from kimictl.kernels.toolchain.dispatch import family_of

    pick = table.choose(n, k, m, residual=residual).name
    meas = table.measurements.get((n, k, m, residual))
    if pick != "cublas" or meas is None:
        return str(pick)
    allowed = table.families_ms.get(m)
    timed = {v: us for v, us in meas.kernels.items()
             if us > 0 and (allowed is None or family_of(v) in allowed)}  # fmt: skip
    return min(timed, key=lambda v: (timed[v], v)) if timed else "cublas"


def norm_variant(table: Any, n: int, k: int, m: int, residual: bool) -> str:
    """The wsnorm build of the wstream tile the table measured fastest at this point (wsnorm
    itself was never benched: it runs first here); (128, 7, 1) where nothing was measured."""
    from lab.kernels.wsnorm_gemm import NORM_CONFIGS, WsNormConfig

    tiles = {(c.threads, c.unroll, c.rows) for c in NORM_CONFIGS}
    meas = table.measurements.get((n, k, m, residual))
    best = (128, 7, 1)
    if meas is not None:
        timed = {}
        for name, us in meas.kernels.items():
            parts = name.split("_")
            if parts[0] != "wstream" or "nopdl" in parts or any(p.startswith("p") for p in parts):
                continue
            tile = (int(parts[2][1:]), int(parts[3][1:]), int(parts[4][1:]))
            if tile in tiles:
                timed[tile] = min(us, timed.get(tile, us))
        if timed:
            best = min(timed, key=lambda t: timed[t])
    return WsNormConfig(m, *best, residual=residual, early=True).name


def register_chain_op(launch: Callable[..., None], kinds: tuple[str, ...],
                      picks: dict[str, str] | None = None,
                      table: dict[tuple[str, str, int], Any] | None = None
                      ) -> Callable[..., Any]:  # fmt: skip
    """The opaque op launching one chain segment: (x, r, w, layer, seg) -> its flat Y, on the
    variant `picks` names for "layer/seg/m" (the first one where it names none). `table`, if
    given, is filled with the (layer, seg, m) -> config map the op reads at each call, so a caller
    can switch variants (the preflight's search in the layer)."""
    import torch

    from kimictl.kernels.layer.chain import CHAIN_SHIPPED
    from lab.kernels.layer_chain import chain_configs

    every = {c.name: c for c in (*chain_configs(kinds), *CHAIN_SHIPPED) if c.layer in kinds}
    cfgs: dict[tuple[str, str, int], Any] = {} if table is None else table
    for c in every.values():  # the first variant of each segment where `picks` names none
        cfgs.setdefault((c.layer, c.seg, c.m), c)
    for key, name in (picks or {}).items():
        layer, seg, m = key.split("/")
        cfgs[(layer, seg, int(m))] = every[name]
    per_token = {(c.layer, c.seg): c.sizes["y"] // c.m for c in cfgs.values()}

    schema = "(Tensor x, Tensor r, Tensor w, str layer, str seg) -> Tensor"

    @torch.library.custom_op("layerbench::chain", mutates_args=(), schema=schema)
    def chain(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, layer: str, seg: str
              ) -> torch.Tensor:  # fmt: skip
        cfg = cfgs[(layer, seg, x.shape[0])]
        y = x.new_empty((cfg.sizes["y"],))
        launch(cfg.name, x.contiguous(), w.view(1, -1), y, r.contiguous())
        return y

    @chain.register_fake
    def _(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, layer: str, seg: str
          ) -> torch.Tensor:  # fmt: skip
        return x.new_empty((x.shape[0] * per_token[(layer, seg)],))

    return chain


def make_chain_layer(kind: str, chain: Callable[..., Any], standin: Callable[..., Any]
                     ) -> Callable[..., Any]:  # fmt: skip
    """The layer as segments a, b, c with the stand-ins between them (layer/chain.py): the
    attention stand-in reads q (MLA) or the packed projection (KDA) at its row stride, the routed
    one the latent columns of the front GEMM's output."""
    from kimictl.kernels.layer.chain import segment

    ops = ops_by_name(kind)
    hid, core, lat = ops["input_norm"].k, ops["attention_core"].n, ops["routed_experts"].n
    router = ops["router"].n
    src = segment(kind, "a", 1)[0][1 if kind == "mla" else 0]  # the stage writing core's input
    src_off, src_w = src.out  # per token (M = 1): offsets scale with M
    front = segment(kind, "b", 1)[0][1].out[1]

    def layer(h: Any, res: Any, w: dict[str, Any]) -> tuple[Any, Any]:
        m = h.shape[0]
        ya = chain(h, res, w["chain_a"], kind, "a")
        a = standin([ya[m * src_off : m * (src_off + src_w)].view(m, src_w)], core)
        yb = chain(a, ya, w["chain_b"], kind, "b")
        f = yb[m * hid :].view(m, front)
        out = chain(standin([f[:, router : router + lat]], lat), yb, w["chain_c"], kind, "c")
        return out.view(m, hid), yb[: m * hid].view(m, hid)

    return layer


def graph_us(calls: list[Callable[[], Any]]) -> float:
    """us per call: `calls` captured in order in one CUDA graph on a side stream, the median of
    7 timed replays divided by their number."""
    import torch

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for call in calls:
            call()
    return replay_us(g, len(calls))


def replay_us(g: Any, n: int, replays: int = 7) -> float:
    """us per call of a captured graph of `n` calls: the median of `replays` timed replays."""
    import torch

    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n)
    return statistics.median(times)


def preflight_chain(build: Path, kinds: tuple[str, ...], shipped: bool = False) -> int:
    """Child process, three parts, one JSON line per result. First every chain variant, alone,
    in a CUDA graph of 10 back-to-back launches (PDL) on random inputs: its time, weight TB/s and
    its output vs its torch model in fp64 (only variants within TOL can be picked); the fastest
    per segment is the first pick. Then, per (kind, M), each segment's other variants in turn in
    the layer (6 layers on 3 weight copies in a graph), kept where the layer runs > 0.3 % faster.
    Then the layer on the picks, eager, three times (the barrier word must reopen each time) vs
    fp64. A segment whose grid barrier never opens hangs this child, not the main run (its
    timeout)."""
    import torch

    from kimictl.kernels.layer.chain import CHAIN_SHIPPED, COUNTER, SERVED_MS, segment_ref
    from kimictl.kernels.toolchain.harness import open_library
    from lab.kernels.layer_chain import CHAIN_MS, chain_configs

    lib = open_library(build / "sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(9)
    best: dict[str, tuple[float, str]] = {}
    sweep: list[dict[str, Any]] = []
    # --chain-shipped: only the shipped segments, no search: the picks are what ships
    cfgs = tuple(c for c in CHAIN_SHIPPED if c.layer in kinds) if shipped else chain_configs(kinds)
    chain_ms = SERVED_MS if shipped else CHAIN_MS
    for cfg in cfgs:
        sz = cfg.sizes
        x, r = (torch.randn(sz[b], generator=gen, device="cuda").to(torch.bfloat16)
                for b in ("x", "r"))  # fmt: skip
        w = (0.02 * torch.randn(sz["w"], generator=gen, device="cuda")).to(torch.bfloat16)
        w[-COUNTER:] = 0  # the barrier word
        y = torch.empty(sz["y"], device="cuda", dtype=torch.bfloat16)
        us = graph_us([functools.partial(lib.launch, cfg.name, x, w.view(1, -1), y, r)] * 10)
        # the segment's own output (the last launch of the replays) vs its torch model in fp64
        err = rel_err(y, segment_ref(cfg, x.double(), r.double(), w.double()))
        key = f"{cfg.layer}/{cfg.seg}/{cfg.m}"
        if err <= TOL:  # a variant that computes something else is never picked
            best[key] = min(best.get(key, (us, cfg.name)), (us, cfg.name))
        sweep.append({"sweep": cfg.name, "us": us, "tbps": 2e-6 * (sz["w"] - COUNTER) / us,
                      "rel_err": err})  # fmt: skip
        print(json.dumps(sweep[-1]), flush=True)
    picks = {key: name for key, (_, name) in best.items()}
    table: dict[tuple[str, str, int], Any] = {}
    chain = register_chain_op(lib.launch, kinds, picks, table)
    si = register_elem_ops(lib.launch, kinds)["standin"]
    # then each segment's variants in turn inside the layer, the other two fixed: alone, a segment
    # is timed after itself, in the layer after a stand-in (one pass; a change must gain > 0.3 %)
    every = {c.name: c for c in (*chain_configs(kinds), *cfgs)}
    ok_names = {r["sweep"] for r in sweep if r["rel_err"] <= TOL}
    for kind in kinds:
        fn = make_chain_layer(kind, chain, si)
        ws = [make_weights(kind, gen, "cuda") for _ in range(3)]  # 3 x 230-261 MB: past the L2
        for m in chain_ms:
            h = torch.randn((m, 7168), generator=gen, device="cuda").to(torch.bfloat16)
            res = torch.randn((m, 7168), generator=gen, device="cuda").to(torch.bfloat16)
            layer = [functools.partial(fn, h, res, ws[i % 3]) for i in range(6)]
            start = best_us = graph_us(layer)
            for seg in ("a", "b", "c"):
                key = f"{kind}/{seg}/{m}"
                if key not in picks:  # no variant of the segment matched fp64
                    continue
                for name in sorted(ok_names):
                    c = every[name]
                    if (c.layer, c.seg, c.m) != (kind, seg, m) or name == picks[key]:
                        continue
                    table[(kind, seg, m)] = c
                    us = graph_us(layer)
                    if us < best_us * 0.997:
                        best_us, picks[key] = us, name
                    table[(kind, seg, m)] = every[picks[key]]
            print(json.dumps({"search": f"{kind}/{m}", "us_alone_picks": start,
                              "us_layer_picks": best_us}), flush=True)  # fmt: skip
    print(json.dumps({"picks": picks}), flush=True)
    for kind in kinds:
        w = make_weights(kind, gen, "cuda")
        wref = {k: v.double() for k, v in w.items()}
        ref = ref_layer(kind)
        fn = make_chain_layer(kind, chain, si)
        for m in chain_ms:
            h = torch.randn((m, 7168), generator=gen, device="cuda").to(torch.bfloat16)
            res = torch.randn((m, 7168), generator=gen, device="cuda").to(torch.bfloat16)
            want = ref(h.double(), res.double(), wref)
            outs = [fn(h, res, w) for _ in range(3)]
            torch.cuda.synchronize()
            err = max(max(rel_err(o[0], want[0]), rel_err(o[1], want[1])) for o in outs)
            same = all(torch.equal(o[0], outs[0][0]) for o in outs)
            print(json.dumps({"kind": kind, "m": m, "rel_err": err, "repeat_equal": same,
                              "ok": err <= TOL and same}), flush=True)  # fmt: skip
    return 0


def make_build(out: Path, kinds: tuple[str, ...]) -> int:
    """CPU, before the device call: AOT-build every kernel the plan picks plus the wsnorm,
    layer_elem and layer_chain variants into `out` (objects whose source is unchanged are
    reused); sm_90a."""
    from kimictl.kernels.layer.chain import CHAIN_SHIPPED
    from kimictl.kernels.toolchain.build import ALL_CONFIGS, build
    from lab.kernels.families import ALL_FAMILIES, EXPERIMENTAL_CONFIGS
    from lab.kernels.layer_chain import chain_configs
    from lab.kernels.layer_elem import elem_configs
    from lab.kernels.tcpro_gemm import pro_configs
    from lab.kernels.wgstride_gemm import stride_configs
    from lab.kernels.wsnorm_gemm import NORM_CONFIGS

    names = {v for v in kernel_plan(kinds).values() if v != "cublas"}
    names |= {v for vs in tune_candidates(kinds).values() for v in vs if v != "cublas"}
    names |= {c.name for c in NORM_CONFIGS}  # the preflight runs every one
    # the search's segments and what ships (the routed segment f is no search's)
    chains = (*chain_configs(kinds), *(c for c in CHAIN_SHIPPED if c.layer in kinds))
    names |= {c.name for c in (*elem_configs(kinds), *chains)}
    every = (*ALL_CONFIGS, *EXPERIMENTAL_CONFIGS, *layer_res_configs(), *pro_configs(),
             *stride_configs(), *elem_configs(kinds), *chains)  # fmt: skip
    by_name = {c.name: c for c in every}
    missing = sorted(names - set(by_name))
    if missing:
        print(f"error: no config for {', '.join(missing)}", file=sys.stderr)
        return 1
    res = build("sm_90a", out, configs=[by_name[n] for n in sorted(names)], families=ALL_FAMILIES)
    # the layer family's hash, taken here: ast.dump differs between Python versions, so the device
    # (another Python) cannot recompute it
    mpath = res.out_dir / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["layer_source_hash"] = layer_source_hash()
    mpath.write_text(json.dumps(manifest, indent=1))
    print(f"built {len(res.kernels)} kernels ({res.reused} reused) in {res.seconds:.1f} s")
    return 0


def preflight_norm(build: Path) -> int:
    """Child process: every wsnorm variant once vs fp64, so a faulty new kernel cannot take the
    main run's CUDA context down with it. Exit 0 when all pass."""
    import torch

    from kimictl.kernels.toolchain.harness import open_library
    from lab.kernels.wsnorm_gemm import NORM_CONFIGS, wsnorm_gemm_ref

    lib = open_library(build / "sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(3)
    worst, unwritten = 0.0, 0
    for cfg in NORM_CONFIGS:
        for n, k in ((6016, 7168), (7168, 3584), (37, 1000)):
            x = (3 * torch.randn((cfg.m, k), generator=gen, device="cuda")).to(torch.bfloat16)
            w = (torch.randn((n, k), generator=gen, device="cuda") * k**-0.5).to(torch.bfloat16)
            r = torch.randn((cfg.m, n), generator=gen, device="cuda").to(torch.bfloat16)
            y = torch.full((cfg.m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            lib.launch(cfg.name, x, w, y, r if cfg.residual else y)
            torch.cuda.synchronize()
            ref = wsnorm_gemm_ref(x, w, r if cfg.residual else None)
            unwritten += int((~torch.isfinite(y)).sum())
            worst = max(worst, rel_err(y, ref))
    print(json.dumps({"variants": len(NORM_CONFIGS), "worst_rel_err": worst,
                      "unwritten": unwritten}))  # fmt: skip
    return 0 if worst <= 1e-2 and unwritten == 0 else 1


def new_kernel_checks() -> list[Any]:
    """The kernels the tuned variants may launch on paths no recorded verify covered: wgmma's
    residual epilogue at M = 1..8 and 32, wgmma at K = 128 (f_b), wgstride (x at a row stride)
    and tcpro; each with the layer's shape and a tail shape (N % 64, K % 128 != 0) where the
    op's input layout allows one."""
    from types import SimpleNamespace as NS

    from lab.kernels.tcpro_gemm import pro_configs
    from lab.kernels.wgstride_gemm import stride_configs

    out = [NS(name=c.name, m=c.m, op="res", shapes=((7168, 768), (100, 1000)))
           for c in layer_res_configs()]  # fmt: skip
    out += [NS(name=fb_tile(m), m=m, op="plain", shapes=((1536, 128),)) for m in MS]
    pro_shapes = {"gate": ((7168, 1536), (100, 1000)), "situ": ((7168, 768), (100, 768))}
    out += [NS(name=c.name, m=c.m, op=c.op, shapes=pro_shapes[c.op], cfg=c)
            for c in pro_configs()]  # fmt: skip
    out += [NS(name=c.name, m=c.m, op="stride", shapes=((1536, 128), (100, 136)), cfg=c)
            for c in stride_configs()]  # fmt: skip
    return out


def preflight_new(build: Path) -> int:
    """Child process: every kernel of new_kernel_checks() vs fp64, one JSON line each as it
    passes or fails, so a kernel that takes the CUDA context down costs only itself and the
    ones after it (the parent keeps the lines printed before)."""
    import torch

    from kimictl.kernels.toolchain.harness import open_library
    from lab.kernels.tcpro_gemm import pro_operand

    lib = open_library(build / "sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(7)
    f_a = 4 * ops_by_name("kda")["attention_core"].n  # f_a's column in kda_in's output (q k v g)
    for chk in new_kernel_checks():
        worst, unwritten = 0.0, 0
        for n, k in chk.shapes:
            x = torch.randn((chk.m, k), generator=gen, device="cuda").to(torch.bfloat16)
            w = (torch.randn((n, k), generator=gen, device="cuda") * k**-0.5).to(torch.bfloat16)
            y = torch.full((chk.m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            if chk.op == "stride":  # x: a slice of rows chk.cfg.x_stride apart (f_a in kda_in)
                wide = torch.randn((chk.m, chk.cfg.x_stride), generator=gen, device="cuda")
                x = wide.to(torch.bfloat16)[:, f_a : f_a + k]
                r = torch.randn((chk.m, n), generator=gen, device="cuda").to(torch.bfloat16)
                ref = x.double() @ w.double().T
            elif chk.op in ("gate", "situ"):  # the op's wide input: gate -> r, situ -> x
                wide = torch.randn((chk.m, chk.cfg.x_w), generator=gen, device="cuda")
                wide = (3 * wide).to(torch.bfloat16)
                if chk.op == "gate":
                    r = wide
                else:
                    x = wide
                    r = torch.randn((chk.m, n), generator=gen, device="cuda").to(torch.bfloat16)
                ref = pro_operand(chk.cfg, x, r, k).double() @ w.double().T
                ref = ref + (r.double() if chk.op == "situ" else 0)
            else:
                r = torch.randn((chk.m, n), generator=gen, device="cuda").to(torch.bfloat16)
                ref = x.double() @ w.double().T + (r.double() if chk.op == "res" else 0)
            lib.launch(chk.name, x, w, y, r if chk.op in ("res", "gate", "situ") else y)
            torch.cuda.synchronize()
            unwritten += int((~torch.isfinite(y)).sum())
            worst = max(worst, rel_err(y, ref))
        ok = worst <= 1e-2 and unwritten == 0
        print(json.dumps({"name": chk.name, "ok": ok, "worst_rel_err": worst,
                          "unwritten": unwritten}), flush=True)  # fmt: skip
    return 0


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects a preflight printed, one per line (anything else on stdout ignored)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def fold_ok(cands: dict[tuple[str, int, bool], list[str]], kind: str, m: int,
            variant: str = FOLD_VARIANT) -> bool:  # fmt: skip
    """A fold variant runs at (kind, M) only where every folded GEMM it launches has a tcpro
    build that passed its preflight (the cat-and-fold one: on MLA only, the gate its one fold)."""
    if PDLSI.get(variant, variant) == CATFOLD_VARIANT and kind != "mla":
        return False
    keys = [(op + tuned_tag(kind, variant), m, True)
            for op in FOLDS[variant] if kind in FOLDED[op][1]]  # fmt: skip
    return all(cands.get(key) for key in keys)


def preflight_elem(build: Path, kinds: tuple[str, ...]) -> int:
    """Child process: every layer_elem variant once vs fp64 (every output element written, the
    fp32 logits exact), so a faulty new kernel cannot take the main run down. Exit 0: all pass."""
    import torch

    from kimictl.kernels.toolchain.harness import open_library
    from lab.kernels.layer_elem import elem_configs, elem_ref, elem_tensors

    lib = open_library(build / "sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(5)
    worst, unwritten, logits_exact = 0.0, 0, True
    cfgs = elem_configs(kinds)
    for cfg in cfgs:
        x, w, y, r = elem_tensors(cfg, gen, "cuda")
        lib.launch(cfg.name, x, w, y, r)
        torch.cuda.synchronize()
        ref_y, ref_r = elem_ref(cfg, x.double(), w.double().flatten(), r.double())
        unwritten += int((~torch.isfinite(y)).sum())
        worst = max(worst, rel_err(y, ref_y))
        if ref_r is not None:
            logits_exact &= bool(torch.equal(r.double(), ref_r))
    print(json.dumps({"variants": len(cfgs), "worst_rel_err": worst, "unwritten": unwritten,
                      "logits_exact": logits_exact}))  # fmt: skip
    return 0 if worst <= 1e-2 and unwritten == 0 and logits_exact else 1


GEMM_MARKS = {  # kernel-name fragments -> group, first match wins (inductor's Triton kernel
    # names carry the ops they fuse, "gemm" included, so Triton is matched first)
    "triton": ("triton",),
    "kimictl_chain": ("layerchain",),
    "kimictl_elem": ("layerelem",),
    "kimictl_gemm": ("kimictl",),
    "vllm_gemm": ("vllm", "skinny", "fused_a_gemm"),
    "standin": ("memcpy",),
    "cublas_gemm": ("gemm", "gemv", "nvjet", "xmma", "cutlass", "splitk"),
}


def kernel_group(name: str) -> str:
    low = name.lower()
    for group, marks in GEMM_MARKS.items():
        if any(mark in low for mark in marks):
            return group
    return "other"


def profile_graph(graph: Any, copies: int, replays: int = 5) -> dict[str, Any]:
    """CUPTI kernel records of `replays` replays of a graph of `copies` layers: per group and per
    kernel name, device microseconds per layer, the kernel count per layer, and the span of the
    records (first start to last end) per layer. Span - busy = time no kernel ran (launch gaps,
    ramps); busy > span means kernels overlapped (PDL)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {"error": "no CUDA kernel records"}
    per = replays * copies
    groups: dict[str, float] = {}
    names: dict[str, list[float]] = {}
    for e in kernels:
        us = e.time_range.elapsed_us()
        groups[kernel_group(e.name)] = groups.get(kernel_group(e.name), 0.0) + us / per
        names.setdefault(e.name[:90], []).append(us)
    starts = [e.time_range.start for e in kernels]
    ends = [e.time_range.end for e in kernels]
    # the second layer copy of the last replay (the first follows the graph launch), in start
    # order: where the gaps between kernels are
    per_replay = len(kernels) // replays
    last = sorted(kernels, key=lambda e: e.time_range.start)[-per_replay:]
    one = last[len(last) // copies : 2 * len(last) // copies]
    t0 = one[0].time_range.start
    timeline = [[e.name[:90], round(e.time_range.start - t0, 2),
                 round(e.time_range.elapsed_us(), 2)] for e in one]  # fmt: skip
    return {
        "timeline": timeline,
        "kernels_per_layer": len(kernels) / per,
        "busy_us": sum(groups.values()),
        "span_us": (max(ends) - min(starts)) / per,
        "groups_us": {g: round(v, 2) for g, v in sorted(groups.items())},
        "by_name_us": {n: [round(sum(v) / per, 2), len(v) // per]
                       for n, v in sorted(names.items(), key=lambda kv: -sum(kv[1]))},
    }  # fmt: skip


def count_kernel_nodes(graph: Any) -> dict[str, int] | None:
    """Kernel and other nodes of a captured graph (keep_graph=True), via the driver API."""
    try:
        handle = ctypes.c_void_p(graph.raw_cuda_graph())
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_size_t(0)
        if cuda.cuGraphGetNodes(handle, None, ctypes.byref(n)) != 0:
            return None
        nodes = (ctypes.c_void_p * n.value)()
        if cuda.cuGraphGetNodes(handle, nodes, ctypes.byref(n)) != 0:
            return None
        kinds: dict[str, int] = {}
        names = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty"}
        for node in nodes:
            t = ctypes.c_int(-1)
            cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
            key = names.get(t.value, f"type{t.value}")
            kinds[key] = kinds.get(key, 0) + 1
        return kinds
    except Exception as exc:  # older torch: no raw_cuda_graph
        print(f"node count unavailable: {type(exc).__name__}: {exc}", flush=True)
        return None


def rel_err(got: Any, ref: Any) -> float:
    diff = got.double() - ref
    return float(diff.norm() / ref.norm().clamp_min(1e-30))


def smoke() -> int:
    """CPU: build both layers' op sequences and the fp64 reference at M=2 (no kernels, no GPU)."""
    import torch
    import torch.nn.functional as F

    from lab.kernels.tcpro_gemm import pro_configs, pro_operand

    def standin(xs: list[Any], width: int) -> Any:
        return xs[0][:, :width].clone()

    def normed(x: Any, op: str) -> Any:  # what a wsnorm kernel does to x before its GEMM
        if not op.endswith("_norm"):
            return x
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)

    def mm(x: Any, w: Any, op: str) -> Any:
        return F.linear(normed(x, op), w)

    def mm_res(x: Any, w: Any, r: Any, op: str) -> Any:
        pro = FOLDED.get(op.split("@")[0])
        if pro:  # what a tcpro kernel does (gate: r is the gate source; situ: x is the front's)
            cfg = next(c for c in pro_configs() if c.op == pro[0])
            y = pro_operand(cfg, x, r, w.shape[1]).float() @ w.float().T
            return (y if cfg.op == "gate" else y + r.float()).to(x.dtype)
        return torch.addmm(r, normed(x, op), w.t())

    gen = torch.Generator().manual_seed(0)
    for kind in ("mla", "kda"):
        w = make_weights(kind, gen, "cpu")
        h = torch.randn((2, 7168), generator=gen).to(torch.bfloat16)
        res = torch.randn((2, 7168), generator=gen).to(torch.bfloat16)
        ref = make_layer(kind, mm, mm_res, standin)(
            h.double(), res.double(), {k: v.double() for k, v in w.items()}
        )
        for label, hf, fold, split, el, al, gf, ct, pd in (
            ("plain", False, False, False, False, False, False, False, False),
            ("vllm", False, False, True, False, False, False, False, False),
            ("hfused", True, False, False, False, False, False, False, False),
            ("norm", True, True, False, False, False, False, False, False),
            ("elem", True, False, False, True, False, False, False, False),
            ("elemnorm", True, True, False, True, False, False, False, False),
            ("elem_all", True, False, False, True, True, False, False, False),
            ("tuned_fold", True, False, False, True, True, True, False, False),
            ("tuned_cat", True, False, False, True, True, False, True, False),
            ("tuned_catfold", True, False, False, True, True, True, True, False),
            ("tuned_cat_pdlsi", True, False, False, True, True, False, True, True),
        ):  # fmt: skip
            ops = elem_torch(kind) if el else None
            si = ops["standin"] if ops and pd else standin
            layer = make_layer(kind, mm, mm_res, si, hfused=hf, o_res=hf, norm_fold=fold,
                               split_gate=split, elem=ops, all_k=al, fold=gf, cat=ct)  # fmt: skip
            out = layer(h, res, w)
            errs = f"out {rel_err(out[0], ref[0]):.2e} res {rel_err(out[1], ref[1]):.2e}"
            print(kind, label, tuple(out[0].shape), "rel err", errs)
        out = make_chain_layer(kind, chain_torch(), standin)(h, res, w)  # the segments' model
        errs = f"out {rel_err(out[0], ref[0]):.2e} res {rel_err(out[1], ref[1]):.2e}"
        print(kind, "chain", tuple(out[0].shape), "rel err", errs)
    return 0


def chain_torch() -> Callable[..., Any]:
    """register_chain_op's op in torch (layer_chain.segment_ref): the CPU smoke and tests."""
    from kimictl.kernels.layer.chain import segment_ref
    from lab.kernels.layer_chain import chain_configs

    cfgs = {(c.layer, c.seg, c.m): c for c in chain_configs()}
    return lambda x, r, w, layer, seg: segment_ref(cfgs[(layer, seg, x.shape[0])], x, r, w)


def render_markdown(doc: dict[str, Any]) -> str:
    """Markdown tables from a layer_h200.json (no GPU needed)."""
    lines: list[str] = []
    for kind, layer in doc["layers"].items():
        wb = layer["weight_bytes"]
        lines += [
            f"**{kind.upper()}** ({wb / 1e6:.1f} MB of weights; {wb / 4.3e6:.1f} us at 4.3 TB/s)",
            "",
            "| M | variant | us/layer | x stock | kernels in graph | TB/s | rel err (out) "
            "| graph == eager |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in layer["rows"]:
            for v in VARIANTS:
                if v not in row:
                    continue
                r = row[v]
                lo, hi = r["spread"]
                nodes = (r["nodes"] or {}).get("kernel", "?")
                # a _pdlsi twin against the faster stand-in form of stock (*)
                x = f"{r['vs_best']['stock']:.3f}*" if v in STANDIN_PDL else f"{r['vs_stock']:.3f}"
                lines.append(
                    f"| {row['m']} | {v} | {r['us']:.1f} ({lo:.1f}-{hi:.1f}) | "
                    f"{x} | {nodes} | {r['tbps']:.2f} | "
                    f"{r['rel_err_out']:.1e} | {r['graph_equals_eager']} |"
                )
            lines.append(
                f"| {row['m']} | (stand-ins alone) | {row['standins_us']:.1f} | | 2 | | | |"
            )
            if "standins_pdl_us" in row:
                lines.append(f"| {row['m']} | (PDL stand-ins alone) | "
                             f"{row['standins_pdl_us']:.1f} | | 2 | | | |")  # fmt: skip
        lines.append("")
    if any(v in STANDIN_PDL for layer in doc["layers"].values() for row in layer["rows"]
           for v in row):  # fmt: skip
        lines.append("\\* against the faster of stock and stock_pdlsi (the same stand-in forms)")
    return "\n".join(lines)


def layer_source_hash() -> str:
    from kimictl.kernels.toolchain.build import LAYER_FAMILIES, source_hash

    return source_hash(families=LAYER_FAMILIES)


def m_list(text: str) -> tuple[int, ...]:
    """--ms: comma-separated positive Ms (argparse reports a ValueError as a bad value)."""
    ms = tuple(int(x) for x in text.split(","))
    if min(ms) < 1:
        raise ValueError(text)
    return ms


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, default=ROOT / "lab" / "_build_layer")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--kinds", default="mla,kda")
    ap.add_argument("--ms", type=m_list, default=MS, help="comma-separated Ms (default: all)")
    ap.add_argument("--variants", help="comma-separated subset of the variants (stock always)")
    ap.add_argument("--profile", action="store_true", help="also: per-kernel CUPTI times")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--vllm-art", type=Path, default=KBENCH / "vllm_art")
    ap.add_argument("--vllm-shim", type=Path, default=KBENCH / "drv_shim.cpp")
    ap.add_argument("--make-build", action="store_true", help="CPU: AOT-build the kernels it runs")
    ap.add_argument("--preflight-norm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preflight-elem", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preflight-new", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preflight-chain", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--chain-shipped",
        action="store_true",
        help="the chain on the shipped segments (kimictl.kernels.layer), no search",
    )
    ap.add_argument("--report", type=Path, help="render a layer_h200.json as markdown, exit")
    args = ap.parse_args()
    if args.report:
        try:
            doc = json.loads(args.report.read_text())
        except (OSError, ValueError) as exc:
            print(f"error: cannot read a layer run from {args.report}: {exc}", file=sys.stderr)
            return 1
        print(render_markdown(doc))
        return 0
    if args.smoke:
        return smoke()
    if args.make_build:
        return make_build(args.build, tuple(args.kinds.split(",")))
    if args.preflight_norm:
        return preflight_norm(args.build)
    if args.preflight_elem:
        return preflight_elem(args.build, tuple(args.kinds.split(",")))
    if args.preflight_new:
        return preflight_new(args.build)
    if args.preflight_chain:
        return preflight_chain(args.build, tuple(args.kinds.split(",")), args.chain_shipped)
    if not (args.build / "sm_90a" / "manifest.json").is_file():
        print(f"error: no kernel build in {args.build} (no sm_90a/manifest.json): run "
              "--make-build first", file=sys.stderr)  # fmt: skip
        return 1
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device: the layer is timed on an NVIDIA GPU (--smoke and --report "
              "run without one)", file=sys.stderr)  # fmt: skip
        return 1
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)

    from kimictl.kernels.toolchain.dispatch import descend
    from kimictl.kernels.toolchain.harness import open_library
    from lab.kernels.layer_ops import weight_bytes

    def stamp(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    # every variant's layer is the same code object (a closure): dynamo keeps one cache entry per
    # (variant, kind, M=1 or dynamic M), up to 72 here, past the default limit of 8 (then: eager!)
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 128)
    kinds = tuple(args.kinds.split(","))
    lib = open_library(args.build / "sm_90a", relink=True)
    plan = kernel_plan(kinds)
    absent = sorted({v for v in plan.values() if v != "cublas"} - set(lib.names))
    if absent:  # build check: every kernel the plan launches is in the linked library
        stamp(f"error: the build lacks {', '.join(absent[:8])}: run --make-build")
        return 1
    standin, kgemm, kgemm_res = register_ops(lib, plan)
    pre_k = subprocess.run(
        [sys.executable, __file__, "--preflight-new", "--build", str(args.build)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    passed = {r["name"] for r in json_lines(pre_k.stdout) if r["ok"]}
    new = {c.name for c in new_kernel_checks()}
    cands = {key: [v for v in vs if v == "cublas" or (v in lib.names
                                                      and (v not in new or v in passed))]
             for key, vs in tune_candidates(kinds).items()}  # fmt: skip
    for key, vs in cands.items():  # a start that failed its preflight gives way to the next
        if vs and plan[key] not in vs:
            plan[key] = vs[0]
    stamp(f"new-kernel preflight rc={pre_k.returncode}: {len(passed)} of {len(new)} passed "
          f"{pre_k.stderr[-300:]}")  # fmt: skip
    pre = subprocess.run(
        [sys.executable, __file__, "--preflight-norm", "--build", str(args.build)],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    variants = tuple(v for v in VARIANTS if pre.returncode == 0 or v not in NORM_VARIANTS)
    stamp(f"wsnorm preflight rc={pre.returncode}: {pre.stdout.strip()} {pre.stderr[-500:]}")
    pre_e = subprocess.run(
        [sys.executable, __file__, "--preflight-elem", "--build", str(args.build),
         "--kinds", args.kinds],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if pre_e.returncode != 0:
        variants = tuple(v for v in variants if v not in ELEM and v not in STANDIN_PDL)
    stamp(f"elem preflight rc={pre_e.returncode}: {pre_e.stdout.strip()} {pre_e.stderr[-500:]}")
    elem_ops = register_elem_ops(lib.launch, kinds)
    chain_ok: set[tuple[str, int]] = set()
    chain_picks: dict[str, str] = {}
    chain_sweep: list[dict[str, Any]] = []
    chain_search: list[dict[str, Any]] = []
    chain_checks: list[dict[str, Any]] = []  # the layer on the picks vs fp64, per (kind, M)
    if CHAIN_VARIANT in variants and (not args.variants or CHAIN_VARIANT in args.variants):
        try:
            pre_c = subprocess.run(
                [sys.executable, __file__, "--preflight-chain", "--build", str(args.build),
                 "--kinds", args.kinds, *(["--chain-shipped"] if args.chain_shipped else [])],
                capture_output=True, text=True, timeout=420, check=False,
            )  # fmt: skip
            chain_out, chain_err = json_lines(pre_c.stdout), pre_c.stderr[-500:]
        except subprocess.TimeoutExpired as exc:  # a barrier that never opened
            text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            chain_out, chain_err = json_lines(text), "timed out after 420 s"
        chain_ok = {(r["kind"], r["m"]) for r in chain_out if r.get("ok")}
        chain_picks = next((r["picks"] for r in chain_out if "picks" in r), {})
        chain_sweep = [r for r in chain_out if "sweep" in r]
        chain_search = [r for r in chain_out if "search" in r]
        chain_checks = [r for r in chain_out if "kind" in r]
        stamp(f"chain preflight: {[r for r in chain_out if 'sweep' not in r]} {chain_err}")
    if not chain_ok:
        variants = tuple(v for v in variants if v != CHAIN_VARIANT)
    chain_op = register_chain_op(lib.launch, kinds, chain_picks)
    vllm_used: dict[str, Any] = {}
    try:  # baseline (b): vLLM 0.33.0's SM90 plan for the projections
        vllm_mm, vllm_keep = load_vllm_plan(args.vllm_art, args.vllm_shim, Path("/tmp/layerbench"))
        vllm_used = vllm_keep["used"]
        vllm_err = None

        @torch.library.custom_op("layerbench::vgemm", mutates_args=(),
                                 schema="(Tensor x, Tensor w, str op) -> Tensor")  # fmt: skip
        def vgemm(x: torch.Tensor, w: torch.Tensor, op: str) -> torch.Tensor:
            return vllm_mm(x, w)

        @vgemm.register_fake
        def _(x: torch.Tensor, w: torch.Tensor, op: str) -> torch.Tensor:
            return x.new_empty((x.shape[0], w.shape[0]))

    except Exception as exc:  # no artifacts, a link error: the run goes on without (b)
        vllm_err = f"{type(exc).__name__}: {exc}"
        variants = tuple(v for v in variants if not v.startswith("vllm_plan"))
    stamp(f"vLLM plan: {vllm_err or 'linked'}")
    if args.variants:
        keep = {"stock", *args.variants.split(",")}
        variants = tuple(v for v in variants if v in keep)
    stamp(f"linked {len(lib.names)} kernels; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name()}")  # fmt: skip

    def cublas_mm(x: Any, w: Any, op: str) -> Any:
        return torch.nn.functional.linear(x, w)

    def cublas_mm_res(x: Any, w: Any, r: Any, op: str) -> Any:
        return torch.addmm(r, x, w.t())

    def build(kind: str, variant: str) -> Callable[..., Any]:
        if variant == CHAIN_VARIANT:
            return torch.compile(make_chain_layer(kind, chain_op, elem_ops["standin"]))
        si = standin
        if variant in PDLSI:
            si = elem_ops["standin_late" if variant.endswith("_late") else "standin"]
        if variant not in ELEM:  # stock and vLLM's plan: the twin runs its layer's ops
            variant = PDLSI.get(variant, variant)
        if variant == "vllm_plan":
            fn = make_layer(kind, vgemm, cublas_mm_res, si, split_gate=True)
            return torch.compile(fn)
        if variant in ELEM:
            fn = make_layer(kind, kgemm, kgemm_res, si, hfused=True, o_res=True,
                            norm_fold=variant == "kimictl_elemnorm", elem=elem_ops,
                            all_k=variant == "kimictl_elem_all" or variant in TUNED,
                            plan_tag=tuned_tag(kind, variant) if variant in TUNED else ALL,
                            fold=variant in FOLDS, cat=variant in CATS)  # fmt: skip
            return torch.compile(fn)
        kim = variant.startswith("kimictl")
        fn = make_layer(kind, kgemm if kim else cublas_mm, kgemm_res if kim else cublas_mm_res,
                        si, hfused=variant.endswith("hfused"),
                        o_res=variant in ("kimictl_hfused", "kimictl_norm"),
                        norm_fold=variant == "kimictl_norm")  # fmt: skip
        return torch.compile(fn)  # M is marked dynamic per call; weights stay static

    def run(fn: Callable[..., Any], h: Any, res: Any, w: dict[str, Any]) -> Any:
        torch._dynamo.maybe_mark_dynamic(h, 0)
        torch._dynamo.maybe_mark_dynamic(res, 0)
        return fn(h, res, w)

    def capture(fn: Callable[..., Any], h: Any, res: Any, ws: list[dict[str, Any]],
                keep: bool = False) -> tuple[Any, Any]:  # fmt: skip
        g = torch.cuda.CUDAGraph(keep_graph=True) if keep else torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            out = (h, res)
            for w in ws:
                out = fn(out[0], out[1], w)
        torch.cuda.synchronize()
        return g, out

    def replay_us(g: Any, n: int) -> float:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]  # fmt: skip
        for _ in range(3):
            g.replay()
        for a, b in ev:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3

    doc: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copies": COPIES,
        "tol": TOL,
        "build": {k: lib.manifest[k] for k in ("source_hash", "dsl_version", "built_at")}
        | {"kernels": len(lib.names)},
        # the shipped layer family's code the chain ran (the GEMMs' hash is the manifest's)
        "layer_source_hash": lib.manifest.get("layer_source_hash"),
        "chain_shipped": args.chain_shipped,
        "norm_preflight": {
            "rc": pre.returncode,
            "out": pre.stdout[-2000:],
            "err": pre.stderr[-2000:],
        },
        "new_preflight": {
            "rc": pre_k.returncode,
            "out": json_lines(pre_k.stdout),
            "err": pre_k.stderr[-2000:],
        },
        "elem_preflight": {
            "rc": pre_e.returncode,
            "out": pre_e.stdout[-2000:],
            "err": pre_e.stderr[-2000:],
        },
        "plan": {f"{o}/m{m}{'/res' if r else ''}": v for (o, m, r), v in plan.items()},
        "chain": {
            "picks": chain_picks,
            "sweep": chain_sweep,
            "search": chain_search,
            "checks": chain_checks,
        },
        "vllm_plan": {"error": vllm_err, "used": vllm_used},
        "layers": {},
    }
    out_json = args.out / "layer_h200.json"
    setups: dict[str, dict[str, Any]] = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for kind in kinds:  # everything compiled first; then M outer, so a timeout costs large M
        ws = [make_weights(kind, gen, "cuda") for _ in range(COPIES)]
        fns = {v: build(kind, v) for v in variants}
        for v, fn in fns.items():  # the dynamic-M graph first, then M=1's own
            for m in (2, 1):
                x = torch.zeros((m, 7168), device="cuda", dtype=torch.bfloat16)
                run(fn, x, x.clone(), ws[0])
            torch.cuda.synchronize()
            stamp(f"{kind} {v} compiled")
        setups[kind] = {
            "ws": ws,
            "wref": {k: v.double() for k, v in ws[0].items()},
            "ref": ref_layer(kind),
            "fns": fns,
        }
        doc["layers"][kind] = {"weight_bytes": weight_bytes(kind), "rows": []}
    from torch._dynamo.utils import counters

    doc["dynamo"] = {"graphs": dict(counters["stats"]), "breaks": dict(counters["graph_break"])}
    stamp(f"dynamo: {doc['dynamo']}")
    for m in args.ms:
        for kind in kinds:
            ws, fns = setups[kind]["ws"], setups[kind]["fns"]
            wb = doc["layers"][kind]["weight_bytes"]
            h = torch.randn((m, 7168), generator=gen, device="cuda").to(torch.bfloat16)
            res = torch.randn((m, 7168), generator=gen, device="cuda").to(torch.bfloat16)
            ref = setups[kind]["ref"](h.double(), res.double(), setups[kind]["wref"])
            row: dict[str, Any] = {"m": m}
            graphs = {}
            active = {
                v: fn
                for v, fn in fns.items()
                if (v not in NORM_VARIANTS or m in NORM_MS)
                and (v not in FOLDS or (m in FOLD_MS and fold_ok(cands, kind, m, v)))
                and (v != CHAIN_VARIANT or (kind, m) in chain_ok)
            }
            tuned: dict[str, dict[str, Any]] = {}
            for tv in (v for v in TUNED if v in active):  # picks first, searched in this layer

                def evaluate(fn: Any = active[tv], h: Any = h, res: Any = res, ws: Any = ws,
                             ref: Any = ref) -> float | None:  # fmt: skip
                    try:
                        out = run(fn, h, res, ws[0])
                        if max(rel_err(out[0], ref[0]), rel_err(out[1], ref[1])) > TOL:
                            return None
                        g = capture(fn, h, res, ws)[0]
                        return statistics.median(replay_us(g, 10) for _ in range(3)) / COPIES
                    except RuntimeError:  # a launch the kernel refuses: not a candidate
                        return None

                mine = {key: vs for key, vs in cands.items()
                        if key[1] == m and key[0].endswith(tuned_tag(kind, tv))}  # fmt: skip
                log = descend(mine, plan, evaluate)
                picks = {k[0].split("@")[0] + ("/res" if k[2] else ""): plan[k] for k in mine}
                tuned[tv] = {"plan": picks, "tune_log": log}
                stamp(f"{kind} M={m} {tv} in {len(log)} layer timings: {picks}")
            for v, fn in active.items():
                eager = run(fn, h, res, ws[0])
                g1, o1 = capture(fn, h, res, ws[:1], keep=True)
                nodes = count_kernel_nodes(g1)
                g1.replay()
                torch.cuda.synchronize()
                row[v] = {
                    "rel_err_out": rel_err(eager[0], ref[0]),
                    "rel_err_res": rel_err(eager[1], ref[1]),
                    "graph_equals_eager": bool(torch.equal(o1[0], eager[0])
                                               and torch.equal(o1[1], eager[1])),
                    "nodes": nodes,
                }  # fmt: skip
                row[v]["ok"] = (row[v]["rel_err_out"] <= TOL and row[v]["rel_err_res"] <= TOL
                                and row[v]["graph_equals_eager"])  # fmt: skip
                graphs[v] = capture(fn, h, res, ws)[0]
                del g1
            # the fixed cost every variant carries: the two stand-in copies alone
            ops = ops_by_name(kind)
            core_in = torch.empty((m, ops["attention_core"].k), device="cuda",
                                  dtype=torch.bfloat16)  # fmt: skip
            lat_in = torch.empty((m, ops["routed_experts"].k), device="cuda", dtype=torch.bfloat16)

            def standins(a: Any, b: Any, w: Any, c: Any = core_in, lt: Any = lat_in,
                         nc: int = ops["attention_core"].n, nl: int = ops["routed_experts"].n,
                         si: Callable[..., Any] = standin) -> Any:  # fmt: skip
                return si([c], nc), si([lt], nl)

            graphs["standins"] = capture(standins, None, None, ws)[0]
            if any(v in STANDIN_PDL for v in active):  # the PDL copies alone, back to back
                graphs["standins_pdl"] = capture(
                    lambda a, b, w: standins(a, b, w, si=elem_ops["standin"]), None, None, ws
                )[0]
            times: dict[str, list[float]] = {v: [] for v in graphs}
            for _ in range(args.rounds):  # interleaved: drift hits every variant alike
                for v, g in graphs.items():
                    times[v].append(replay_us(g, args.replays) / COPIES)
            base = statistics.median(times["stock"])
            # the faster stand-in form of each baseline: what a _pdlsi twin is held against
            best = {b: min(statistics.median(times[v]) for v in (b, b + "_pdlsi") if v in times)
                    for b in ("stock", "vllm_plan") if b in times}  # fmt: skip
            row["standins_us"] = statistics.median(times.pop("standins"))
            if "standins_pdl" in times:
                row["standins_pdl_us"] = statistics.median(times.pop("standins_pdl"))
            for tv, found in tuned.items():
                row[tv].update(found)
            for v in active:
                us = statistics.median(times[v])
                row[v].update(us=us, spread=[min(times[v]), max(times[v])], vs_stock=us / base,
                              vs_best={b: us / t for b, t in best.items()},
                              tbps=wb / us / 1e6, pct_of_copy_ceiling=
                              100 * wb / us / 1e6 / COPY_CEILING_TBPS)  # fmt: skip
            if args.profile:  # where each variant's layer time goes, kernel by kernel
                for v in active:
                    try:
                        row[v]["profile"] = profile_graph(graphs[v], COPIES)
                    except Exception as exc:  # the timing above stands without it
                        row[v]["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
            doc["layers"][kind]["rows"].append(row)
            del graphs
            stamp(f"{kind} M={m:2d} " + "  ".join(
                f"{v} {row[v]['us']:6.1f}us x{row[v]['vs_stock']:.3f} "
                f"k={(row[v]['nodes'] or {}).get('kernel')} {'ok' if row[v]['ok'] else 'FAIL'}"
                f" e={row[v]['rel_err_out']:.1e}" for v in active))  # fmt: skip
            doc["seconds"] = round(time.perf_counter() - t0, 1)
            out_json.write_text(json.dumps(doc, indent=1))
    stamp("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
