"""What the fused segments share with the lab's elementwise kernels: the RMSNorm epsilon.

The segments (chain.py, chain_dsl.py) build each stage's x with elem_dsl.py's per-row helpers:
add + RMSNorm, RMSNorm, the MLA sigmoid output gate, SiTU * mul. The same ops as kernels of their
own, one CTA per token row between per-GEMM kernels, are the lab's (lab/kernels/layer_elem.py).
"""

from __future__ import annotations

__all__ = ["EPS"]

EPS = 1e-6  # lab/bench/layer_h200.py's rms_norm_eps (the same value in every variant)
