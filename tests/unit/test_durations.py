"""Durations the ops commands accept, and ages the admin prints. No database."""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue.durations import format_seconds, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 604_800),
        ("12h", 43_200),
        ("30m", 1_800),
        ("90s", 90),
        ("1h30m", 5_400),
        ("2w", 1_209_600),
        (" 7D ", 604_800),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "-7d", "7 d", "1.5h", "0s", "0d0h"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "—"), (0.4, "0s"), (45, "45s"), (723, "12m 3s"), (11_040, "3h 4m"), (190_800, "2d 5h")],
)
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text
