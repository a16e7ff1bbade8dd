"""kimictl's decode kernels and vLLM's own CuTe units, by role.

- `gemm/`: the shipped GEMM families (CuTe DSL bodies `*_gemm_dsl.py`, configurations and
  compile functions `*_gemm.py`) on one launch base (`rowblock_dsl`, `aot`).
- `toolchain/`: the node toolchain: AOT build, device harness, verify, bench, the dispatch table,
  torch custom ops, install on a GPU node and the node's layer record.
- `vllm/`: vLLM 0.33.0's own CuTe units (plan, unit cache, skinny and specialized builders,
  prebuilt install and inject) and kimictl's vLLM plugin.

Layers: vllm > toolchain > gemm; the package reads only kimictl.deployment and kimictl.core,
and runtime's use cases (serve, doctor) read it. Experiments live in lab/, outside the package.
"""
