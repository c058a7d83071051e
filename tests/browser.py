"""A real browser for the tests that look at a page as a person would: headless Chromium through
docs/render_pages.py (the script that makes the pictures in docs/), and PNGs read back without Pillow.

CI machines have no Chromium: tests that need it are marked `needs_chromium` and skip there.
"""

from __future__ import annotations

import importlib.util
import struct
import zlib
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "render_pages", Path(__file__).resolve().parent.parent / "docs" / "render_pages.py")
RENDER = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(RENDER)

CHROMIUM = RENDER.find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on this machine (Debian: apt-get install chromium); pages are checked "
    "in a real browser only where one is installed")


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows of an 8-bit RGB or RGBA PNG, decoded with zlib (no Pillow needed)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[pos + 8:pos + 21])
            assert (depth, interlace) == (8, 0) and colour in (2, 6)
        elif kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = row[i - bpp] if i >= bpp else 0
            up, corner = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + left) & 255
            elif kind == 2:
                row[i] = (row[i] + up) & 255
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                row[i] = (row[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(row))
        previous = row
    return width, height, [bytes(r[i:i + 3]) for r in rows for i in range(0, stride, bpp)]


