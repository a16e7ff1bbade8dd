"""Experiments outside the product: unshipped kernels, measurement scripts, their tests."""
