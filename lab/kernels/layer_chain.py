"""The layer_chain family's sweep (lab only): every segment in every math form and (ring, slot)
the H200 layer search times, the tensor-core form's config (its kernel: layer_chain_dsl.py), and
the segments' flat weight buffers for the benchmark. What ships (kimictl/kernels/layer/chain.py:
CHAIN_SHIPPED, SIMT) is the search's picks; the build reaches these through lab.kernels.families
(`layer_h200.py --make-build`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimictl.kernels.layer import chain
from kimictl.kernels.layer.chain import (
    COUNTER,
    SEGMENTS,
    SIMT_MS,
    THREADS,
    ChainStage,
    LayerChainConfig,
)

__all__ = [
    "CHAIN_CONFIGS",
    "CHAIN_MS",
    "KGROUP",
    "RINGS",
    "TILE",
    "WARPS",
    "LayerChainMmaConfig",
    "chain_config",
    "chain_configs",
    "chain_weights",
]

# the sweep's Ms; mma serves 1..8, but x of M = 8 at K = 7168 leaves too little ring
CHAIN_MS = (1, 2, 4)
WARPS = THREADS // 32  # mma: warps splitting K for one 16-row tile
TILE = 16  # mma: weight rows per tile (the MMA's M)
KGROUP = 32  # mma: k per thread quad and MMA pair (four 16-byte vectors)


@dataclass(frozen=True)
class LayerChainMmaConfig(LayerChainConfig):
    """The tensor-core form ("mma"): tcstream's `mma.sync.m16n8k16` with the weights as the
    16-row A operand and the tokens as the 8-column B operand (k permuted alike in A and B, so
    every load stays one 16-byte vector of a thread), one MMA per 4 k-vectors whatever M is. The
    CTA owns a 16-row tile at a time and its 16 warps split K; a tile's vectors stream through the
    ring in pieces of slot / 2 k-groups (32 k each), and the warps' partial sums meet in shared
    memory once per tile. Same segments, ABI, ring and barrier as the shipped SIMT form."""

    math: str = "mma"

    def _check_form(self) -> None:
        if self.math != "mma":
            raise ValueError(f"math must be mma, got {self.math!r}")
        if self.m not in CHAIN_MS:
            raise ValueError(f"m must be one of {CHAIN_MS} for mma, got {self.m}")
        if self.slot % 2 or any(st.k % KGROUP for st in self.stages):
            raise ValueError("mma needs an even slot (rows g and g + 8) and K a multiple of 32")

    def pieces(self, st: ChainStage) -> int:
        """Ring slots one tile of stage `st` streams through (slot / 2 k-groups each of a
        warp's ceil(K / 32 / WARPS))."""
        per_warp = -(-st.k // (KGROUP * WARPS))
        return -(-per_warp // (self.slot // 2))

    @property
    def acc_shape(self) -> tuple[int, ...]:
        """The cross-warp partial sums: two parities, per warp, tile row and token column."""
        return (2, WARPS, TILE, 8)


def chain_config(**entry: Any) -> LayerChainConfig:
    """A segment's config from its manifest entry, in the form its `math` names."""
    cls = LayerChainMmaConfig if entry.get("math") == "mma" else LayerChainConfig
    fields = LayerChainConfig.__dataclass_fields__
    return cls(**{k: v for k, v in entry.items() if k in fields})


def _compile_chain(cfg: LayerChainConfig, arch: str) -> Any:
    """The family's compiler: the shipped one, or the tensor-core kernel for an mma config."""
    if not isinstance(cfg, LayerChainMmaConfig):
        return chain._compile_chain(cfg, arch)
    import cuda.bindings.driver as cuda  # noqa: F401  (the DSL resolves the stream type)
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16

    from lab.kernels.layer_chain_dsl import LayerChainMma

    sz = cfg.sizes
    fake = [cute.runtime.make_fake_compact_tensor(BFloat16, (sz[b],), assumed_align=16)
            for b in ("x", "w", "y", "r")]  # fmt: skip
    stream = cutlass.runtime.make_fake_stream()
    return cute.compile(LayerChainMma(cfg), *fake, stream, options=f"--gpu-arch {arch}")


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
                    form = LayerChainMmaConfig if math == "mma" else LayerChainConfig
                    for ring, slot in rings:
                        try:
                            cfg = form(kind, seg, m, ring=ring, slot=slot, beta=beta, lbeta=lbeta)
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
