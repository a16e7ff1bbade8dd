"""The correctness gate between two endpoints serving one model (`kimictl validate`).

Five checks, each with a threshold, a result and the evidence: greedy agreement, long-context
numerics and retrieval, temperature sampling, structured output, full context.
"""
