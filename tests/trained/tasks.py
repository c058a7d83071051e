"""Task metrics of the trained corpus: what a model is for, measured on its evaluation set.

`metric(model_path, task)` runs any ONNX file of a task (float, quantized, fixed) in onnxruntime
with default session options (or, with `optimized=False`, without graph optimisations: the
arithmetic TensorRT and the NPU stand for, without onnxruntime's fused integer kernels) on
`data/TASK_eval.npz` and scores it against
`data/TASK_eval_truth.json` (with `split="bench"`, on the larger sets `data/make_data.py --split
bench` writes to `data/bench/`, checked against `data/bench_manifest.json` as they are read):

- rec: CTC greedy decoding (arg-max per step, repeats merged, blank 0 dropped) with the
  recognizer's dictionary (index 0 blank, then `ppocr_keys.txt`, then a space, as RapidOCR
  reads it); string accuracy (exact match) and character error rate (edit distance / length).
- det: the probability map thresholded at 0.3 (RapidOCR's `thresh`); each 4-connected component
  whose mean probability in its bounding box reaches 0.5 (`box_thresh`) and whose sides are at
  least 3 pixels becomes its bounding box grown by DB's unclip (distance area × 1.6 / perimeter);
  boxes are matched one-to-one to the ground-truth line boxes, greedily by IoU, a match needing
  IoU ≥ 0.5; precision, recall and F1 of the matches.
- cls and magika: top-1 accuracy of the arg-max class.

Needs only numpy and onnxruntime, so tests and benchmarks can both import it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime

DATA = Path(__file__).resolve().parent / "data"
BENCH_MANIFEST = DATA / "bench_manifest.json"
TASKS = ("rec", "det", "cls", "magika")
BATCH = 8


def data_file(name: str, split: str) -> Path:
    """A data file of SPLIT; a bench file only as the manifest records it, since it is not committed."""
    if split != "bench":
        return DATA / name
    path = DATA / "bench" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run tests/trained/data/make_data.py --split bench")
    recorded = json.loads(BENCH_MANIFEST.read_text()).get(name)
    if hashlib.sha256(path.read_bytes()).hexdigest() != recorded:
        raise ValueError(f"{path} differs from {BENCH_MANIFEST.name}: make it again with make_data.py --split bench")
    return path


def inputs(task: str, split: str = "eval") -> dict[str, np.ndarray]:
    """The task's inputs by graph input name, with a leading sample axis."""
    with np.load(data_file(f"{task}_{split}.npz", split)) as arrays:
        return {name: arrays[name] for name in arrays.files}


def samples(task: str, split: str = "eval") -> list[dict[str, np.ndarray]]:
    """The task's inputs one sample at a time, as the quantizers' calibration readers take them."""
    arrays = inputs(task, split)
    count = len(next(iter(arrays.values())))
    return [{name: array[i:i + 1] for name, array in arrays.items()} for i in range(count)]


def truth(task: str, split: str = "eval") -> list:
    return json.loads(data_file(f"{task}_{split}_truth.json", split).read_text())


def run(model_path: str | Path, feeds: dict[str, np.ndarray], optimized: bool = True) -> np.ndarray:
    """The first output for every sample, computed BATCH samples at a time."""
    options = onnxruntime.SessionOptions()
    if not optimized:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    count = len(next(iter(feeds.values())))
    return np.concatenate([session.run(None, {name: array[i:i + BATCH] for name, array in feeds.items()})[0]
                           for i in range(0, count, BATCH)])


def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def ctc_decode(probabilities: np.ndarray, characters: list[str]) -> list[str]:
    texts = []
    for best in probabilities.argmax(axis=-1):
        kept = best[np.r_[True, best[1:] != best[:-1]]]
        texts.append("".join(characters[i] for i in kept if i != 0))
    return texts


def alphabet() -> list[str]:
    """The recognizer's classes: blank, its dictionary, a space."""
    return ["blank", *(DATA / "ppocr_keys.txt").read_text(encoding="utf-8").splitlines(), " "]


def recognition(outputs: np.ndarray, expected: list[str]) -> dict:
    texts = ctc_decode(outputs, alphabet())
    errors = sum(edit_distance(t, e) for t, e in zip(texts, expected))
    return {"string_accuracy": float(np.mean([t == e for t, e in zip(texts, expected)])),
            "cer": errors / sum(len(e) for e in expected)}


