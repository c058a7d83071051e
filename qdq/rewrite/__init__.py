"""What a rule is and what a fix may do to a graph: findings and changes with their costs
(`rule`), the one edit log every fix writes through (`edits`), re-quantization that keeps the
numbers (`requantize`), new Q/DQ for float operands (`insertion`), constants evaluated in
onnxruntime, float parts to FP16, bias correction.

May import: support, graph, quant.
"""
