"""A small chart maker that writes inline SVG: axes (linear or log), lines, points, bars.

Reports must open offline from one file with no JavaScript, so plots are SVG text embedded in
the HTML rather than images from a plotting library or a CDN. This covers what llmbench draws
(roofline, CDFs, histograms, timelines, waterfalls) and nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

# Phase and series colours (colour-blind-safe Okabe-Ito palette).
BLUE, ORANGE, GREEN, RED, PURPLE, SKY, YELLOW, GREY = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#666666",
)
PALETTE = (BLUE, ORANGE, GREEN, RED, PURPLE, SKY, GREY)

_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 64, 16, 30, 44


def si(value: float, unit: str = "") -> str:
    """1234 → '1.23k', 2.5e12 → '2.5T' (three significant digits), with an optional unit."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}{unit}"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{prefix}{unit}"
    if abs(value) >= 1e-3 or unit == "":
        return f"{value:.3g}{unit}"
    return f"{value:.2e}{unit}"


@dataclass(frozen=True)
class Scale:
    """Maps data values in [lo, hi] to a 0..1 fraction, linearly or in log10."""

    lo: float
    hi: float
    is_log: bool = False

    @staticmethod
    def fit(values: Sequence[float], is_log: bool = False, zero: bool = True) -> Scale:
        """A scale that holds every finite value (positive ones on a log scale), with headroom."""
        finite = [v for v in values if math.isfinite(v) and (v > 0 or not is_log)]
        if not finite:
            return Scale(1.0, 10.0, is_log) if is_log else Scale(0.0, 1.0)
        lo, hi = min(finite), max(finite)
        if is_log:
            lo_exp, hi_exp = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
            return Scale(10.0**lo_exp, 10.0 ** max(hi_exp, lo_exp + 1), True)
        if zero:
            lo = min(lo, 0.0)
        if hi == lo:
            hi = lo + (abs(lo) or 1.0)
        return Scale(lo, hi + (hi - lo) * 0.05)

    def frac(self, value: float) -> float:
        if self.is_log:
            value = max(value, self.lo * 1e-3)
            return (math.log10(value) - math.log10(self.lo)) / (
                math.log10(self.hi) - math.log10(self.lo)
            )
        return (value - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[float]:
        """Round values inside the range: decades on a log scale, 1/2/5·10^k steps otherwise."""
        if self.is_log:
            first, last = math.ceil(math.log10(self.lo)), math.floor(math.log10(self.hi))
            step = max(1, math.ceil((last - first + 1) / 8))
            return [10.0**e for e in range(first, last + 1, step)]
        raw = (self.hi - self.lo) / 6
        magnitude = 10 ** math.floor(math.log10(raw))
        step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
        start = math.ceil(self.lo / step) * step
        count = int((self.hi - start) / step + 1e-9) + 1
        return [start + i * step for i in range(count)]


@dataclass
class Chart:
    """One plot: call `line`, `points`, `bars`, `label`, then `svg()`."""

    title: str
    x_label: str
    y_label: str
    x: Scale
    y: Scale
    width: int = 640
    height: int = 340
    legend_at_bottom: bool = False  # legend in the bottom-right corner instead of the top-right
    y_tick_labels: dict[float, str] | None = None  # text at chosen y values instead of numbers
    _body: list[str] = field(default_factory=list)
    _legend: list[tuple[str, str, str]] = field(default_factory=list)  # (label, colour, kind)

    @property
    def _plot_w(self) -> float:
        return self.width - _MARGIN_LEFT - _MARGIN_RIGHT

    @property
    def _plot_h(self) -> float:
        return self.height - _MARGIN_TOP - _MARGIN_BOTTOM

    def px(self, x: float) -> float:
        return _MARGIN_LEFT + self.x.frac(x) * self._plot_w

    def py(self, y: float) -> float:
        return _MARGIN_TOP + (1 - self.y.frac(y)) * self._plot_h

    def _in_view(self, x: float | None, y: float | None) -> bool:
        """Whether a value can be drawn: known (not None), finite, positive on a log axis."""
        return (
            x is not None
            and y is not None
            and math.isfinite(x)
            and math.isfinite(y)
            and (not self.x.is_log or x > 0)
            and (not self.y.is_log or y > 0)
        )

    def line(
        self,
        xs: Sequence[float],
        ys: Sequence[float],
        colour: str,
        label: str | None = None,
        dash: str | None = None,
        width: float = 1.8,
        step: bool = False,
    ) -> None:
        """A polyline through (x, y) pairs; `step` draws a staircase (a CDF, a counter)."""
        pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if self._in_view(x, y)]
        if not pairs:
            return
        coords = []
        for i, (x, y) in enumerate(pairs):
            if step and i:
                coords.append(f"{self.px(x):.1f},{self.py(pairs[i - 1][1]):.1f}")
            coords.append(f"{self.px(x):.1f},{self.py(y):.1f}")
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        self._body.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="{width}"{dash_attr} '
            f'points="{" ".join(coords)}"/>'
        )
        if label:
            self._legend.append((label, colour, "dash" if dash else "line"))

    def points(
        self,
        xs: Sequence[float | None],
        ys: Sequence[float | None],
        colour: str,
        label: str | None = None,
        radii: Sequence[float] | None = None,
        opacity: float = 0.55,
    ) -> None:
        radii = radii or [3.0] * len(xs)
        circles = [
            f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="{r:.1f}"/>'
            for x, y, r in zip(xs, ys, radii, strict=True)
            if self._in_view(x, y)
        ]
        if not circles:
            return
        self._body.append(
            f'<g fill="{colour}" fill-opacity="{opacity}" stroke="{colour}" stroke-width="0.5">'
            + "".join(circles)
            + "</g>"
        )
        if label:
            self._legend.append((label, colour, "point"))

    def bars(
        self, edges: Sequence[float], counts: Sequence[float], colour: str, label: str | None = None
    ) -> None:
        """A histogram: bar i spans edges[i]..edges[i+1] with height counts[i]."""
        base = self.py(max(self.y.lo, 0) if not self.y.is_log else self.y.lo)
        rects = []
        for lo, hi, count in zip(edges, edges[1:], counts, strict=False):
            if count <= 0:
                continue
            x0, x1, top = self.px(lo), self.px(hi), self.py(count)
            rects.append(
                f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
                f'height="{max(base - top, 0):.1f}"/>'
            )
        self._body.append(f'<g fill="{colour}" fill-opacity="0.8">' + "".join(rects) + "</g>")
        if label:
            self._legend.append((label, colour, "bar"))

    def span(self, x0: float, x1: float, y: float, height_px: float, colour: str) -> None:
        """A horizontal bar from x0 to x1 centred on y (waterfalls)."""
        left, right = self.px(x0), self.px(x1)
        self._body.append(
            f'<rect x="{left:.1f}" y="{self.py(y) - height_px / 2:.1f}" '
            f'width="{max(right - left, 1.0):.1f}" height="{height_px:.1f}" fill="{colour}"/>'
        )

    def legend_entry(self, label: str, colour: str, kind: str = "bar") -> None:
        self._legend.append((label, colour, kind))

    def label(
        self, x: float, y: float, text: str, colour: str = GREY, anchor: str = "start"
    ) -> None:
        """Text at a data position, nudged up and right of it."""
        if not self._in_view(x, y):
            return
        self._body.append(
            f'<text x="{self.px(x) + 4:.1f}" y="{self.py(y) - 5:.1f}" fill="{colour}" '
            f'font-size="11" text-anchor="{anchor}">{escape(text)}</text>'
        )

    def svg(self) -> str:
        w, h = self.width, self.height
        left, top = _MARGIN_LEFT, _MARGIN_TOP
        right, bottom = left + self._plot_w, top + self._plot_h
        parts = [
            # Inline in HTML5 an <svg> needs no xmlns: the report names no URL at all.
            f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            'font-family="sans-serif">',
            f"<title>{escape(self.title)}</title>",
            f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fff"/>',
            f'<text x="{left}" y="18" font-size="13" font-weight="bold">'
            f"{escape(self.title)}</text>",
        ]
        grid = []
        for tick in self.x.ticks():
            x = self.px(tick)
            grid.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>')
            parts.append(
                f'<text x="{x:.1f}" y="{bottom + 15}" font-size="11" text-anchor="middle">'
                f"{escape(si(tick))}</text>"
            )
        y_ticks = self.y_tick_labels or {t: si(t) for t in self.y.ticks()}
        for tick, text in y_ticks.items():
            y = self.py(tick)
            grid.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
            parts.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
                f"{escape(text)}</text>"
            )
        parts.append('<g stroke="#e3e3e3" stroke-width="1">' + "".join(grid) + "</g>")
        parts.append(
            f'<rect x="{left}" y="{top}" width="{self._plot_w}" height="{self._plot_h}" '
            'fill="none" stroke="#999"/>'
        )
        parts.append(
            f'<svg x="{left}" y="{top}" width="{self._plot_w}" height="{self._plot_h}" '
            f'viewBox="{left} {top} {self._plot_w} {self._plot_h}" overflow="hidden">'
        )
        parts += self._body
        parts.append("</svg>")
        parts.append(
            f'<text x="{(left + right) / 2:.1f}" y="{h - 8}" font-size="12" '
            f'text-anchor="middle">{escape(self.x_label)}</text>'
        )
        parts.append(
            f'<text x="14" y="{(top + bottom) / 2:.1f}" font-size="12" text-anchor="middle" '
            f'transform="rotate(-90 14 {(top + bottom) / 2:.1f})">{escape(self.y_label)}</text>'
        )
        parts += self._legend_svg(right)
        parts.append("</svg>")
        return "\n".join(parts)

    def _legend_svg(self, right: float) -> list[str]:
        """Legend entries stacked in the top-right corner of the plot area."""
        if not self._legend:
            return []
        box_w = 30 + 6.2 * max(len(label) for label, _, _ in self._legend)
        box_h = 16 * len(self._legend) + 4
        x0 = right - 6 - box_w
        y0 = _MARGIN_TOP + 4
        if self.legend_at_bottom:
            y0 = _MARGIN_TOP + self._plot_h - 4 - box_h
        parts = [
            f'<rect x="{x0:.1f}" y="{y0}" width="{box_w:.1f}" height="{box_h}" fill="#fff" '
            'fill-opacity="0.85" stroke="#ccc"/>'
        ]
        for i, (label, colour, kind) in enumerate(self._legend):
            y = y0 + 14 + 16 * i
            if kind == "point":
                mark = f'<circle cx="{x0 + 12:.1f}" cy="{y - 4}" r="4" fill="{colour}"/>'
            elif kind in ("line", "dash"):
                dash = ' stroke-dasharray="6 4"' if kind == "dash" else ""
                mark = (
                    f'<line x1="{x0 + 4:.1f}" y1="{y - 4}" x2="{x0 + 20:.1f}" y2="{y - 4}" '
                    f'stroke="{colour}" stroke-width="2"{dash}/>'
                )
            else:
                mark = (
                    f'<rect x="{x0 + 7:.1f}" y="{y - 9}" width="10" height="10" fill="{colour}"/>'
                )
            parts.append(
                mark + f'<text x="{x0 + 25:.1f}" y="{y}" font-size="11">{escape(label)}</text>'
            )
        return parts
