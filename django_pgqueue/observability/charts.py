"""Line charts for the admin's Charts page: what each chart shows, drawn by uPlot.

`line_chart` describes one chart of a `rollup.Window`: the time of each point, its
series (None breaks a line instead of drawing it down to zero), and the y axis, whose
top and ticks are chosen here (counts get whole-number ticks). The page hands the
descriptions to ``django_pgqueue/charts.js``, which draws them with the vendored uPlot
(``static/django_pgqueue/vendor/uplot-1.6.32``): readable labels at any width, the
values of every series at the cursor, drag to zoom, double-click to zoom out. Each
point is marked while a line has few enough to tell apart (`MARKED_POINTS`), and a
point alone between gaps is marked in any line.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Most points a line has for each to be marked (a day in 5-minute points is 288).
MARKED_POINTS = 90
# Most horizontal grid lines above zero.
GRID_ROWS = 4


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    values: Sequence[float | None]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= value (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power:
            return step * power
    return 10 * power


def count_ticks(value: float) -> tuple[float, float]:
    """(top, step) of a count axis: whole-number ticks, at most GRID_ROWS above zero."""
    whole = max(1, math.ceil(value))
    if whole <= GRID_ROWS:
        return float(whole), 1.0
    power = 10 ** math.floor(math.log10(whole / GRID_ROWS))
    # Whole steps of 1, 2, 2.5 or 5 times a power of ten; the one whose top is lowest.
    steps = [base * power for base in (1, 2, 2.5, 5, 10) if (base * power) % 1 == 0]
    fitting = [step for step in steps if 2 <= math.ceil(whole / step) <= GRID_ROWS]
    step = min(fitting, key=lambda step: (step * math.ceil(whole / step), step))
    return float(step * math.ceil(whole / step)), float(step)


def count_label(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def seconds_label(value: float) -> str:
    if value == 0:
        return "0"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:g} s"
    if value < 7200:
        return f"{value / 60:g} min"
    return f"{value / 3600:g} h"


def line_chart(
    title: str,
    start: dt.datetime,
    series: Sequence[Series],
    label: Callable[[float], str] = count_label,
    step: int = 1,
) -> dict[str, Any]:
    """Describe a line chart of `series`, one point per `step` minutes from `start`, for
    charts.js: plain JSON values only."""
    points = max((len(s.values) for s in series), default=0)
    highest = max((v for s in series for v in s.values if v is not None), default=0)
    if label is count_label:
        top, tick = count_ticks(highest)
    else:
        top = nice_ceiling(highest)
        tick = top / GRID_ROWS
    first = start.timestamp()
    return {
        "title": title,
        "unit": "count" if label is count_label else "seconds",
        "times": [first + index * step * 60 for index in range(points)],
        "series": [{"label": s.label, "color": s.color, "values": list(s.values)} for s in series],
        "top": top,
        "ticks": [[tick * row, label(tick * row)] for row in range(round(top / tick) + 1)],
        "marked": points <= MARKED_POINTS,
    }
