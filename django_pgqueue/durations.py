"""Parse the durations operators type: ``7d``, ``12h``, ``30m``, ``90s``, ``1h30m``."""

from __future__ import annotations

import datetime as dt
import re

from . import validators

_UNITS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)([wdhms])")
_WHOLE = re.compile(r"(?:\d+[wdhms])+")


def parse_duration(text: str, *, allow_zero: bool = False) -> dt.timedelta:
    """Turn '7d', '12h', '30m', '90s' or a sum such as '1h30m' into a timedelta.

    It must be positive, or zero ('0s') where `allow_zero` says zero means something.
    """
    cleaned = text.strip().lower()
    if not _WHOLE.fullmatch(cleaned):
        raise ValueError(
            f"{text!r} is not a duration: expected a number and a unit (w, d, h, m or s), "
            "e.g. 7d, 12h, 30m, 90s or 1h30m."
        )
    seconds = sum(int(number) * _UNITS[unit] for number, unit in _PART.findall(cleaned))
    if seconds <= 0 and not (allow_zero and seconds == 0):
        raise ValueError(f"{text!r} is not a duration: it must be longer than zero.")
    # Bounded like every duration of the queue: now() - 20,000 years is out of
    # PostgreSQL's range, and 10**12 weeks out of timedelta's.
    return dt.timedelta(
        seconds=validators.seconds(seconds, f"the duration {text!r}", allow_zero=allow_zero)
    )


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """Return '1 job' or '3 jobs': a count with its noun in the right number."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def format_seconds(seconds: float | None) -> str:
    """Render an age compactly for people: '45s', '12m 3s', '3h 4m', '2d 5h'."""
    if seconds is None:
        return "—"
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"
