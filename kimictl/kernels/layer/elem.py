"""The elementwise ops of a K3 decode layer's dense part as kimictl kernels that chain with PDL.

The layer profile: inductor's Triton kernels between the GEMMs (add + RMSNorm, RMSNorm, the MLA
sigmoid output gate, SiTU * mul) took 6-16 us per layer and, having no programmatic dependent
launch, made every kimictl GEMM after one of them start only when it had finished. These kernels
launch with PDL, load what the previous kernel does not write (norm weights) and trigger their
dependents before `griddepcontrol.wait`, then read the previous kernel's output.

Each op is one CTA per token row, shapes static per variant (M, widths), so the exported header
has no dynamic sizes and the GEMM ABI's four pointers carry any tensors (build.py's wrapper):
- addrms: X = h [M, K], W = norm weight [K], R = residual [M, K]; Y = flat [2M * K]: rows 0..M-1
  the normed x, rows M..2M-1 the new residual bf16(h + r) (what the norm reads, as vLLM does).
- rms: X [M, K], W [K]; Y = flat [M * K] (R unused).
- qkvnorm (MLA): X = qkv_a_g output [M, x_w]; q_c = X[:, :width] and kv_c = X[:, width:width +
  seg2] normed each with its own part of W [width + seg2]; Y = flat: q_c [M, width] then
  kv_c [M, seg2], both contiguous for the GEMM that reads them.
- gate (MLA): X = core output a [M, width], R = qkv_a_g output [M, x_w] whose columns from `off`
  are the gate; Y = flat [M * width] = a * sigmoid(gate).
- situ: X = the horizontally fused front GEMM's output [M, x_w] (router logits | latent | gate_up
  from `off`); Y = flat [M * width] = SiTU(g) * lin(u); R = fp32 logits [M, aux_w] (GateLinear's
  out_dtype), so no cast kernel is left between the GEMMs.
- rmssitu: X = the routed output [M, width], W = latent norm weight [width], R = the front GEMM's
  output [M, aux_w] with gate_up from `off`; Y = flat [M, width + seg2]: per row rms(X) * W, then
  SiTU(g) * lin(u) (seg2 columns). That row is the x of latent_up and shared_down run as one GEMM
  over their concatenated K (both write the same hidden rows, and the layer adds them).
- copy: X [M, x_w or width] (a view at its row stride x_w); Y = flat [M * width] = X[:, :width].
  The benchmark's stand-in for the attention core and the routed experts in its `_pdlsi` layers:
  the same bytes as the torch copy, but in the PDL chain like the real kernels it stands for.
  `late`: it triggers its dependents after its stores instead of first (a kernel that lets the
  next one launch only as it ends).
All math in fp32, outputs rounded once to bf16 (logits: exact fp32 of the bf16 GEMM output).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EPS", "LayerElemConfig"]

EPS = 1e-6  # lab/bench/layer_h200.py's rms_norm_eps (the same value in every variant)
OPS = ("addrms", "rms", "qkvnorm", "gate", "situ", "rmssitu", "copy")


@dataclass(frozen=True)
class LayerElemConfig:
    op: str
    m: int
    width: int  # elements per row the op writes (first segment for qkvnorm)
    x_w: int = 0  # row width of X when it is wider than `width` (a fused GEMM's output, a view)
    seg2: int = 0  # qkvnorm: width of the second normed segment; rmssitu: act columns
    off: int = 0  # gate: column of the gate in R; situ: of gate_up in X; rmssitu: in R
    aux_w: int = 0  # gate, rmssitu: row width of R; situ: fp32 logits written to R
    beta: float = 0.0  # situ: SiTU beta
    lbeta: float = 0.0  # situ: linear-part beta
    threads: int = 128
    pdl: bool = True
    late: bool = False  # copy: trigger the dependents at the end instead of first
    kernel: str = "layer_elem"
    rows: int = 1  # manifest field every family carries (one token row per CTA)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, got {self.op!r}")
        for v in (self.width, self.x_w, self.seg2, self.off, self.aux_w):
            if v % 8:
                raise ValueError("widths and offsets must be multiples of 8 (16-byte vectors)")
        if self.late and (self.op != "copy" or not self.pdl):
            raise ValueError("late applies to the PDL copy only")

    @property
    def name(self) -> str:
        extra = "".join(
            f"_{tag}{v}"
            for tag, v in (("x", self.x_w), ("s", self.seg2), ("o", self.off), ("a", self.aux_w))
            if v
        )
        tail = ("" if self.pdl else "_nopdl") + ("_late" if self.late else "")
        return f"elem_{self.op}_m{self.m}_w{self.width}{extra}{tail}"
