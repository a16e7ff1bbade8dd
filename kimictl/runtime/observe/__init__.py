"""Observe: vLLM /metrics scraping, window math and GPU telemetry (`kimictl monitor`, the TUI)."""
