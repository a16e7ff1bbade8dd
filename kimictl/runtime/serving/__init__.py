"""Serving: plan, start, watch and stop a vLLM server (`kimictl serve`, `runs`, `render`), the CPU
runtime and the tiny model."""
