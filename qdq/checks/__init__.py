"""Rule implementations, one module per family. Importing this package registers them all.

- qparams: QDQ001-005, validity of scale, zero-point and axis
- coverage: QDQ006, quantization qdq does not read (QONNX, vendor quantizers, integer kernels)
- pairing: QDQ1xx, Q/DQ pairing and redundant or requantizing pairs
- artefacts: QDQ2xx/QDQ3xx, exporter artefacts and dangling nodes
- batchnorm: QDQ204, BatchNormalization or constant scaling left between a quantized conv and its Q
- alignment: QDQ4xx, values that must share one scale (Concat, pools, shape ops)
- formats: QDQ5xx, the types and scale forms a target accepts (power-of-two, per-tensor, symmetric)
- lower_bounds: QDQ507, the zero-point of a one-sided activation at its data-free lower bound
- shifts: QDQ601-605, 607, 608, the NPU's shift limits between fix positions
- bias: QDQ606, integer bias at input scale × weight scale; QDQ609, a bias the target wants float
- dpu: QDQ7xx, fixed DPU numerics the float model does not reproduce
- float_by_design: QDQ808-810, what NVIDIA's tools keep float for TensorRT (small GEMMs, graph outputs, Q/DQ before float ops)
- placement: QDQ801-803, Q/DQ placement around the ops a target fuses (float inputs, residual Adds)
- node_units: QDQ804-805, ops with dequantized inputs whose output has no Q (onnxruntime node units)
- cpu_fallback: QDQ811, compute ops outside the quantized graph, which the NPU leaves to the CPU
- reduced_range: QDQ509, a Clip on the integers between Q and DQ (PyTorch's reduced-range quantizer)
- strong_typing: QDQ901-903, what a strongly typed TensorRT 11 network builds from the model's float types
- weight_type: QDQ508, int8 weights a 16-bit pair-sum kernel can saturate, stored as uint8
- equalization: QDQ510, Conv chains whose per-tensor weight grids lose less with equalized channels
- bias_correction: QDQ511, the mean output shift a conv's per-tensor weight rounding causes, taken back by its bias

May import: support, graph, quant, rewrite.
"""

from qdq.checks import (  # noqa: F401
    alignment, artefacts, batchnorm, bias, bias_correction, coverage, cpu_fallback, dpu, equalization, float_by_design,
    formats, lower_bounds, node_units, pairing, placement, qparams, reduced_range, shifts, strong_typing, weight_type,
)
