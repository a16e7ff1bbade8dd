"""The shipped decode GEMM families on one launch base (see kimictl/kernels/__init__.py)."""
