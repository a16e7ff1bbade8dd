"""The node toolchain: build, harness, verify, bench, dispatch, install (kimictl kernels ...)."""
