"""What every HTML page of the scorer shares (the report, the verdict section, the summary): the style
sheet, escaping, numbers, and matplotlib figures inlined as SVG, so a page needs nothing beside it.
"""

from __future__ import annotations

import html
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere in the scorer: no display here
import matplotlib.pyplot as plt

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{margin-bottom:.2em} .verdict{font-size:1.4em;padding:.6em 1em;border-radius:6px;margin:1em 0}
.valid{background:#e3f6e5;border:1px solid #3a3} .invalid{background:#fde8e8;border:1px solid #c33}
table{border-collapse:collapse;margin:1em 0;font-size:.92em} td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3} .bad{color:#b00} .ok{color:#070} figure{margin:1em 0} .small{color:#666;font-size:.85em}
"""


def escape(x: Any) -> str:
    return html.escape("-" if x is None else str(x))


def number(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def inline_svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype
