"""Corpus files as onnxruntime's optimizer writes them (`SessionOptions.optimized_model_filepath`).

Users save the graph onnxruntime runs to see what it fused, and hand that file on. It differs from
its source in ways no quantizer writes: every attribute spelled out (QuantizeLinear's
`output_dtype = 0`), `InsertedPrecisionFreeCast` nodes where the CPU provider has no float16 kernel
(a DQ reading its float16 scale through a Cast to float32), and at the extended level the Q/DQ
node units fused into QLinearConv, QLinearAdd and QGemm between DQ -> Q pairs.

Reads the corpus files in SOURCES, writes `<folder>-<stem>_<level>.onnx` here and `manifest.json`.
A CPU session with default options otherwise; two runs write byte-identical files.

    python tests/corpus/ort_optimized/make.py
"""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent
LEVELS = {"basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}
# (corpus file, levels, what the optimized file has that its source does not)
SOURCES = [
    ("modelopt/resnet_int8.onnx", ("basic", "extended"),
     "float16 model: the DQs read their float16 scales through InsertedPrecisionFreeCast nodes to float32"),
    ("ort/mobilenetv2_u16_activations.onnx", ("basic",),
     "uint16 activations; every QuantizeLinear spells out output_dtype = 0"),
    ("ort/resnet_keep_activations.onnx", ("extended",),
     "QLinearConv and QLinearAdd (com.microsoft) between DQ -> Q pairs with equal parameters"),
    ("modelopt/transformer_int8.onnx", ("extended",),
     "float16 transformer: fused attention inputs, scales through Casts"),
]


def main() -> None:
    manifest = []
    source_entries = {}
    for folder in {source.split("/")[0] for source, _, _ in SOURCES}:
        for item in json.loads((CORPUS / folder / "manifest.json").read_text()):
            source_entries[f"{folder}/{item['file']}"] = item
    for source, levels, note in SOURCES:
        for level in levels:
            name = f"{source.replace('/', '-').removesuffix('.onnx')}_{level}.onnx"
            options = onnxruntime.SessionOptions()
            options.graph_optimization_level = LEVELS[level]
            options.optimized_model_filepath = str(HERE / name)
            options.log_severity_level = 3
            onnxruntime.InferenceSession(str(CORPUS / source), options, providers=["CPUExecutionProvider"])
            print(f"{name:<55} {(HERE / name).stat().st_size / 1024:4.0f} KiB", flush=True)
            manifest.append({
                "file": name,
                "architecture": source_entries[source]["architecture"],
                "tool": "onnxruntime.InferenceSession (optimized_model_filepath)",
                "version": onnxruntime.__version__,
                "settings": {"source": source, "graph_optimization_level": level,
                             "providers": ["CPUExecutionProvider"]},
                "made_by": "make.py",
                "note": note,
            })
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
