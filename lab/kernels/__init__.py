"""Unshipped kernel families (built through lab.kernels.families)."""
