"""Render `qdq compare --format html` of a real engine pair to a PNG in headless Chromium.

The check that the page reads in a browser (docs/compare.md) and the picture that page shows:

    python docs/render_compare.py                      # writes docs/compare.png
    python docs/render_compare.py --html /tmp/c.html --out /tmp/c.png --size 1280,6000

The pair is NVIDIA TREx's MobileNetV2 QAT on a TITAN RTX (TensorRT 8.4), with profiles: A has the
residual inputs quantized (good), B does not (bad).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIR = Path("tests/fixtures/trt/trex-v0.1.x/tests-inputs")  # relative to ROOT: the page shows these paths
GOOD, BAD = "mobilenet_v2_residuals.qat.onnx.engine", "mobilenet.qat.onnx.engine"
SIZE = (1280, 2000)


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def write_html(path: Path) -> None:
    """`qdq compare` on the pair, run from the repository root as a user would."""
    subprocess.run([sys.executable, "cli.py", "compare", str(PAIR / f"{GOOD}.graph.json"), str(PAIR / f"{BAD}.graph.json"),
                    "--profile-a", str(PAIR / f"{GOOD}.profile.json"), "--profile-b", str(PAIR / f"{BAD}.profile.json"),
                    "--format", "html", "-o", str(path.resolve())], cwd=ROOT, check=True)


def screenshot(html: Path, png: Path, size: tuple[int, int] = SIZE, chromium: str | None = None) -> None:
    """The top `size` pixels of the page. --no-sandbox: Chromium refuses to start as root (containers, CI)
    otherwise; the page is a local file without script."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise SystemExit("render_compare: no chromium found (install Debian's chromium, or pass --chromium PATH)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--no-first-run", f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                        f"--screenshot={png.resolve()}", html.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    if not png.exists():
        raise SystemExit(f"render_compare: chromium wrote no {png}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compare.png", help="PNG to write")
    parser.add_argument("--html", type=Path, help="also keep the HTML page here")
    parser.add_argument("--size", default=f"{SIZE[0]},{SIZE[1]}", help="window WIDTH,HEIGHT in pixels")
    parser.add_argument("--chromium", help="browser binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        html = args.html or Path(tmp) / "compare.html"
        write_html(html)
        screenshot(html, args.out, (width, height), args.chromium)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
