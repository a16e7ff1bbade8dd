"""vLLM 0.33.0's own CuTe units (plan, cache, build, inject) and kimictl's vLLM plugin."""
