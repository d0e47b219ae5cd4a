"""When schedules tick: cron in a real zone over DST days, intervals, and what fires."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from zoneinfo import ZoneInfo

import pytest

from django_pgqueue.context import JobContext
from django_pgqueue.schedules.firing import BURST_LIMIT, MISSED_COUNT_CAP, plan, tick_key
from django_pgqueue.schedules.spec import ScheduleSpec, from_handler, from_mapping
from django_pgqueue.schedules.ticks import Ticks, describe_cron

UTC = dt.UTC


def local_day(zone: str, year: int, month: int, day: int) -> tuple[dt.datetime, dt.datetime]:
    """The UTC instants where a local calendar day of `zone` starts and the next one starts."""
    tz = ZoneInfo(zone)
    start = dt.datetime(year, month, day, tzinfo=tz)
    end = dt.datetime.combine(start.date() + dt.timedelta(days=1), dt.time(), tzinfo=tz)
    return start.astimezone(UTC), end.astimezone(UTC)


def runs_on(ticks: Ticks, zone: str, year: int, month: int, day: int) -> list[dt.datetime]:
    start, end = local_day(zone, year, month, day)
    return ticks.between(start, end - dt.timedelta(microseconds=1), 1000)


# (zone, spring-forward day, fall-back day, the hour that happens twice that day) in 2026.
ZONES = [
    ("Europe/Berlin", (2026, 3, 29), (2026, 10, 25), 2),
    ("America/New_York", (2026, 3, 8), (2026, 11, 1), 1),
]


@pytest.mark.parametrize(("zone", "spring", "autumn", "repeated"), ZONES)
def test_a_daily_job_at_a_time_that_does_not_exist_runs_once_after_the_gap(
    zone, spring, autumn, repeated
):
    daily = Ticks(cron="30 2 * * *", timezone=zone)
    tz = ZoneInfo(zone)
    (run,) = runs_on(daily, zone, *spring)
    # 02:30 does not exist that day: it runs at the first instant after the gap, 03:00.
    assert run.astimezone(tz).replace(tzinfo=None) == dt.datetime(*spring, 3, 0)
    for ordinary in [(2026, 1, 15), (2026, 7, 15), autumn]:
        (run,) = runs_on(daily, zone, *ordinary)
        assert run.astimezone(tz).replace(tzinfo=None) == dt.datetime(*ordinary, 2, 30)


@pytest.mark.parametrize(("zone", "spring", "autumn", "repeated"), ZONES)
def test_a_daily_job_at_a_time_that_happens_twice_runs_once_at_the_first(
    zone, spring, autumn, repeated
):
    daily = Ticks(cron=f"30 {repeated} * * *", timezone=zone)
    tz = ZoneInfo(zone)
    (run,) = runs_on(daily, zone, *autumn)
    local = run.astimezone(tz)
    assert (local.hour, local.minute, local.fold) == (repeated, 30, 0)  # summer time
    assert local.utcoffset() > tz.utcoffset(dt.datetime(*autumn, 12, 0))
    assert len(runs_on(daily, zone, *spring)) == 1
    # Walking from inside the repeated hour never yields a tick before the start.
    inside = run + dt.timedelta(minutes=45)
    assert daily.after(inside) > inside
    assert daily.at_or_before(inside) == run


@pytest.mark.parametrize(("zone", "spring", "autumn", "repeated"), ZONES)
def test_hourly_schedules_run_once_per_real_hour_on_dst_days(zone, spring, autumn, repeated):
    hourly = Ticks(cron="0 * * * *", timezone=zone)
    spring_runs = runs_on(hourly, zone, *spring)
    autumn_runs = runs_on(hourly, zone, *autumn)
    assert len(spring_runs) == 23
    assert len(autumn_runs) == 25
    assert len(runs_on(hourly, zone, 2026, 6, 1)) == 24
    for runs in (spring_runs, autumn_runs):
        gaps = {later - earlier for earlier, later in itertools.pairwise(runs)}
        assert gaps == {dt.timedelta(hours=1)}  # one real hour apart, none twice
    # Every 30 minutes: 46 and 50 runs.
    half = Ticks(cron="*/30 * * * *", timezone=zone)
    assert len(runs_on(half, zone, *spring)) == 46
    assert len(runs_on(half, zone, *autumn)) == 50


def test_every_counts_from_the_epoch_in_utc_whatever_the_zone():
    five = Ticks(every=dt.timedelta(minutes=5), timezone="America/New_York")
    at = dt.datetime(2026, 11, 1, 5, 57, 12, tzinfo=UTC)
    assert five.after(at) == dt.datetime(2026, 11, 1, 6, 0, tzinfo=UTC)
    assert five.at_or_before(at) == dt.datetime(2026, 11, 1, 5, 55, tzinfo=UTC)
    hourly = Ticks(every=dt.timedelta(hours=1), timezone="Europe/Berlin")
    assert len(runs_on(hourly, "Europe/Berlin", 2026, 10, 25)) == 25


def test_after_and_at_or_before_around_a_tick():
    daily = Ticks(cron="0 6 * * *", timezone="UTC")
    six = dt.datetime(2026, 5, 1, 6, tzinfo=UTC)
    assert daily.after(six) == six + dt.timedelta(days=1)
    assert daily.after(six - dt.timedelta(microseconds=1)) == six
    assert daily.at_or_before(six) == six
    assert daily.at_or_before(six - dt.timedelta(microseconds=1)) == six - dt.timedelta(days=1)
    leap = Ticks(cron="0 0 29 2 *", timezone="UTC")
    assert leap.at_or_before(six) == dt.datetime(2024, 2, 29, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *': Bad minute"),
        ({"cron": ""}, "invalid cron expression '': it is empty"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"every": dt.timedelta(milliseconds=500)}, "every must be a whole number of seconds"),
        ({}, "exactly one of cron and every"),
        ({"cron": "* * * * *", "every": dt.timedelta(seconds=1)}, "exactly one of cron and every"),
    ],
)
def test_bad_timings_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Ticks(**kwargs)


# -- what fires ---------------------------------------------------------------------------

SECOND = Ticks(every=dt.timedelta(seconds=1))
NOW = dt.datetime(2026, 5, 1, 12, 0, 0, 400_000, tzinfo=UTC)
TICK = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def test_plan_fires_a_due_tick_and_moves_to_the_next():
    decided = plan(SECOND, TICK, NOW, "once")
    assert decided.fires == [(TICK, TICK + dt.timedelta(seconds=1), 0)]


def test_plan_fires_nothing_before_the_tick_and_starts_new_schedules_after_now():
    assert plan(SECOND, TICK + dt.timedelta(seconds=1), NOW, "once").fires == []
    started = plan(SECOND, None, NOW, "once")
    assert (started.fires, started.advance) == ([], TICK + dt.timedelta(seconds=1))


def test_plan_fires_a_short_lag_tick_by_tick():
    first = TICK - dt.timedelta(seconds=BURST_LIMIT - 1)
    decided = plan(SECOND, first, NOW, "skip")
    assert [tick for tick, _, _ in decided.fires] == [
        first + dt.timedelta(seconds=i) for i in range(BURST_LIMIT)
    ]
    assert decided.next_tick == TICK + dt.timedelta(seconds=1)


@pytest.mark.parametrize("gap", [BURST_LIMIT, 20, 3600])
def test_plan_turns_a_gap_into_one_catch_up_job_or_none(gap):
    first = TICK - dt.timedelta(seconds=gap)
    once = plan(SECOND, first, NOW, "once")
    assert once.fires == [(TICK, TICK + dt.timedelta(seconds=1), gap)]
    skip = plan(SECOND, first, NOW, "skip")
    assert (skip.fires, skip.advance) == ([], TICK + dt.timedelta(seconds=1))


def test_plan_treats_one_tick_missed_for_longer_than_the_grace_as_a_gap():
    daily = Ticks(cron="0 6 * * *", timezone="UTC")
    six = dt.datetime(2026, 5, 1, 6, tzinfo=UTC)
    assert plan(daily, six, six + dt.timedelta(seconds=30), "skip").fires != []
    late = six + dt.timedelta(minutes=10)
    assert plan(daily, six, late, "skip").fires == []
    assert plan(daily, six, late, "once").fires == [(six, six + dt.timedelta(days=1), 0)]


def test_a_scheduled_job_knows_its_tick():
    ctx = JobContext(
        job_id=1, queue="q", type="t", payload={}, attempt=1, max_attempts=1, lease_version=1,
        user_key=tick_key("reports.daily", TICK),
    )  # fmt: skip
    assert ctx.idempotency_key == "schedule:reports.daily@2026-05-01T12:00:00+00:00"
    assert ctx.scheduled_for == TICK
    created = dt.datetime(2026, 5, 2, tzinfo=UTC)
    manual = JobContext(
        job_id=2, queue="q", type="t", payload={}, attempt=1, max_attempts=1, lease_version=1,
        user_key="schedule:reports.daily@run-now", created_at=created,
    )  # fmt: skip
    assert manual.scheduled_for == created
    plain = JobContext(
        job_id=3, queue="q", type="t", payload={}, attempt=1, max_attempts=1, lease_version=1
    )
    assert plain.scheduled_for is None


# -- declarations -------------------------------------------------------------------------


def test_handler_schedules_read_cron_strings_intervals_and_dicts():
    assert from_handler("a.b", "0 6 * * *", "here").cron == "0 6 * * *"
    assert from_handler("a.b", "90s", "here").every == dt.timedelta(seconds=90)
    assert from_handler("a.b", 300, "here").every == dt.timedelta(minutes=5)
    spec = from_handler("a.b", {"cron": "0 6 * * *", "queue": "reports"}, "here")
    assert (spec.name, spec.type, spec.queue) == ("a.b", "a.b", "reports")


def test_a_declaration_with_unknown_keys_or_bad_fields_says_which():
    with pytest.raises(ValueError, match="unknown key"):
        from_mapping("x", {"type": "a.b", "cron": "* * * * *", "crontab": "?"}, "here")
    with pytest.raises(ValueError, match="'type'"):
        from_mapping("x", {"cron": "* * * * *"}, "here")
    bad = ScheduleSpec(name="bad name!", type="a.b", cron="* * * * *", catch_up="all",
                       priority=500, queue="no spaces")  # fmt: skip
    problems = " | ".join(bad.problems())
    for expected in ("name must match", "catch_up must be", "priority must be", "queue"):
        assert expected in problems


class CountedTicks(Ticks):
    """Ticks that count how often the dispatcher would have walked a tick."""

    __slots__ = ("walked",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.walked = 0

    def after(self, instant):
        self.walked += 1
        return super().after(instant)


def test_a_catch_up_counts_an_intervals_gap_by_arithmetic():
    """A per-second schedule down for 30 days: the gap's 2,592,000 ticks are counted
    exactly, without walking them (the dispatcher thread neither claims nor writes while
    it counts)."""
    ticks = CountedTicks(every=dt.timedelta(seconds=1))
    first = TICK - dt.timedelta(days=30)
    once = plan(ticks, first, NOW, "once")
    assert once.fires == [(TICK, TICK + dt.timedelta(seconds=1), 30 * 86_400)]
    assert ticks.walked < BURST_LIMIT + 10


def test_a_cron_catch_up_walks_a_bounded_number_of_ticks():
    """A per-minute cron down for 70 days (100,800 ticks): the count stops at
    MISSED_COUNT_CAP (1,000), so the walk is bounded whatever the gap."""
    ticks = CountedTicks(cron="* * * * *", timezone="UTC")
    minute = dt.datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    once = plan(ticks, minute - dt.timedelta(days=70), minute + dt.timedelta(seconds=5), "once")
    [(tick, _, missed)] = once.fires
    assert (tick, missed) == (minute, MISSED_COUNT_CAP - 1)
    assert ticks.walked < 1_100


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("0 3 * * *", "At 03:00 every day"),
        ("30 9 * * 1-5", "At 09:30 on Monday through Friday"),
        ("*/5 * * * *", "Every fifth minute of every hour"),
        ("0 0 1 * *", "At 00:00 on the first day of every month"),
        ("5 4 * * sun", "At 04:05 on Sunday"),
    ],
)
def test_a_cron_expression_is_read_out_in_words(expr: str, words: str) -> None:
    assert describe_cron(expr) == words


def test_an_expression_that_cannot_be_read_is_shown_as_written() -> None:
    assert describe_cron("61 * * * *") == "61 * * * *"