def components(mask: np.ndarray) -> np.ndarray:
    """4-connected component labels of a boolean map (-1 off the mask): each pixel takes the
    smallest index it reaches, by neighbour minima and pointer jumps until nothing changes."""
    height, width = mask.shape
    labels = np.where(mask, np.arange(mask.size).reshape(mask.shape), mask.size)
    while True:
        padded = np.pad(labels, 1, constant_values=mask.size)
        smallest = np.minimum.reduce([labels, padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]])
        smallest = np.where(mask, smallest, mask.size)
        flat = smallest.ravel()
        on = flat < mask.size
        flat[on] = flat[flat[on]]  # pointer jump: a label points at a pixel whose label may be smaller
        if np.array_equal(smallest, labels):
            return np.where(mask, labels, -1)
        labels = smallest


def detected_boxes(probability: np.ndarray, thresh: float = 0.3, box_thresh: float = 0.5,
                   unclip: float = 1.6, min_size: int = 3) -> list[list[float]]:
    labels = components(probability > thresh)
    boxes = []
    for label in np.unique(labels[labels >= 0]):
        ys, xs = np.nonzero(labels == label)
        x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
        width, height = x1 - x0, y1 - y0
        if min(width, height) < min_size or probability[y0:y1, x0:x1].mean() < box_thresh:
            continue
        grow = width * height * unclip / (2 * (width + height))
        boxes.append([x0 - grow, y0 - grow, x1 + grow, y1 + grow])
    return boxes


def iou(a: list[float], b: list[float]) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def detection(outputs: np.ndarray, expected: list[list[list[int]]]) -> dict:
    matched = found = wanted = 0
    for probability, boxes in zip(outputs[:, 0], expected):
        detected = detected_boxes(probability)
        pairs = sorted(((iou(d, t), i, j) for i, d in enumerate(detected) for j, t in enumerate(boxes)), reverse=True)
        used_d, used_t = set(), set()
        for overlap, i, j in pairs:
            if overlap >= 0.5 and i not in used_d and j not in used_t:
                used_d.add(i)
                used_t.add(j)
        matched, found, wanted = matched + len(used_d), found + len(detected), wanted + len(boxes)
    precision, recall = matched / max(found, 1), matched / max(wanted, 1)
    return {"precision": precision, "recall": recall,
            "f1": 2 * precision * recall / (precision + recall) if matched else 0.0}


def top1(outputs: np.ndarray, expected: list) -> dict:
    return {"top1": float(np.mean(outputs.argmax(axis=-1) == np.asarray(expected)))}


def metric(model_path: str | Path, task: str, optimized: bool = True, split: str = "eval") -> dict:
    """The task metric of MODEL_PATH on TASK's evaluation set (see the module docstring)."""
    return figures(run(model_path, inputs(task, split), optimized), task, split)


def figures(outputs: np.ndarray, task: str, split: str = "eval") -> dict:
    """The task metric of a model's outputs on TASK's evaluation set (or SPLIT's)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    expected = _expected(task, split)
    if task == "rec":
        return recognition(outputs, expected)
    if task == "det":
        return detection(outputs, expected)
    return top1(outputs, expected)


def per_sample(outputs: np.ndarray, task: str, split: str = "eval") -> np.ndarray:
    """Each sample's score, so two models can be compared sample by sample (benchmarks/verdict.py's sign
    test): 1 or 0 for a string or class right or wrong, a page's own F1 for the detector."""
    expected = _expected(task, split)
    if task == "rec":
        return np.array([t == e for t, e in zip(ctc_decode(outputs, alphabet()), expected)], float)
    if task == "det":
        return np.array([detection(outputs[i:i + 1], expected[i:i + 1])["f1"] for i in range(len(expected))])
    return (outputs.argmax(axis=-1) == np.asarray(expected)).astype(float)


def _expected(task: str, split: str = "eval") -> list:
    """The ground truth as the scores compare it: magika's labels as the indices of its output."""
    expected = truth(task, split)
    if task == "magika":
        labels = json.loads((DATA / "magika_labels.json").read_text())
        return [labels.index(entry["label"]) for entry in expected]
    return expected
