"""django_pgqueue.testing: run_due_jobs() runs a test's jobs in-process; fire_tick() a tick's."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from django_pgqueue import chain, enqueue, step
from django_pgqueue.models import Schedule
from django_pgqueue.testing import fire_tick, run_due_jobs, run_durable
from tests.conftest import sql


def status(job_id: int) -> str:
    return sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])[0][0]


@pytest.mark.django_db(transaction=True)
def test_runs_every_due_job_of_every_queue_and_leaves_later_ones():
    echo = enqueue("qa.echo", {"n": 1}, queue="mail").id
    noop = enqueue("qa.noop", {}, queue="billing").id
    dead = enqueue("qa.permanent", {}, queue="billing").id
    later = enqueue("qa.noop", {}, queue="mail", delay=3600).id

    counts = run_due_jobs()

    assert counts["completed"] == 2
    assert counts["dead"] == 1
    assert (status(echo), status(noop), status(dead), status(later)) == (
        "completed",
        "completed",
        "dead",
        "pending",
    )
    (result,) = sql("SELECT result FROM queue_attempts WHERE job_id = %s", [echo])[0]
    assert json.loads(result) == {"n": 1}  # Django's connection reads jsonb as text


@pytest.mark.django_db(transaction=True)
def test_a_chain_across_two_queues_runs_in_one_call():
    # The second step becomes due only once the first completed, in another queue.
    run = chain(
        step("qa.echo", {"n": 1}, queue="mail"),
        step("qa.echo", {"n": 2}, queue="billing"),
    ).enqueue()

    counts = run_due_jobs()

    assert counts["completed"] == 2
    assert [status(job_id) for job_id in run.jobs.values()] == ["completed", "completed"]


@pytest.mark.django_db(transaction=True)
def test_only_the_queues_named():
    mail = enqueue("qa.noop", {}, queue="mail").id
    billing = enqueue("qa.noop", {}, queue="billing").id
    assert run_due_jobs(["mail"])["completed"] == 1
    assert (status(mail), status(billing)) == ("completed", "pending")


@pytest.mark.django_db(transaction=True)
def test_nothing_due_returns_at_once():
    assert run_due_jobs() == {}


@pytest.mark.django_db
def test_inside_a_test_transaction_it_refuses_with_the_way_out():
    enqueue("qa.noop", {}, queue="mail")
    with pytest.raises(RuntimeError, match=r"TransactionTestCase.*transaction=True"):
        run_due_jobs()


TICK = dt.datetime(2026, 3, 1, 6, 0, tzinfo=dt.UTC)


@pytest.fixture
def daily(settings):
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "SCHEDULES": {
            "daily": {
                "type": "qa.report",
                "cron": "0 6 * * *",
                "timezone": "UTC",
                "queue": "sched",
                "payload": {"region": "eu"},
                "priority": 5,
                "max_attempts": 2,
            }
        },
    }


@pytest.mark.django_db(transaction=True)
def test_fire_tick_enqueues_the_ticks_job_and_its_handler_sees_the_tick(daily):
    job = fire_tick("daily", at=TICK)
    assert (job.queue, job.type, job.created) == ("sched", "qa.report", True)
    row = sql(
        "SELECT priority, max_attempts, idempotency_key FROM queue_job_state WHERE job_id = %s",
        [job.id],
    )
    assert row == [(5, 2, "schedule:daily@2026-03-01T06:00:00+00:00")]
    assert fire_tick("daily", at=TICK).id == job.id  # pending: the same job again
    assert run_due_jobs(["sched"])["completed"] == 1
    assert job.wait(timeout=0) == {"day": "2026-03-01", "attempt": 1, "payload": {"region": "eu"}}
    # The schedule was not moved and no tick was recorded.
    assert sql("SELECT count(*) FROM queue_schedule_ticks") == [(0,)]


@pytest.mark.django_db(transaction=True)
def test_fire_tick_defaults_to_the_latest_tick(daily):
    job = fire_tick("daily")
    key = sql("SELECT idempotency_key FROM queue_job_state WHERE job_id = %s", [job.id])[0][0]
    tick = dt.datetime.fromisoformat(key.rpartition("@")[2])
    now = dt.datetime.now(dt.UTC)
    assert (tick.hour, tick.minute) == (6, 0)
    assert now - dt.timedelta(days=1) < tick <= now


@pytest.mark.django_db(transaction=True)
def test_fire_tick_of_a_schedule_made_in_the_admin():
    Schedule.objects.create(
        name="hourly", type="qa.report", queue="sched", every=dt.timedelta(hours=1), timezone="UTC"
    )
    job = fire_tick("hourly", at=TICK)
    assert run_due_jobs(["sched"])["completed"] == 1
    assert job.wait(timeout=0)["day"] == "2026-03-01"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "at", "error", "message"),
    [
        (
            "daily",
            TICK + dt.timedelta(minutes=1),
            ValueError,
            r"2026-03-01T06:01:00\+00:00 is not a tick of schedule 'daily'; the ticks around it "
            r"are 2026-03-01T06:00:00\+00:00 and 2026-03-02T06:00:00\+00:00",
        ),
        ("daily", dt.datetime(2026, 3, 1, 6, 0), ValueError, "at must be an aware datetime"),
        ("weekly", None, LookupError, r"no schedule named 'weekly'; the code declares \['daily'\]"),
    ],
)
def test_fire_tick_refuses_what_is_not_a_tick(daily, name, at, error, message):
    with pytest.raises(error, match=message):
        fire_tick(name, at=at)
    assert sql("SELECT count(*) FROM queue_jobs") == [(0,)]


@pytest.mark.django_db(transaction=True)
def test_run_durable_runs_a_durable_job_to_its_end_with_its_sleeps_due_at_once():
    job = enqueue("qa.durable_sleep", {"seconds": 3600}, queue="td")
    outcome = run_durable(job)
    assert outcome.status == "completed"
    assert [(s.name, s.kind) for s in outcome.steps] == [
        ("before", "step"),
        ("nap", "sleep"),
        ("after", "step"),
    ]
    assert outcome.result == {"woke": outcome.step("after").result}


@pytest.mark.django_db(transaction=True)
def test_run_durable_delivers_the_tests_events_and_times_out_the_others():
    paid = enqueue("qa.durable_event", {"key": "paid:1"}, queue="td")
    assert run_durable(paid, {"paid:1": {"amount": 3}}).result == {"amount": 3}
    never = enqueue("qa.durable_event", {"key": "never", "timeout": 86400}, queue="td")
    with pytest.raises(LookupError, match="waits for the event 'never'"):
        run_durable(never)
    outcome = run_durable(never, time_out_waits=True)
    assert outcome.result == "timed out"
    assert outcome.step("event:never").result == {"timed_out": True}
