"""What the admin's charts are given to draw: point times, whole-number count ticks,
marked points."""

from __future__ import annotations

import datetime as dt

from django_pgqueue.observability.charts import Series, line_chart, seconds_label

START = dt.datetime(2026, 11, 30, 16, 35, tzinfo=dt.UTC)


def tick_labels(chart: dict) -> list[str]:
    return [label for _, label in chart["ticks"]]


def test_each_point_has_its_time_a_step_apart() -> None:
    chart = line_chart("q", START, [Series("completed", "#000", [1.0] * 288)], step=5)
    times = chart["times"]
    assert len(times) == 288
    assert times[0] == START.timestamp()
    assert times[1] - times[0] == 300
    assert chart["unit"] == "count"


def test_counts_get_whole_number_ticks() -> None:
    for values, ticks in (
        ([0, 1, 3, 5], ["0", "2", "4", "6"]),
        ([1, 2], ["0", "1", "2"]),
        ([0, 38], ["0", "10", "20", "30", "40"]),
        ([420], ["0", "250", "500"]),
        ([None, 3.8, None], ["0", "1", "2", "3", "4"]),
    ):
        chart = line_chart("q", START, [Series("completed", "#000", values)])
        assert tick_labels(chart) == ticks, values
        assert chart["top"] == float(ticks[-1])


def test_seconds_get_their_unit() -> None:
    chart = line_chart("q", START, [Series("p95", "#000", [0.3, None])], seconds_label)
    assert chart["unit"] == "seconds"
    assert tick_labels(chart) == ["0", "125 ms", "250 ms", "375 ms", "500 ms"]


def test_points_are_marked_while_a_line_has_few() -> None:
    short = line_chart("q", START, [Series("completed", "#000", [None, 4, None, 2, 3, None])])
    assert short["marked"] is True
    # The gaps stay gaps (None), not zeros.
    assert short["series"][0]["values"] == [None, 4, None, 2, 3, None]
    dense = line_chart("q", START, [Series("completed", "#000", [1.0] * 288)], step=5)
    assert dense["marked"] is False  # charts.js then marks only the lone points
