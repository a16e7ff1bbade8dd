"""Load: workloads, the streaming load generator, SLOs and bench reports (`kimictl bench`)."""
