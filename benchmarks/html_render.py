"""How long `qdq compare --format html` takes to open in a browser on a 1,000-layer engine (issue 21: < 5 s).

Builds a synthetic engine pair in trtexec's TensorRT 8.4 layer-info format: A has blocks of three
INT8 convolutions with an INT8 residual; B is A with the residual in FP16 and a standalone
QuantizeLinear after the block in every `--every`-th block, about 1,000 layers in all. Then writes
the HTML report and opens it in headless Chromium (--dump-dom), and prints JSON with medians over
the repeats:

- `write_s`: `qdq compare --format html` as a subprocess;
- `browser_s`: Chromium opening the page until its scripts ran, less Chromium opening an empty page;
- `render_ms`: what the page itself measured for the layout and drawing (`data-render-ms`);
- `page_bytes`, `rows` (alignment rows), `drawn_rows` (rows after the initial collapse).

Two cases: every block differs (nothing collapses: all 1,000 layers drawn, the worst case) and every
third block differs (the regions without differences start collapsed).

    python benchmarks/html_render.py [--layers 1000] [--repeats 3] [--chromium PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "docs"))

import render_pages  # noqa: E402

INT8 = "Thirty-two wide channel vectorized row major Int8 format"
FP16 = "Thirty-two wide channel vectorized row major FP16 format"


def _tensor(name: str, fmt: str) -> dict:
    return {"Name": name, "Location": "Device", "Dimensions": [1, 64, 56, 56], "Format/Datatype": fmt}


def _conv(name: str, inputs: list[tuple[str, str]], output: tuple[str, str]) -> dict:
    return {"Name": name, "LayerType": "CaskConvolution", "ParameterType": "Convolution",
            "Inputs": [_tensor(*t) for t in inputs], "Outputs": [_tensor(*output)],
            "Weights": {"Type": "Int8", "Count": 4096}, "TacticName": "sm75_xmma_fprop_implicit_gemm_i8i8"}


def engine(blocks: int, quantized_residual: set[int]) -> dict:
    """`blocks` blocks of three convolutions; a block not in `quantized_residual` adds its residual in
    FP16 and needs a standalone Q after it (the layer only B has)."""
    layers = [{"Name": "QuantizeLinear_0", "LayerType": "Reformat", "ParameterType": "Reformat", "Origin": "QDQ",
               "Inputs": [_tensor("input", "Row major linear FP32 format")], "Outputs": [_tensor("t0", INT8)]}]
    current = "t0"
    for k in range(blocks):
        a, b, out = f"b{k}.a", f"b{k}.b", f"b{k}.out"
        layers.append(_conv(f"features.{k}.conv.0.weight + QuantizeLinear_{k}0 + Conv_{k}0", [(current, INT8)], (a, INT8)))
        layers.append(_conv(f"features.{k}.conv.1.weight + QuantizeLinear_{k}1 + Conv_{k}1", [(a, INT8)], (b, INT8)))
        if k in quantized_residual:
            layers.append(_conv(f"features.{k}.conv.2.weight + QuantizeLinear_{k}2 + Conv_{k}2 + Add_{k}3",
                                [(b, INT8), (current, INT8)], (out, INT8)))
        else:
            layers.append(_conv(f"features.{k}.conv.2.weight + QuantizeLinear_{k}2 + Conv_{k}2 + Add_{k}3",
                                [(b, INT8), (current, FP16)], (out + ".fp16", FP16)))
            layers.append({"Name": f"QuantizeLinear_{k}4", "LayerType": "Reformat", "ParameterType": "Reformat",
                           "Origin": "QDQ", "Inputs": [_tensor(out + ".fp16", FP16)], "Outputs": [_tensor(out, INT8)]})
        current = out
    return {"Layers": layers, "Bindings": ["input", current]}


def synthetic_pair(folder: Path, layers: int = 1000, every: int = 1) -> tuple[Path, Path]:
    """A (all residuals INT8) and B (every `every`-th block's residual in FP16), B about `layers` long."""
    blocks = round((layers - 1) / (3 + 1 / every))
    differing = set(range(0, blocks, every))
    a, b = folder / "a.graph.json", folder / "b.graph.json"
    a.write_text(json.dumps(engine(blocks, set(range(blocks)))))
    b.write_text(json.dumps(engine(blocks, set(range(blocks)) - differing)))
    return a, b


def measure(a: Path, b: Path, html: Path, blank: Path, chromium: str | None) -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, str(REPO / "cli.py"), "compare", str(a), str(b), "--format", "html", "-o", str(html)],
                   check=True, cwd=REPO)
    written = time.perf_counter()
    render_pages.dump_dom(blank, chromium)
    empty = time.perf_counter()
    dom = render_pages.dump_dom(html, chromium)
    opened = time.perf_counter()
    drawn = re.search(r'id="engine-graph"[^>]*', dom).group(0)
    return {"write_s": written - started, "browser_s": (opened - empty) - (empty - written),
            "render_ms": float(re.search(r'data-render-ms="(\d+)"', drawn).group(1)),
            "drawn_rows": int(re.search(r'data-rows="(\d+)"', drawn).group(1)), "page_bytes": html.stat().st_size}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1000, help="layers of engine B (default: 1000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chromium", help="browser binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        blank = folder / "blank.html"
        blank.write_text("<!DOCTYPE html><title>blank</title>")
        for case, every in (("every block differs", 1), ("every third block differs", 3)):
            a, b = synthetic_pair(folder, args.layers, every)
            runs = [measure(a, b, folder / "page.html", blank, args.chromium) for _ in range(args.repeats)]
            rows = json.loads(subprocess.run([sys.executable, str(REPO / "cli.py"), "compare", str(a), str(b),
                                              "--format", "json"], capture_output=True, check=True, cwd=REPO).stdout)
            results[case] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            results[case].update(layers_b=len(json.loads(b.read_text())["Layers"]), rows=len(rows["pairs"]))
    results["target"] = "browser_s < 5 for 1,000 layers"
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
