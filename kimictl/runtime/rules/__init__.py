"""The K3 fast-path rules: deployment flags, hardware and fabric, software stack."""
