"""The quantization view of a graph and its arithmetic: every quantized value with its Q and DQs
(`index`), their parameters decoded as columns (`param_table`), operand roles, integer types,
rounding, power-of-two scales, calibration ranges and equalization factors. Reads graphs; never
edits them.

May import: support, graph.
"""
