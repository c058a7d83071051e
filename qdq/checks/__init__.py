"""Rule implementations, one module per family. Importing this package registers them all.

- qparams: QDQ0xx, validity of scale, zero-point and axis
- pairing: QDQ1xx, Q/DQ pairing and redundant or requantizing pairs
- artefacts: QDQ2xx/QDQ3xx, exporter artefacts and dangling nodes
- dpu: QDQ7xx, fixed DPU numerics the float model does not reproduce
"""

from qdq.checks import artefacts, dpu, pairing, qparams  # noqa: F401
