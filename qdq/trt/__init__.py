"""Reading TensorRT engine JSON (`trtexec --exportLayerInfo`, `--exportProfile`) and comparing engines.

May import: support, graph, quant, rewrite, checks, engine.
"""
