"""A matplotlib figure as report output: inline SVG with hover titles, and PNG, byte-stable.

Figures are built with the object API (`matplotlib.figure.Figure`, never pyplot's global state)
under the house style `STYLE`, applied with `rc_context` while building and while saving
(matplotlib reads some settings, such as tick-label fonts, only when it draws).
"""

from __future__ import annotations

import functools
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import matplotlib
from cycler import cycler
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.collections import Collection
from matplotlib.figure import Figure

# Colour-blind-safe Okabe-Ito palette.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#666666")
BLUE, ORANGE, GREEN, RED, PURPLE, SKY, GREY = PALETTE
PNG_DPI = 200  # slides and papers; the SVG is resolution-free
STYLE: dict[str, Any] = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial", "Helvetica"],
    "font.size": 9,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.edgecolor": "#999999",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "axes.prop_cycle": cycler(color=PALETTE),
    "grid.color": "#e6e6e6",
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.edgecolor": "#cccccc",
    "svg.fonttype": "none",  # real <text>: small, selectable, drawn in the page's font
    "svg.hashsalt": "llmbench",  # clip-path and marker ids from the content, not from chance
}
# What matplotlib writes into an SVG by default: its name and URL, and today's date.
_NO_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
SVG, XLINK = "{http://www.w3.org/2000/svg}", "{http://www.w3.org/1999/xlink}"

F = TypeVar("F", bound=Callable[..., Any])


def styled(build: F) -> F:
    """Run a figure builder under the house style."""

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with matplotlib.rc_context(STYLE):
            return build(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class Plot:
    """One figure of a page: `key` is its HTML id and its PNG's name."""

    key: str
    figure: Figure
    caption: str


def new_axes(
    size_in: tuple[float, float], title: str, x_label: str, y_label: str, constrained: bool = True
) -> tuple[Figure, Axes]:
    """A figure of one titled axes; `constrained` lays out its margins to fit the labels."""
    figure = Figure(figsize=size_in, layout="constrained" if constrained else None)
    ax = figure.add_subplot()
    ax.set(title=title, xlabel=x_label, ylabel=y_label)
    return figure, ax


def hover(artists: Collection | Sequence[Artist], texts: Sequence[str]) -> None:
    """Hover texts for marks: one per point of a collection, or one per artist (bars).

    They ride in matplotlib's per-mark link slot, which the SVG writer wraps around each mark
    as <a href>; `svg` turns every such link into a <title> tooltip."""
    if isinstance(artists, Collection):
        artists.set_urls(list(texts))
    else:
        for artist, text in zip(artists, texts, strict=True):
            artist.set_url(text)


def svg(plot: Plot) -> str:
    """The figure as an inline-HTML <svg>: ids prefixed with the key (unique in the page), hover
    texts as <title> children, no XML prolog, namespace, metadata, link or URL."""
    buffer = io.StringIO()
    title = plot.figure.axes[0].get_title(loc="left") if plot.figure.axes else plot.key
    _save(plot.figure, buffer, format="svg", metadata={"Title": title, **_NO_METADATA})
    root = ET.fromstring(buffer.getvalue())
    for metadata in root.findall(f"{SVG}metadata"):  # a Dublin Core copy of the title
        root.remove(metadata)
    for link in list(root.iter(f"{SVG}a")):
        link.tag = f"{SVG}g"
        text = link.attrib[f"{XLINK}href"]
        link.attrib = {"class": "tip"}
        link.insert(0, ET.Element("title"))  # first: SVG's descriptive elements lead
        link[0].text = text
    for element in root.iter():
        element.tag = element.tag.removeprefix(SVG)
        if not (element.tail or "").strip():  # matplotlib's indentation: bytes, no meaning
            element.tail = None
        if not (element.text or "").strip():
            element.text = None
        for name, value in list(element.attrib.items()):
            del element.attrib[name]
            if name == "id":
                value = f"{plot.key}-{value}"
            elif name == f"{XLINK}href":  # SVG 2 reads a plain href
                name, value = "href", f"#{plot.key}-{value.removeprefix('#')}"
            element.set(name, re.sub(r"url\(#", f"url(#{plot.key}-", value))
    return ET.tostring(root, encoding="unicode")


def png(plot: Plot) -> bytes:
    """The figure at `PNG_DPI`, without the software tag (same figure, same bytes)."""
    buffer = io.BytesIO()
    _save(plot.figure, buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return buffer.getvalue()


def _save(figure: Figure, buffer: io.IOBase, **kwargs: Any) -> None:
    """`figure.savefig` under the house style, its layout then kept for its next save:
    matplotlib lays a figure out on a draw of its own before each save (a second draw), which
    the SVG and the PNG of one figure would each pay. Margins are in fractions of the figure,
    so one layout fits both."""
    with matplotlib.rc_context(STYLE):
        figure.savefig(buffer, **kwargs)
    figure.set_layout_engine("none")
