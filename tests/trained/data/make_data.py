"""Real-looking inputs for the trained corpus, made offline: calibration and evaluation sets.

For each task, `TASK_calib.npz` (16 samples) and `TASK_eval.npz` hold the model's input as the
model is meant to see it (one array per graph input, leading sample axis: usable as qdq's
`--calibrate` / `--inputs` and by quantizers as they are); `TASK_eval_truth.json` holds what a
correct model answers. Calibration and evaluation come from different seeds (and, for magika,
different files).

`--split bench` writes larger evaluation sets for rec, cls and det (a third seed, the same
rendering) into `bench/`, which is not committed: 64 samples resolve no better than 1.6 points,
and issue 35 compares conversions to within one. The sha256 of every file it writes is checked
against `bench_manifest.json` (committed), so a regenerated set is the set the figures in
docs/benchmarks.md were measured on; `--record` writes the manifest instead.

- rec: one line of 4–12 letters/digits from the recognizer's dictionary, rendered with PIL in a
  DejaVu font on a tinted background, blurred and JPEG-compressed, then prepared as RapidOCR
  does (BGR, height 48, width by aspect ratio up to 320, (x/255 − 0.5)/0.5, zero padding right).
- cls: shorter lines prepared the same way at 48×192, half of them turned by 180° (label 1).
- det: 256×384 pages of 3–5 lines of 1–3 words; the truth is each line's ink box.
- magika: the 1024 first and 1024 last bytes (whitespace-stripped, padded with 256) of real files,
  as magika 1.0.3 reads them, with the content type as label: numpy's and onnx's own sources,
  headers, libraries, CSVs and .proto files (BSD-3 / Apache-2.0), this repository's docs, and
  images, PDFs and archives that PIL, zipfile and gzip write here from rendered text.

    /work/scratch/corpus/venv/bin/python tests/trained/data/make_data.py                 # Pillow + numpy
    /work/scratch/corpus/venv/bin/python tests/trained/data/make_data.py --split bench   # about a minute

Needs Pillow (not in the project's environment: the .npz files are committed, so tests do not)
and the DejaVu fonts in /usr/share/fonts/truetype/dejavu.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FONTS = [Path("/usr/share/fonts/truetype/dejavu") / name for name in (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSansCondensed.ttf")]
SEEDS = {"calib": 1, "eval": 2, "bench": 3}
COUNTS = {"rec": {"calib": 16, "eval": 64, "bench": 256}, "cls": {"calib": 16, "eval": 64, "bench": 512},
          "det": {"calib": 16, "eval": 32, "bench": 256}, "magika": {"calib": 16, "eval": 60}}
BENCH = HERE / "bench"
BENCH_MANIFEST = HERE / "bench_manifest.json"

# The recognizer's dictionary holds these ASCII characters; text is drawn from them only.
KEYS = (HERE / "ppocr_keys.txt").read_text(encoding="utf-8").splitlines()
CHARSET = [c for c in "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c in KEYS]


def word(rng: np.random.Generator, low: int, high: int) -> str:
    return "".join(rng.choice(CHARSET, size=int(rng.integers(low, high + 1))))


def colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A light tinted background and a dark ink."""
    paper = tuple(int(v) for v in rng.integers(190, 256, size=3))
    ink = tuple(int(v) for v in rng.integers(0, 90, size=3))
    return paper, ink


