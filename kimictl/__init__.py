"""kimictl: the operator's toolkit for Kimi K3's latency-specialized decode path on vLLM."""

__version__ = "0.1.0"
