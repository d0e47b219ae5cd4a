"""Line charts as server-side SVG: plain Python, no JavaScript, no build step.

`line_chart` draws one or more series over the minutes of a `rollup.Window`; gaps
(None) break a line instead of drawing it down to zero. Each point is marked while
they are few enough to tell apart (`MARKED_POINTS`), so a lone point reads as a
point of its line; counts get whole-number ticks. Every label is escaped.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH = 620
HEIGHT = 210
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 26, 30
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
) -> SafeString:
    """An SVG line chart of `series`, one point per `step` minutes from `start`."""
    minutes = max((len(s.values) for s in series), default=0)  # points, in fact
    highest = max((v for s in series for v in s.values if v is not None), default=0)
    if label is count_label:
        top, tick = count_ticks(highest)
    else:
        top = nice_ceiling(highest)
        tick = top / GRID_ROWS
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    xs = [LEFT + plot_w * index / max(minutes - 1, 1) for index in range(minutes)]

    def x(index: int) -> float:
        return xs[index]

    def y(value: float) -> float:
        return TOP + plot_h - plot_h * min(value, top) / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pgqueue-chart" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="16" class="pgqueue-chart-title">{escape(title)}</text>',
    ]
    for row in range(round(top / tick) + 1):  # grid lines with their values
        value = tick * row
        py = y(value)
        parts.append(
            f'<line x1="{LEFT}" y1="{py:.1f}" x2="{WIDTH - RIGHT}" y2="{py:.1f}" '
            f'class="pgqueue-chart-grid"/>'
            f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end" '
            f'class="pgqueue-chart-axis">{escape(label(value))}</text>'
        )
    every = _tick_every(minutes * step)
    local = timezone.localtime(start)
    first = local.hour * 60 + local.minute  # minutes since local midnight
    for index in range(minutes):
        # Label the point whose minutes hold a multiple of `every` (since midnight).
        at = first + index * step
        offset = -at % every
        if offset >= step:
            continue
        hour, minute = divmod((at + offset) % 1440, 60)
        px = x(index)
        parts.append(
            f'<line x1="{px:.1f}" y1="{TOP + plot_h}" x2="{px:.1f}" y2="{TOP + plot_h + 4}" '
            f'class="pgqueue-chart-grid"/>'
            f'<text x="{px:.1f}" y="{HEIGHT - 10}" text-anchor="middle" '
            f'class="pgqueue-chart-axis">{hour:02d}:{minute:02d}</text>'
        )
    for s in series:
        for run in _runs(s.values):
            scale = plot_h / top
            points = " ".join(
                f"{xs[i]:.1f},{TOP + plot_h - scale * min(v, top):.1f}" for i, v in run
            )
            if len(run) > 1:
                parts.append(
                    f'<polyline points="{points}" fill="none" stroke="{s.color}" '
                    f'stroke-width="1.6" stroke-linejoin="round"/>'
                )
            if len(run) == 1 or minutes <= MARKED_POINTS:
                for i, v in run:
                    parts.append(
                        f'<circle class="pgqueue-chart-point" cx="{x(i):.1f}" cy="{y(v):.1f}" '
                        f'r="{3.5 if len(run) == 1 else 2.5}" fill="{s.color}">'
                        f"<title>{escape(s.label)}: {escape(label(v))}</title></circle>"
                    )
    legend_x = WIDTH - RIGHT
    for s in reversed(series):
        text = escape(s.label)
        legend_x -= 14 + 7 * len(s.label)
        parts.append(
            f'<rect x="{legend_x}" y="7" width="10" height="10" fill="{s.color}"/>'
            f'<text x="{legend_x + 14}" y="16" class="pgqueue-chart-axis">{text}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))


def _tick_every(minutes: int) -> int:
    """Minutes between two labelled ticks, for about eight labels."""
    for every in (5, 10, 15, 30, 60, 120, 180, 360):
        if minutes / every <= 8:
            return every
    return 720


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """Split a series into runs of consecutive known values."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for index, value in enumerate(values):
        if value is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((index, value))
    if current:
        runs.append(current)
    return runs
