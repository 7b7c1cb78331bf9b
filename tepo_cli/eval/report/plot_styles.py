"""One (colour, line style) per group, never repeated within a figure.

Colour alone runs out at ten (matplotlib's tab10), and a repeated colour makes two groups one to
the eye; a line style alone is hard to tell apart beyond four. Pairing group i with colour
i mod 10 and style i mod 7 gives 70 distinct pairs (10 and 7 are coprime, so by the Chinese
remainder theorem i ↦ (i mod 10, i mod 7) is one-to-one for i < 70), and neighbouring groups
differ in both. Past 70 groups a marker is added, so (colour, style, marker) stays unique. The
reference group of a comparison is black and solid, a colour outside the cycle (plots.py).
"""

from __future__ import annotations

from dataclasses import dataclass

COLOURS = tuple(f"C{i}" for i in range(10))
# matplotlib line styles: named ones first, then dash patterns (offset, (on, off, ...)) in points
LineStyle = str | tuple[float, tuple[float, ...]]
LINE_STYLES: tuple[LineStyle, ...] = (
    "solid",
    (0, (5, 2)),
    (0, (1, 1.5)),
    (0, (6, 2, 1, 2)),
    (0, (2, 2)),
    (0, (8, 2, 1, 2, 1, 2)),
    (0, (3, 1, 1, 1)),
)
MARKERS = (".", "o", "s", "^", "v", "D", "P", "X")
DISTINCT_PAIRS = len(COLOURS) * len(LINE_STYLES)


@dataclass(frozen=True)
class Style:
    colour: str
    line_style: LineStyle
    marker: str
    note: str = ""  # added to the group's legend entry


REFERENCE_STYLE = Style("black", "solid", ".", " (reference)")


def style_of(index: int) -> Style:
    """The style of the figure's `index`-th group (0-based)."""
    marker = MARKERS[(index // DISTINCT_PAIRS) % len(MARKERS)]
    return Style(COLOURS[index % len(COLOURS)], LINE_STYLES[index % len(LINE_STYLES)], marker)
