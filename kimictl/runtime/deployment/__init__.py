"""Deployment: what is deployed: the DeploymentSpec, Kimi K3 facts and the TOML profiles."""
