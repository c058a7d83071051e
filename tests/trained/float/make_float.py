"""The float models of the trained corpus, taken out of the PyPI wheels that ship them.

PP-OCR (text detection, recognition, direction classification) comes from `rapidocr-onnxruntime`
and the file-type classifier from `magika`; both wheels are Apache-2.0. The files are copied
byte for byte and checked against the sha256 in `manifest.json`, so a re-run writes the same
files. The recognizer's character dictionary (stored in its ONNX metadata) is written to
`../data/ppocr_keys.txt` so the metric needs no onnx metadata that a quantizer might drop, and
magika's output labels (its model's `config.min.json`) to `../data/magika_labels.json`.

    python tests/trained/float/make_float.py [--wheels DIR]

Without --wheels the two wheels are fetched with `pip download --no-deps` (needs PyPI). Files
larger than the corpus's size limit are not committed (`.gitignore`): this script brings them back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wheel(folder: Path, package: str, version: str) -> Path:
    """The wheel of PACKAGE==VERSION in FOLDER, downloaded there first if it is missing."""
    stem = package.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(folder),
                        f"{package}=={version}"], check=True)
        found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="folder holding (or receiving) the wheels")
    args = parser.parse_args()
    manifest = json.loads((HERE / "manifest.json").read_text())
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.wheels or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for entry in manifest:
            package, version = entry["wheel"].split("==")
            with zipfile.ZipFile(wheel(folder, package, version)) as archive:
                (HERE / entry["file"]).write_bytes(archive.read(entry["member"]))
                if entry["task"] == "magika":
                    config = json.loads(archive.read(entry["member"].replace("model.onnx", "config.min.json")))
                    (DATA / "magika_labels.json").write_text(json.dumps(config["target_labels_space"]) + "\n")
            digest = sha256(HERE / entry["file"])
            if digest != entry["sha256"]:
                sys.exit(f"{entry['file']}: sha256 {digest}, manifest says {entry['sha256']}")
            print(f"{entry['file']}: {digest}")
    rec = onnx.load(HERE / "ppocr_rec.onnx", load_external_data=False)
    keys = {prop.key: prop.value for prop in rec.metadata_props}["character"]
    (DATA / "ppocr_keys.txt").write_text(keys, encoding="utf-8")


if __name__ == "__main__":
    main()
