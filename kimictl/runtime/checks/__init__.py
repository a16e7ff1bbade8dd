"""Checks: hardware and stack probes and the rules that judge a deployment (`kimictl doctor`)."""
