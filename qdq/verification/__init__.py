"""The verdict of `qdq fix` and `qdq verify`: a model's float twin, the inputs it is meant to see,
the region a fix changed, models run in bounded pieces, and the one criterion that passes or
refuses a candidate.

May import: support, graph, quant, rewrite, checks, engine.
"""
