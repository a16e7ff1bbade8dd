"""CuTe DSL decode kernels for K3 shapes, their torch references, AOT build and device harness."""
