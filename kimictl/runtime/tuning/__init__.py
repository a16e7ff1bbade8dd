"""Performance model of the K3 decode step, the TP/DCP/draft/batch search, and measured tuning.

model.py   per-decode-step time from the K3 shapes and a System (few fitted, sourced parameters)
systems.py hardware descriptions (gb300, b300, b200, h200) with sources
search.py  grid over TP x DCP x draft tokens x max-num-seqs; Pareto frontier; a choice and why
"""
