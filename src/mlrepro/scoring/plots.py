"""matplotlib as the scorer's plots use it: no display, text kept as text in SVG. Apart from the page's
number formatting (mlrepro.scoring.page) so that what only judges or formats never loads matplotlib
(the dry run's plan lines are made in every `snakemake -n`)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere in the scorer: no display here
import matplotlib.pyplot as plt

# Text stays text in the SVG (a page's fonts, smaller files, labels a reader or a test can select).
matplotlib.rcParams["svg.fonttype"] = "none"

__all__ = ["inline_svg", "plt"]


def inline_svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype
