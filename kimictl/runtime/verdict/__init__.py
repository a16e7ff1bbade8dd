"""Judging tuned against stock on real requests: paired ratios, effect-size floors, decisions,
and statistics that stay valid while someone watches. Pure arithmetic over per-request figures
(no I/O), so bench's replay (runtime.load) and monitor's live judge (runtime.observe) share it."""
