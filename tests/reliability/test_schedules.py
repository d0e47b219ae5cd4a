"""Scenario 11: recurring jobs, five worker processes racing on the same schedules while
one is SIGKILLed every 30 s (every 10 s at the reduced size): every tick in the window
fires exactly once, and each of its jobs completes once.

Time is compressed only by the schedules' own ticks (an every-second schedule and five
cron expressions with a seconds field), never by moving the database's clock.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter

import pytest

from django_pgqueue.models import Schedule
from django_pgqueue.schedules.firing import tick_key
from django_pgqueue.schedules.ticks import Ticks
from tests.conftest import sql
from tests.reliability.conftest import ledger_counts, outcome, size, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = 5
QUEUE = "recurring"
SESSIONS = ("worker", "heartbeat", "listener")
OPTIONS = (
    "--lease", "2",
    "--heartbeat-interval", "0.6",
    "--sweep-interval", "1",
    "--concurrency", "4",
    "--poll-interval", "0.5",
    "-v", "0",
)  # fmt: skip
SCHEDULES = {
    "every-second": {"every": dt.timedelta(seconds=1)},
    "cron-2s": {"cron": "*/2 * * * * *"},
    "cron-3s": {"cron": "*/3 * * * * *"},
    "cron-5s": {"cron": "*/5 * * * * *"},
    "cron-7-19-41": {"cron": "7,19,41 * * * * *"},
    "cron-berlin-10s": {"cron": "*/10 * * * * *", "timezone": "Europe/Berlin"},
}


def db_now() -> dt.datetime:
    return sql("SELECT now()")[0][0]


MIN_KILLS = 3


def test_racing_workers_fire_every_tick_exactly_once_through_sigkills(worker_process, report):
    """11. Recurring jobs: 5 workers racing, one SIGKILLed every 30 s"""
    window = size(45, 600)
    kill_every = size(10, 30)
    for name, timing in SCHEDULES.items():
        Schedule.objects.create(
            name=name, type="qa.ledger", queue=QUEUE, timezone=timing.get("timezone", "UTC"),
            cron=timing.get("cron"), every=timing.get("every"), payload={},
        )  # fmt: skip

    generation = 0

    def start(slot: int):
        nonlocal generation
        generation += 1
        worker_id = f"recurring-{slot}-{generation}"
        return worker_id, worker_process(QUEUE, "--worker-id", worker_id, *OPTIONS)

    slots = [start(slot) for slot in range(WORKERS)]
    wait_until(
        "SELECT count(*) FROM queue_schedules WHERE next_tick IS NOT NULL",
        lambda n: n == len(SCHEDULES),
    )
    # The window opens once every schedule has started; it closes when the kills stop.
    window_start = db_now() + dt.timedelta(seconds=1)
    started = time.monotonic()
    kills = 0
    victim_slot = 0
    # At least MIN_KILLS kills, however long a loaded machine takes to see each one gone.
    while kills < MIN_KILLS or time.monotonic() - started < window:
        time.sleep(min(kill_every, max(0.0, window - (time.monotonic() - started))))
        if time.monotonic() - started >= window and kills >= MIN_KILLS:
            break
        worker_id, victim = slots[victim_slot]
        victim.kill()  # SIGKILL
        wait_until(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY (%s)",
            lambda n: n == 0,
            timeout=30,
            params=[[f"pgqueue {role} {worker_id}" for role in SESSIONS]],
        )
        kills += 1
        slots[victim_slot] = start(victim_slot)
        victim_slot = (victim_slot + 1) % WORKERS
    window_end = db_now()

    # Every tick of the window, computed from the schedules' timing alone.
    expected = {
        (name, tick)
        for name, timing in SCHEDULES.items()
        for tick in Ticks(
            cron=timing.get("cron"), every=timing.get("every"),
            timezone=timing.get("timezone", "UTC"),
        ).between(window_start, window_end, 100_000)
    }  # fmt: skip
    wait_until(  # the last tick of the window has fired
        "SELECT count(*) FROM queue_schedule_ticks WHERE tick_at BETWEEN %s AND %s",
        lambda n: n >= len(expected),
        timeout=30,
        params=[window_start, window_end],
    )
    fired = sql(
        "SELECT t.schedule, t.tick_at, t.missed, t.job_id, j.idempotency_key "
        "FROM queue_schedule_ticks t LEFT JOIN queue_jobs j ON j.id = t.job_id "
        "WHERE t.tick_at BETWEEN %s AND %s",
        [window_start, window_end],
    )
    in_window = Counter((name, tick) for name, tick, *_ in fired)
    missing = expected - set(in_window)
    duplicates = {key: n for key, n in in_window.items() if n > 1}
    unexpected = set(in_window) - expected
    assert (missing, duplicates, unexpected) == (set(), {}, set())
    assert [row for row in fired if row[2] != 0] == []  # no tick merged into a catch-up
    assert all(key == tick_key(name, tick) for name, tick, _, _, key in fired)
    # One job per tick, none without its tick: the schedules' jobs are exactly the ticks'.
    jobs_per_key = sql(
        "SELECT count(*), count(DISTINCT idempotency_key) FROM queue_jobs WHERE queue = %s",
        [QUEUE],
    )[0]
    ticks_total = sql("SELECT count(*) FROM queue_schedule_ticks")[0][0]
    assert jobs_per_key == (ticks_total, ticks_total)

    window_jobs = (
        "SELECT job_id AS id FROM queue_schedule_ticks "
        f"WHERE tick_at BETWEEN '{window_start.isoformat()}' AND '{window_end.isoformat()}'"
    )
    wait_until(
        f"SELECT count(*) FROM queue_job_state WHERE status <> 'completed' "
        f"AND job_id IN ({window_jobs})",
        lambda n: n == 0,
        timeout=60,
    )
    for _, worker in slots:
        worker.kill()
    counts = ledger_counts(window_jobs)
    assert counts["jobs"] == len(expected)
    assert counts["lost"] == 0
    assert counts["completed_twice"] == 0
    assert counts["completed_without_success"] == 0
    assert kills >= MIN_KILLS
    report(
        size=f"{window} s of ticks, {WORKERS} processes, {len(SCHEDULES)} schedules",
        **outcome(counts),
        ticks=len(expected),
        missing=len(missing),
        duplicates=len(duplicates),
        kills=kills,
        notes=f"an every-second schedule and five cron ones (seconds field), one worker "
        f"SIGKILLed every {kill_every} s and replaced; every tick of the window fired "
        "exactly once, as one job, and completed once",
    )