def degrade(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A little blur and JPEG compression, as a photographed or scanned line has."""
    image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.0, 1.0))))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=int(rng.integers(60, 95)))
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def render_line(text: str, rng: np.random.Generator) -> Image.Image:
    font = ImageFont.truetype(str(FONTS[rng.integers(len(FONTS))]), int(rng.integers(24, 40)))
    left, top, right, bottom = font.getbbox(text)
    margin = [int(v) for v in rng.integers(2, 10, size=4)]
    paper, ink = colours(rng)
    image = Image.new("RGB", (right - left + margin[0] + margin[2], bottom - top + margin[1] + margin[3]), paper)
    ImageDraw.Draw(image).text((margin[0] - left, margin[1] - top), text, font=font, fill=ink)
    return degrade(image, rng)


def normalize(image: Image.Image) -> np.ndarray:
    """RGB image → BGR CHW float32 in [-1, 1], as RapidOCR feeds its models."""
    array = np.asarray(image, dtype=np.float32)[:, :, ::-1] / 255.0
    return ((array - 0.5) / 0.5).transpose(2, 0, 1)


def line_input(image: Image.Image, width: int) -> np.ndarray:
    """RapidOCR's resize_norm_img: height 48, width by aspect ratio (at most WIDTH), zero padding."""
    resized = min(width, int(np.ceil(48 * image.width / image.height)))
    out = np.zeros((3, 48, width), np.float32)
    out[:, :, :resized] = normalize(image.resize((resized, 48), Image.BILINEAR))
    return out


def rec_set(rng: np.random.Generator, count: int, split: str) -> tuple[dict, list]:
    texts = [word(rng, 4, 12) for _ in range(count)]
    return {"x": np.stack([line_input(render_line(t, rng), 320) for t in texts])}, texts


def cls_set(rng: np.random.Generator, count: int, split: str) -> tuple[dict, list]:
    labels = [int(i % 2) for i in range(count)]
    images = []
    for label in labels:
        image = render_line(word(rng, 3, 8), rng)
        images.append(line_input(image.rotate(180) if label else image, 192))
    return {"x": np.stack(images)}, labels


def det_page(rng: np.random.Generator, height: int = 256, width: int = 384) -> tuple[np.ndarray, list]:
    paper, ink = colours(rng)
    page = Image.new("RGB", (width, height), paper)
    draw = ImageDraw.Draw(page)
    boxes, y = [], int(rng.integers(8, 24))
    for _ in range(int(rng.integers(3, 6))):
        font = ImageFont.truetype(str(FONTS[rng.integers(len(FONTS))]), int(rng.integers(16, 30)))
        text = " ".join(word(rng, 3, 8) for _ in range(int(rng.integers(1, 4))))
        left, top, right, bottom = font.getbbox(text)
        if right - left > width - 16:
            continue
        x = int(rng.integers(8, width - 8 - (right - left) + 1))
        if y + bottom - top > height - 8:
            break
        draw.text((x - left, y - top), text, font=font, fill=ink)
        boxes.append([x, y, x + right - left, y + bottom - top])
        y += bottom - top + int(rng.integers(12, 30))
    return normalize(degrade(page, rng)), boxes


def det_set(rng: np.random.Generator, count: int, split: str) -> tuple[dict, list]:
    pages = [det_page(rng) for _ in range(count)]
    return {"x": np.stack([p for p, _ in pages])}, [b for _, b in pages]


# magika: content type → files of that type. Generated types are written from rendered text.
SITE = Path(np.__file__).resolve().parents[1]


def _image_bytes(fmt: str, rng: np.random.Generator) -> bytes:
    page = render_line(" ".join(word(rng, 3, 8) for _ in range(3)), rng)
    buffer = io.BytesIO()
    page.save(buffer, fmt)
    return buffer.getvalue()


def _text(rng: np.random.Generator) -> bytes:
    return "\n".join(" ".join(word(rng, 2, 9) for _ in range(8)) for _ in range(60)).encode()


def _zip(rng: np.random.Generator) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for i in range(3):
            archive.writestr(f"part{i}.txt", _text(rng))
    return buffer.getvalue()


def _json(rng: np.random.Generator) -> bytes:
    records = [{"id": int(rng.integers(1 << 20)), "name": word(rng, 4, 10), "score": float(rng.random()),
                "tags": [word(rng, 3, 6) for _ in range(3)]} for _ in range(40)]
    return json.dumps(records, indent=2).encode()


GENERATED = {"png": lambda rng: _image_bytes("PNG", rng), "jpeg": lambda rng: _image_bytes("JPEG", rng),
             "gif": lambda rng: _image_bytes("GIF", rng), "pdf": lambda rng: _image_bytes("PDF", rng),
             "zip": _zip, "gzip": lambda rng: gzip.compress(_text(rng), mtime=0), "json": _json}
FOUND = {"python": [SITE / "numpy", "*.py"], "c": [SITE / "numpy", "*.h"], "elf": [SITE / "numpy", "*.so"],
         "csv": [SITE / "numpy", "*.csv"], "markdown": [REPO / "docs", "*.md"], "proto": [SITE / "onnx", "*.proto"]}


def magika_features(content: bytes, size: int = 1024, block: int = 4096, pad: int = 256) -> np.ndarray:
    """magika 1.0.3's features: first/last `block` bytes, stripped, `size` of each, padded with 256."""
    beg = list(content[:block].lstrip()[:size])
    end = list(content[-block:].rstrip()[-size:])
    return np.array(beg + [pad] * (size - len(beg)) + [pad] * (size - len(end)) + end, np.int32)


def magika_files(split: str) -> list[tuple[str, Path]]:
    """The found files of each type, sorted; calibration takes even positions, evaluation odd ones."""
    files = []
    for label, (root, pattern) in FOUND.items():
        paths = sorted(p for p in root.rglob(pattern) if p.stat().st_size > 2048)
        files += [(label, p) for p in paths[(split == "eval")::2]]
    return files


def magika_set(rng: np.random.Generator, count: int, split: str) -> tuple[dict, list]:
    labels = sorted(set(FOUND) | set(GENERATED))
    rows, truth = [], []
    found = magika_files(split)
    for i in range(count):
        label = labels[i % len(labels)]
        if label in GENERATED:
            content, origin = GENERATED[label](rng), f"generated {label}"
        else:
            candidates = [p for kind, p in found if kind == label]
            path = candidates[int(rng.integers(len(candidates)))]
            content, origin = path.read_bytes(), str(path.relative_to(REPO if label == "markdown" else SITE))
        rows.append(magika_features(content))
        truth.append({"label": label, "origin": origin})
    return {"bytes": np.stack(rows)}, truth


MAKERS = {"rec": rec_set, "cls": cls_set, "det": det_set, "magika": magika_set}


def write(task: str, split: str, folder: Path) -> list[Path]:
    """TASK's SPLIT into FOLDER: the inputs, and for an evaluation split the truth."""
    inputs, truth = MAKERS[task](np.random.default_rng(SEEDS[split]), COUNTS[task][split], split)
    written = [folder / f"{task}_{split}.npz"]
    np.savez_compressed(written[0], **inputs)
    if split != "calib":
        written.append(folder / f"{task}_{split}_truth.json")
        written[1].write_text(json.dumps(truth, indent=0) + "\n")
    print(task, split, {k: v.shape for k, v in inputs.items()})
    return written


def bench(record: bool) -> None:
    """The bench split, checked against (or, with RECORD, written to) the manifest."""
    BENCH.mkdir(exist_ok=True)
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
               for task in COUNTS if "bench" in COUNTS[task] for p in write(task, "bench", BENCH)}
    if record:
        BENCH_MANIFEST.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        return
    recorded = json.loads(BENCH_MANIFEST.read_text())
    differ = sorted(name for name in recorded.keys() | digests.keys() if recorded.get(name) != digests.get(name))
    if differ:
        raise SystemExit(f"bench files differ from {BENCH_MANIFEST.name}: {', '.join(differ)} "
                         "(another Pillow or font version renders other pixels)")
    print(f"bench: {len(digests)} files match {BENCH_MANIFEST.name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["committed", "bench"], default="committed",
                        help="committed: the calib and eval sets next to this script; bench: the larger evaluation sets")
    parser.add_argument("--record", action="store_true", help="with --split bench: write the manifest")
    args = parser.parse_args()
    if args.split == "bench":
        bench(args.record)
        return
    for task in MAKERS:
        for split in ("calib", "eval"):
            write(task, split, HERE)


if __name__ == "__main__":
    main()
