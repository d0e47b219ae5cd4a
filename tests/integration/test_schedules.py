"""Recurring jobs on real connections: racing workers, gaps, sync of code schedules."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from django_pgqueue.models import Schedule
from django_pgqueue.schedules.firing import BURST_LIMIT, fire_due, sync_code_schedules, tick_key
from django_pgqueue.schedules.ticks import Ticks
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


def db_now() -> dt.datetime:
    return sql("SELECT now()")[0][0]


def make_schedule(name: str, *, queue: str = "sched", next_tick=None, **fields) -> Schedule:
    fields.setdefault("type", "qa.noop")
    fields.setdefault("timezone", "UTC")
    if "cron" not in fields:
        fields.setdefault("every", dt.timedelta(seconds=1))
    return Schedule.objects.create(name=name, queue=queue, next_tick=next_tick, **fields)


def fired(name: str) -> list[tuple]:
    """(tick_at, job_id, missed, job's key, job's queue) of every tick of `name`, in order."""
    return sql(
        "SELECT t.tick_at, t.job_id, t.missed, j.idempotency_key, j.queue "
        "FROM queue_schedule_ticks t JOIN queue_jobs j ON j.id = t.job_id "
        "WHERE t.schedule = %s ORDER BY t.tick_at",
        [name],
    )


def jobs_of(queue: str) -> int:
    return sql("SELECT count(*) FROM queue_jobs WHERE queue = %s", [queue])[0][0]


def test_eight_racing_threads_fire_each_tick_exactly_once(stores):
    every = Ticks(every=dt.timedelta(seconds=1))
    # The racers connect, then the schedule is made BURST_LIMIT - 2 ticks behind, then
    # they race: opening eight connections on a loaded machine took the 2 s of margin.
    connected, go = threading.Barrier(9), threading.Barrier(9)
    errors: list[BaseException] = []

    def racer(n: int) -> None:
        store = stores(f"racer-{n}")
        try:
            store.connect()
            connected.wait(30)
            go.wait(30)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                fire_due(store, ["sched"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    connected.wait(30)
    start = every.at_or_before(db_now()) - dt.timedelta(seconds=BURST_LIMIT - 2)
    make_schedule("race", next_tick=start)
    go.wait(30)
    for thread in threads:
        thread.join(30)
    assert not errors
    ticks = fired("race")
    times = [row[0] for row in ticks]
    # Every tick from the first due one on, each once, none skipped, none doubled.
    assert len(times) >= BURST_LIMIT
    assert times == [start + dt.timedelta(seconds=i) for i in range(len(times))]
    assert all(missed == 0 for _, _, missed, _, _ in ticks)
    assert [key for *_, key, _ in ticks] == [tick_key("race", t) for t in times]
    assert jobs_of("sched") == len(times)
    states = sql(
        "SELECT s.status, s.run_at <= now(), s.idempotency_key = j.idempotency_key "
        "FROM queue_job_state s JOIN queue_jobs j ON j.id = s.job_id WHERE s.queue = 'sched'"
    )
    assert set(states) == {("pending", True, True)}
    schedule = Schedule.objects.get(name="race")
    assert schedule.last_tick == times[-1]
    assert schedule.next_tick == times[-1] + dt.timedelta(seconds=1)


@pytest.mark.parametrize(("catch_up", "jobs"), [("once", 1), ("skip", 0)])
def test_a_gap_of_20_ticks_gives_one_catch_up_job_or_none_then_runs_on_schedule(
    stores, catch_up, jobs
):
    second = Ticks(every=dt.timedelta(seconds=1))
    latest = second.at_or_before(db_now())
    # Every worker was down for 20 ticks: the first unfired tick is 20 ticks back.
    make_schedule("gap", catch_up=catch_up, next_tick=latest - dt.timedelta(seconds=20))
    store = stores()
    for _ in range(5):  # the workers that come back all try
        fire_due(store, ["sched"])
    ticks = fired("gap")
    assert len(ticks) == jobs_of("sched")
    # The catch-up job stands for the ticks before it (missed > 0). A tick that came due
    # while the five fired (the clock crossed a second under load) fires on its own.
    caught = [row for row in ticks if row[2] > 0]
    assert len(caught) == jobs
    assert all(row[0] > latest for row in ticks if row[2] == 0)
    caught_up = caught[0][0] if caught else None
    if jobs:
        assert caught_up >= latest
        assert caught[0][2] >= 20
    resumed = Schedule.objects.get(name="gap").next_tick
    assert resumed >= latest + dt.timedelta(seconds=1)
    # Then on schedule: every later tick fires on its own, from the one after the gap.
    time.sleep(2.2)
    fire_due(store, ["sched"])
    after = fired("gap")
    assert [row for row in after if row[2] > 0] == caught
    assert len([row for row in after if row[0] >= resumed]) >= 2
    # Every tick but the catch-up fires on its own, one a second, none skipped or doubled:
    # from the one after the catch-up, or (skip) from the first after the gap. Ticks that
    # came due while the five fired sit before `resumed`, the rest from it on.
    own = [row[0] for row in after if row[2] == 0]
    first = caught_up + dt.timedelta(seconds=1) if caught_up else own[0]
    assert own == [first + dt.timedelta(seconds=i) for i in range(len(own))]
    assert resumed in own


def test_a_cron_gap_of_20_minutes_catches_up_once_at_the_latest_tick(stores):
    minute = Ticks(cron="* * * * *", timezone="UTC")
    latest = minute.at_or_before(db_now())
    make_schedule("cron-gap", cron="* * * * *", next_tick=latest - dt.timedelta(minutes=20))
    store = stores()
    wait = fire_due(store, ["cron-gap-queue", "sched"])
    # A minute may have turned between reading the clock here and firing.
    (tick, missed), *more = [(row[0], row[2]) for row in fired("cron-gap")]
    assert more == []
    assert (tick, missed) in [(latest, 20), (latest + dt.timedelta(minutes=1), 21)]
    assert Schedule.objects.get(name="cron-gap").next_tick == tick + dt.timedelta(minutes=1)
    assert wait is not None
    assert 0 < wait <= 60
    # Deleting a schedule takes its ticks with it.
    Schedule.objects.get(name="cron-gap").delete()
    assert sql("SELECT count(*) FROM queue_schedule_ticks") == [(0,)]


def test_a_short_lag_fires_every_missed_tick_on_its_own(stores):
    every = Ticks(every=dt.timedelta(seconds=1))
    first = every.at_or_before(db_now()) - dt.timedelta(seconds=3)
    make_schedule("lag", next_tick=first, catch_up="skip")
    fire_due(stores(), ["sched"])
    times = [row[0] for row in fired("lag")]
    assert times[:4] == [first + dt.timedelta(seconds=i) for i in range(4)]


def test_a_new_schedule_starts_at_its_next_tick_and_disabled_ones_never_fire(stores):
    make_schedule("fresh", next_tick=None)
    make_schedule("off", next_tick=db_now() - dt.timedelta(seconds=2), enabled=False)
    make_schedule("elsewhere", queue="other", next_tick=db_now() - dt.timedelta(seconds=2))
    before = db_now()
    fire_due(stores(), ["sched"])
    fresh = Schedule.objects.get(name="fresh")
    assert fresh.next_tick > before
    assert fired("fresh") == fired("off") == fired("elsewhere") == []


def test_fire_due_returns_none_without_schedules_and_the_wait_otherwise(stores):
    store = stores()
    assert fire_due(store, ["sched"]) is None
    make_schedule("hourly", cron="0 * * * *", next_tick=None)
    fire_due(store, ["sched"])  # sets its first tick
    wait = fire_due(store, ["sched"])
    assert wait is not None
    assert 0 < wait <= 3600


def test_a_bad_schedule_row_is_logged_and_the_others_still_fire(stores, caplog):
    make_schedule("broken", cron="* * * * *", next_tick=db_now() - dt.timedelta(seconds=1))
    sql("UPDATE queue_schedules SET cron = 'not a cron' WHERE name = 'broken'")
    every = Ticks(every=dt.timedelta(seconds=1))
    make_schedule("fine", next_tick=every.at_or_before(db_now()))
    fire_due(stores(), ["sched"])
    assert len(fired("fine")) >= 1
    assert "schedule broken cannot fire: invalid cron expression 'not a cron'" in caplog.text


def test_code_schedules_are_synced_disabled_when_removed_and_db_ones_kept(settings, stores):
    make_schedule("mine", next_tick=None)  # defined in the admin (source db)
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "SCHEDULES": {
            "nightly": {
                "type": "qa.echo",
                "cron": "0 3 * * *",
                "timezone": "Europe/Berlin",
                "payload": {"k": 1},
                "queue": "reports",
            },
            "mine": {"type": "qa.echo", "every": "5m"},
        },
    }
    store = stores()
    assert sync_code_schedules(store) == ["nightly"]
    nightly = Schedule.objects.get(name="nightly")
    assert (nightly.source, nightly.enabled, nightly.queue, nightly.payload) == (
        "code",
        True,
        "reports",
        {"k": 1},
    )
    assert (nightly.cron, nightly.timezone, nightly.every) == ("0 3 * * *", "Europe/Berlin", None)
    mine = Schedule.objects.get(name="mine")
    assert (mine.source, mine.type) == ("db", "qa.noop")

    settings.PGQUEUE = {**settings.PGQUEUE, "SCHEDULES": {}}
    sync_code_schedules(store)
    nightly.refresh_from_db()
    assert (nightly.source, nightly.enabled) == ("removed", False)

    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "SCHEDULES": {"nightly": {"type": "qa.echo", "cron": "0 4 * * *"}},
    }
    Schedule.objects.filter(name="nightly").update(next_tick=db_now())
    sync_code_schedules(store)
    nightly.refresh_from_db()
    assert (nightly.source, nightly.enabled, nightly.cron) == ("code", True, "0 4 * * *")
    assert nightly.timezone == "UTC"  # settings.TIME_ZONE
    assert nightly.next_tick is None  # timing changed: the next worker starts it afresh


def test_a_running_worker_syncs_code_schedules_and_runs_each_tick_once(settings, run_worker):
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "SCHEDULES": {"tick": {"type": "qa.echo", "every": "1s", "queue": "sched"}},
    }
    worker = run_worker(["sched"], poll_interval=0.5)
    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while time.monotonic() < deadline and len(fired("tick")) < 3:
        time.sleep(0.1)
    worker.stop()
    ticks = [row[0] for row in fired("tick")]
    assert len(ticks) >= 3
    assert ticks == [ticks[0] + dt.timedelta(seconds=i) for i in range(len(ticks))]
    done = sql(
        "SELECT count(*) FROM queue_schedule_ticks t JOIN queue_job_state s USING (job_id) "
        "WHERE t.schedule = 'tick' AND s.status = 'completed'"
    )[0][0]
    assert done >= len(ticks) - 1  # the last one may have fired as the worker stopped


def test_a_task_schedule_runs_its_task_with_its_arguments(settings, run_worker):
    backend = settings.TASKS["default"]
    settings.TASKS = {
        "default": {
            **backend,
            "OPTIONS": {
                **backend["OPTIONS"],
                "SCHEDULES": {
                    "record": {"task": "qa.tasks.record", "every": "1s", "args": ["tick"]}
                },
            },
        }
    }
    worker = run_worker(["qa-tasks"], poll_interval=0.5)
    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while time.monotonic() < deadline and not sql("SELECT FROM qa_task_call"):
        time.sleep(0.1)
    worker.stop()
    assert sql("SELECT DISTINCT label FROM qa_task_call") == [("tick",)]
    assert fired("record")[0][4] == "qa-tasks"  # the task's own queue_name


@pytest.mark.parametrize(("catch_up", "catch_up_jobs"), [("once", 1), ("skip", 0)])
def test_workers_back_after_a_gap_of_20_ticks_catch_up_once_then_run_on_schedule(
    run_worker, catch_up, catch_up_jobs
):
    make_schedule("back", catch_up=catch_up, every=dt.timedelta(seconds=2), next_tick=None)
    first = run_worker(["sched"], poll_interval=0.5)
    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while time.monotonic() < deadline and not fired("back"):
        time.sleep(0.1)
    first.stop()
    # Every worker is down for 20 ticks: the schedule's next tick is 20 ticks back.
    every = Ticks(every=dt.timedelta(seconds=2))
    resume_from = every.at_or_before(db_now()) - dt.timedelta(seconds=40)
    sql("DELETE FROM queue_schedule_ticks")
    Schedule.objects.filter(name="back").update(next_tick=resume_from)
    restarted_at = db_now()
    second = run_worker(["sched"], poll_interval=0.5)
    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while time.monotonic() < deadline and len(fired("back")) < catch_up_jobs + 2:
        time.sleep(0.1)
    second.stop()
    ticks = fired("back")
    catch_ups = [row for row in ticks if row[2] > 0]
    assert len(catch_ups) == catch_up_jobs  # one job for the whole gap, or none
    assert all(row[2] >= 19 for row in catch_ups)  # standing for the ticks it replaced
    on_time = [row[0] for row in ticks if row[2] == 0]
    assert len(on_time) >= 2
    assert on_time == [on_time[0] + dt.timedelta(seconds=2 * i) for i in range(len(on_time))]
    if catch_ups:  # then on schedule, from the tick after the catch-up
        assert on_time[0] == catch_ups[0][0] + dt.timedelta(seconds=2)
    else:  # nothing of the gap ran
        assert on_time[0] > restarted_at


def test_code_schedules_converge_to_the_newest_code_whatever_order_workers_start(settings, stores):
    """A rolling deploy: workers of the old code restart after workers of the new one.
    The new timing stays, a schedule the new code removed stays disabled, and the old
    code's restart leaves next_tick alone (no due tick dropped)."""
    old = {
        "report": {"type": "qa.echo", "every": "60s"},
        "legacy": {"type": "qa.echo", "every": "5m"},
    }
    new = {"report": {"type": "qa.echo", "every": "30s"}}
    store = stores()

    def start(code: dict) -> list[str]:
        settings.PGQUEUE = {**settings.PGQUEUE, "SCHEDULES": code}
        return sync_code_schedules(store)

    assert sorted(start(old)) == ["legacy", "report"]
    assert start(new) == ["report"]  # the deploy's first new worker
    Schedule.objects.filter(name="report").update(next_tick=db_now())  # a tick due now
    due = Schedule.objects.get(name="report").next_tick
    assert start(old) is None  # an old worker restarting: it writes nothing
    report, legacy = Schedule.objects.get(name="report"), Schedule.objects.get(name="legacy")
    assert report.every == dt.timedelta(seconds=30)
    assert report.next_tick == due
    assert (legacy.enabled, legacy.source) == (False, "removed")
    assert start(new) == ["report"]  # the new code's workers still sync
    newer = {"report": {"type": "qa.echo", "every": "10s"}}
    assert start(newer) == ["report"]  # and a later deploy takes over
    assert Schedule.objects.get(name="report").every == dt.timedelta(seconds=10)
    # A rollback to the old code (or a deploy that reverts to it): while workers of the
    # newer sets still run, the old set waits; once they are gone, it takes over.
    assert start(old) is None
    sql("UPDATE queue_schedule_code SET last_seen = now() - interval '1 hour' "
        "WHERE last_seen > now() - interval '1 minute'")  # fmt: skip
    assert sorted(start(old)) == ["legacy", "report"]
    report, legacy = Schedule.objects.get(name="report"), Schedule.objects.get(name="legacy")
    assert report.every == dt.timedelta(seconds=60)
    assert (legacy.enabled, legacy.source) == (True, "code")
