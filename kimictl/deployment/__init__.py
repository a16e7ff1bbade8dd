"""The facts of a deployment: Kimi K3 rules and pins, the DeploymentSpec, TOML profiles, `vllm
serve` command lines, histogram buckets, the traces setting and cluster values. Reads only core."""
