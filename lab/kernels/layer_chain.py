"""The layer_chain family's sweep (lab only): every segment in every math form and (ring, slot)
the H200 layer search times, and the segments' flat weight buffers for the benchmark. What ships
(kimictl/kernels/layer/chain.py: CHAIN_SHIPPED) is the search's picks; the build reaches these
through lab.kernels.families (`layer_h200.py --make-build`)."""

from __future__ import annotations

from typing import Any

from kimictl.kernels.layer.chain import (
    CHAIN_MS,
    COUNTER,
    SEGMENTS,
    SIMT_MS,
    LayerChainConfig,
)
from kimictl.kernels.layer.chain import _compile_chain as _compile_chain  # the family's compiler

__all__ = ["CHAIN_CONFIGS", "RINGS", "chain_configs", "chain_weights"]

# (ring, slot) shapes the benchmark times each segment with, alone, before it picks one per
# segment: deeper rings keep more bytes in flight; a smaller slot leaves room for them where the
# widest stage needs fewer vectors per row (segment c: K = 4352, 5 vectors). The SIMT picks of
# the recorded runs were all ring 2 or 4 with 56-120 KB in flight per CTA; the mma shapes span
# 64-128 KB. At M = 1 and 2 every mma segment was slower than the SIMT one
# (docs/results.md, row "chain mma form at M = 1, 2"), so mma is built for M = 4 only
RINGS = {
    "simt": ((3, 7), (2, 10), (4, 5), (5, 4), (2, 7)),
    "mma": ((2, 8), (3, 4), (3, 6), (4, 4), (5, 4)),
}


def chain_configs(kinds: tuple[str, ...] = ("mla", "kda"), ms: tuple[int, ...] = CHAIN_MS
                  ) -> tuple[LayerChainConfig, ...]:  # fmt: skip
    """Every segment in every math form and (ring, slot) of RINGS that serves its M and fits its
    stages and shared memory."""
    from kimictl.deployment.k3 import K3_MOE_CONFIG

    beta = float(K3_MOE_CONFIG["activation_situ_beta"])  # type: ignore[arg-type]
    lbeta = float(K3_MOE_CONFIG["activation_situ_linear_beta"])  # type: ignore[arg-type]
    out = []
    for kind in kinds:
        for m in ms:
            for seg in SEGMENTS:
                for math, rings in RINGS.items():
                    if math == "mma" and m in SIMT_MS:  # SIMT is faster there (below)
                        continue
                    for ring, slot in rings:
                        try:
                            cfg = LayerChainConfig(kind, seg, m, ring=ring, slot=slot, beta=beta,
                                                   lbeta=lbeta, math=math)  # fmt: skip
                            out.append(cfg)
                        except ValueError:  # M not served, a slot too small, too much smem
                            continue
    return tuple(out)


CHAIN_CONFIGS: tuple[LayerChainConfig, ...] = ()  # built on request (layer_h200.py --make-build)


def chain_weights(layer: str, w: dict[str, Any]) -> dict[str, Any]:
    """The three segments' flat weight buffers from the layer's weights (layer_h200.py's
    make_weights names), each with a zeroed barrier word at its end."""
    import torch

    def flat(*parts: Any) -> Any:
        z = torch.zeros(COUNTER, dtype=torch.bfloat16, device=parts[0].device)
        return torch.cat([p.reshape(-1) for p in (*parts, z)]).contiguous()

    first = "qkv_a_g" if layer == "mla" else "kda_in"
    second = ("q_kv_a_norm", "q_b") if layer == "mla" else ("f_b",)
    return {
        "chain_a": flat(w["input_norm"], w[first], *(w[n] for n in second)),
        "chain_f": flat(w[first], *(w[n] for n in second)),
        "chain_b": flat(w["o_proj"], w["post_attention_norm"], w["front"]),
        "chain_c": flat(w["latent_norm"], w["latent_up_cat"]),
    }
