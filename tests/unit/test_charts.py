"""The admin's SVG line charts: time labels follow the window and its step."""

from __future__ import annotations

import datetime as dt
import re

from django.utils import timezone

from django_pgqueue.observability.charts import Series, line_chart


def time_labels(svg: str) -> list[str]:
    return re.findall(r">(\d\d:\d\d)</text>", svg)


def test_six_hours_of_minutes_are_labelled_every_hour_within_the_window() -> None:
    start = dt.datetime(2026, 11, 30, 16, 35, tzinfo=dt.UTC)
    with timezone.override(dt.UTC):
        svg = line_chart("q", start, [Series("completed", "#000", [1.0] * 360)])
    assert time_labels(svg) == ["17:00", "18:00", "19:00", "20:00", "21:00", "22:00"]


def test_a_day_of_five_minute_points_is_labelled_every_three_hours() -> None:
    start = dt.datetime(2026, 11, 29, 22, 40, tzinfo=dt.UTC)
    with timezone.override(dt.UTC):
        svg = line_chart("q", start, [Series("completed", "#000", [1.0] * 288)], step=5)
    assert time_labels(svg) == [
        "00:00", "03:00", "06:00", "09:00", "12:00", "15:00", "18:00", "21:00"
    ]  # fmt: skip


def axis_labels(svg: str) -> list[str]:
    return re.findall(r'text-anchor="end" class="pgqueue-chart-axis">([^<]+)</text>', svg)


def test_counts_get_whole_number_ticks() -> None:
    start = dt.datetime(2026, 11, 30, 16, 35, tzinfo=dt.UTC)
    for values, ticks in (
        ([0, 1, 3, 5], ["0", "2", "4", "6"]),
        ([1, 2], ["0", "1", "2"]),
        ([0, 38], ["0", "10", "20", "30", "40"]),
        ([420], ["0", "250", "500"]),
    ):
        svg = line_chart("q", start, [Series("completed", "#000", values)])
        assert axis_labels(svg) == ticks, values


def test_each_point_is_marked_and_a_lone_point_stands_out() -> None:
    start = dt.datetime(2026, 11, 30, 16, 35, tzinfo=dt.UTC)
    svg = line_chart("q", start, [Series("completed", "#000", [None, 4, None, 2, 3, None])])
    points = re.findall(r'<circle class="pgqueue-chart-point"[^>]* r="([\d.]+)"', svg)
    # The lone 4, then the line 2-3, every point marked (the lone one larger).
    assert points == ["3.5", "2.5", "2.5"]
    assert svg.count("<polyline") == 1
    assert "<title>completed: 4</title>" in svg
    # A day in 5-minute points is a line, its points too many to mark.
    dense = line_chart("q", start, [Series("completed", "#000", [1.0] * 288)], step=5)
    assert "pgqueue-chart-point" not in dense
