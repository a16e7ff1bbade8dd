"""The fused dense part of a K3 decode layer (MLA and KDA, SM90): `chain` runs it as three
persistent kernels per (kind, M) with a grid barrier between dependent stages; `elem` holds the
elementwise row helpers those kernels reuse; `ops` is the op list they fuse, cited against vLLM
0.33.0's sources. What ships and at which M: `chain.CHAIN_SHIPPED`, `chain.SERVED_MS`."""
