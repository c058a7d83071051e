"""The scripts and data the HTML reports inline: the vendored dagre layout library and qdq's drawing code.

Inlined rather than linked, so a report stays one file that opens without network access. dagre
(@dagrejs/dagre 3.1.3, MIT) is vendored unchanged in `assets/`; `assets/README.md` says where it
came from and how to update it.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any

LIBRARY = "dagre.min.js"
DRAWING = "graph.js"  # qdq's layout-and-draw helper, used by every page script


@cache
def _asset(name: str) -> str:
    text = files("qdq.reports").joinpath("assets", name).read_text("utf-8")
    # A source-map comment would only make a browser's developer tools look for a file that is not there.
    return "\n".join(line for line in text.splitlines() if not line.startswith("//# sourceMappingURL="))


def scripts(page_script: str) -> str:
    """`<script>` elements for dagre, the drawing helper and one page's script, in that order."""
    return "".join(f"<script>{_asset(name)}</script>" for name in (LIBRARY, DRAWING, page_script))


def json_data(element_id: str, data: Any) -> str:
    """Data for a page script, as a JSON `<script>` element; `<` escaped so no string can end the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return f"<script type='application/json' id='{element_id}'>{text}</script>"
