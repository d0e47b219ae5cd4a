"""When a schedule ticks: cron expressions in a time zone, or fixed intervals.

Pure computation, no database. Cron expressions are read by cronsim and evaluated on
the wall clock of the schedule's zone, so DST behaves like Debian's cron: a time that
does not exist on a spring-forward day (02:30 in Berlin) runs once, at the first
instant after the gap; a time that happens twice on a fall-back day runs once, at its
first occurrence; a field with a wildcard hour ("0 * * * *") ticks once per real
hour, 23 times on a spring-forward day and 25 on a fall-back day. Intervals
(``every``) are counted from the Unix epoch in UTC, so "every 5 minutes" falls on
:00, :05, ... whatever the zone, and ignores DST.

Ticks are whole seconds, timezone-aware and returned in UTC.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)
_LOOK_BACK = tuple(
    dt.timedelta(seconds=s) for s in (120, 7_200, 172_800, 3_456_000, 34_560_000, 290_000_000)
)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; ValueError naming it if it is unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"unknown time zone {name!r} (expected an IANA name)") from None


def check_cron(expr: str) -> None:
    """Raise ValueError naming the problem if cronsim cannot read `expr`."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError(f"invalid cron expression {expr!r}: it is empty")
    try:
        CronSim(expr, dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
    except CronSimError as exc:
        raise ValueError(f"invalid cron expression {expr!r}: {exc}") from None


class Ticks:
    """The tick times of one schedule: a cron expression in a zone, or an interval."""

    __slots__ = ("cron", "every", "zone")

    def __init__(
        self, *, cron: str | None = None, every: dt.timedelta | None = None, timezone: str = "UTC"
    ) -> None:
        if (cron is None) == (every is None):
            raise ValueError("a schedule needs exactly one of cron and every")
        if cron is not None:
            check_cron(cron)
        if every is not None and (
            every < dt.timedelta(seconds=1) or every % dt.timedelta(seconds=1)
        ):
            raise ValueError(f"every must be a whole number of seconds >= 1, got {every!r}")
        self.cron = cron
        self.every = every
        self.zone = zone(timezone)

    def after(self, instant: dt.datetime) -> dt.datetime:
        """The first tick strictly after `instant`."""
        if self.every is not None:
            steps = (instant - EPOCH) // self.every
            return EPOCH + (steps + 1) * self.every
        assert self.cron is not None
        # Started inside a fall-back day's repeated hour, cronsim reads the wall time
        # as its first occurrence and may yield a time before `instant`: skip those.
        for local in CronSim(self.cron, instant.astimezone(self.zone)):
            tick = local.astimezone(dt.timezone.utc)
            if tick > instant:
                return tick
        raise ValueError(f"cron expression {self.cron!r} never ticks again")  # pragma: no cover

    def at_or_before(self, instant: dt.datetime) -> dt.datetime:
        """The last tick at or before `instant`."""
        if self.every is not None:
            return EPOCH + ((instant - EPOCH) // self.every) * self.every
        # Walked forwards from a little before `instant` (cronsim's reverse walk reads
        # a fall-back day's repeated hour as its first occurrence), widening the look
        # back until a tick turns up.
        for window in _LOOK_BACK:
            tick = self.after(instant - window)
            if tick > instant:
                continue
            while (following := self.after(tick)) <= instant:
                tick = following
            return tick
        raise ValueError(f"cron expression {self.cron!r} has not ticked in 8 years")

    def count(self, start: dt.datetime, end: dt.datetime, limit: int) -> int:
        """How many ticks t have start <= t <= end, up to `limit`: by arithmetic for an
        interval (any gap, at once), by walking at most `limit` ticks for a cron."""
        if self.every is None:
            return len(self.between(start, end, limit))
        first = self.after(start - _MICROSECOND)
        return 0 if first > end else min(limit, (end - first) // self.every + 1)

    def between(self, start: dt.datetime, end: dt.datetime, limit: int) -> list[dt.datetime]:
        """Ticks t with start <= t <= end, at most `limit` of them (the earliest)."""
        found: list[dt.datetime] = []
        tick = self.after(start - _MICROSECOND)
        while tick <= end and len(found) < limit:
            found.append(tick)
            tick = self.after(tick)
        return found


def describe_cron(expr: str) -> str:
    """Read a cron expression out in words, as cronsim explains it: '0 3 * * *' is
    'At 03:00 every day'. The expression itself for one cronsim cannot read."""
    try:
        return CronSim(expr, dt.datetime(2000, 1, 1)).explain()
    except (CronSimError, ValueError, AttributeError):
        return expr
