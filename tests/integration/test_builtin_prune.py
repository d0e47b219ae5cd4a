"""The built-in prune: a code schedule every worker of its queue fires, deleting each
finished status after its age, with no cron beside the project."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from django_pgqueue import chain, emit_event, enqueue_many, step
from django_pgqueue.maintenance import prune
from django_pgqueue.models import Schedule
from django_pgqueue.prune_policy import PRUNE_TYPE
from django_pgqueue.schedules.firing import sync_code_schedules
from django_pgqueue.schedules.operations import run_now
from django_pgqueue.schedules.spec import code_schedules
from django_pgqueue.testing import run_due_jobs
from tests.conftest import sql
from tests.factories import job_exists, make_job

pytestmark = pytest.mark.django_db(transaction=True)

FINISHED = "UPDATE queue_job_state SET status = %s, finished_at = now() - %s::interval "


@pytest.fixture
def default_prune(settings):
    """The project's settings as a project that never mentions PRUNE has them."""
    settings.PGQUEUE = {k: v for k, v in settings.PGQUEUE.items() if k != "PRUNE"}


def prune_schedule() -> Schedule:
    return Schedule.objects.get(name=PRUNE_TYPE)


def test_a_project_that_says_nothing_prunes_every_hour_in_its_default_queue(default_prune, stores):
    (spec,) = [s for s in code_schedules().specs if s.name == PRUNE_TYPE]
    assert (spec.type, spec.every, spec.cron, spec.queue) == (
        PRUNE_TYPE,
        dt.timedelta(hours=1),
        None,
        None,
    )
    day = 86_400
    assert spec.payload == {
        "older_than_seconds": {"completed": 14 * day, "cancelled": 14 * day, "dead": 90 * day}
    }
    assert PRUNE_TYPE in sync_code_schedules(stores())
    schedule = prune_schedule()
    assert (schedule.source, schedule.queue, schedule.enabled) == ("code", "default", True)


def test_given_keys_replace_the_defaults_and_none_turns_the_schedule_off(settings, stores):
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "PRUNE": {"cron": "17 3 * * *", "dead": None, "queue": "maintenance"},
    }
    (spec,) = [s for s in code_schedules().specs if s.name == PRUNE_TYPE]
    assert (spec.cron, spec.every, spec.queue) == ("17 3 * * *", None, "maintenance")
    assert set(spec.payload["older_than_seconds"]) == {"completed", "cancelled"}
    sync_code_schedules(stores())
    assert prune_schedule().enabled
    # Off: the schedule is no longer declared, so the next worker disables it.
    settings.PGQUEUE = {**settings.PGQUEUE, "PRUNE": None}
    assert PRUNE_TYPE not in [s.name for s in code_schedules().specs]
    sync_code_schedules(stores())
    assert not prune_schedule().enabled


def test_the_prune_job_keeps_each_status_its_age_and_a_workflow_until_its_longest(
    default_prune, stores
):
    jobs = {
        "completed_15d": make_job("completed", finished_ago="15 days"),
        "completed_13d": make_job("completed", finished_ago="13 days"),
        "cancelled_15d": make_job("cancelled", finished_ago="15 days"),
        "dead_30d": make_job("dead", finished_ago="30 days"),
        "dead_91d": make_job("dead", finished_ago="91 days"),
        "pending": make_job("pending"),
    }
    # A workflow whose steps ended completed and dead: kept whole while its dead step is
    # younger than 90 days, though its completed step is older than 14.
    kept = chain(step("qa.noop", queue="ops"), step("qa.noop", queue="ops")).enqueue()
    first, last = kept.jobs.values()
    sql(FINISHED + "WHERE job_id = %s", ["completed", "100 days", first])
    sql(FINISHED + "WHERE job_id = %s", ["dead", "30 days", last])
    gone = chain(step("qa.noop", queue="ops"), step("qa.noop", queue="ops")).enqueue()
    one, two = gone.jobs.values()
    sql(FINISHED + "WHERE job_id = %s", ["completed", "100 days", one])
    sql(FINISHED + "WHERE job_id = %s", ["dead", "95 days", two])
    sql("UPDATE queue_workflows SET created_at = now() - interval '101 days'")

    sync_code_schedules(stores())
    job = run_now(prune_schedule())
    assert run_due_jobs(["default"])["completed"] == 1

    left = {name for name, job_id in jobs.items() if job_exists(job_id)}
    assert left == {"completed_13d", "dead_30d", "pending"}
    assert all(job_exists(job_id) for job_id in kept.jobs.values())
    assert not any(job_exists(job_id) for job_id in gone.jobs.values())
    assert sql("SELECT id FROM queue_workflows") == [(kept.id,)]
    result = job.wait(0)
    assert result == {
        "default": {
            "completed": 2,
            "cancelled": 1,
            "dead": 2,
            "workflows": 1,
            "batches": 0,
            "sequences": 0,
            "events": 0,
        }
    }


def test_a_worker_of_the_default_queue_fires_the_prune_when_its_tick_is_due(
    default_prune, stores, run_worker
):
    old = make_job("completed", finished_ago="20 days")
    young = make_job("completed", finished_ago="1 day")
    sync_code_schedules(stores())
    # The next tick is on the hour; make this hour's due, as a worker running past it sees.
    Schedule.objects.filter(name=PRUNE_TYPE).update(
        next_tick=sql("SELECT date_trunc('hour', now())")[0][0]
    )
    worker = run_worker(["default"], poll_interval=0.2)
    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while time.monotonic() < deadline and job_exists(old):
        time.sleep(0.1)
    worker.stop()
    assert not job_exists(old)
    assert job_exists(young)
    fired = sql(
        "SELECT s.status FROM queue_schedule_ticks t JOIN queue_job_state s USING (job_id) "
        "WHERE t.schedule = %s",
        [PRUNE_TYPE],
    )
    assert len(fired) == 1
    # The next tick is the next hour's: the schedule does not fire again at once.
    assert prune_schedule().next_tick > sql("SELECT now()")[0][0]


def test_enqueue_many_of_the_prune_type_is_an_ordinary_job(default_prune):
    """The type is registered in every process, so an operator may also enqueue it by
    hand with other ages (here: every finished job older than an hour)."""
    old = make_job("dead", finished_ago="2 hours")
    (job,) = enqueue_many([(PRUNE_TYPE, {"older_than_seconds": {"dead": 3600}})])
    run_due_jobs(["default"])
    assert not job_exists(old)
    assert job.wait(0)["default"]["dead"] == 1


def test_events_are_pruned_after_the_completed_jobs_retention(default_prune, stores):
    # An event is a finished row once emitted: delivered to its waits then, or there for
    # a later wait; it goes once it is older than the completed jobs' retention.
    for key in ("old-1", "old-2", "young"):
        emit_event(key, {"key": key})
    sql("UPDATE queue_events SET emitted_at = now() - interval '15 days' WHERE key <> 'young'")
    sync_code_schedules(stores())
    job = run_now(prune_schedule())
    assert run_due_jobs(["default"])["completed"] == 1
    assert sql("SELECT key FROM queue_events") == [("young",)]
    assert job.wait(0)["default"]["events"] == 2


def test_a_prune_of_other_statuses_than_completed_keeps_the_events(stores):
    emit_event("kept", None)
    sql("UPDATE queue_events SET emitted_at = now() - interval '100 days'")
    assert prune(dt.timedelta(days=1), statuses=["dead", "cancelled"]).events == 0
    assert prune(dt.timedelta(days=1), dry_run=True).events == 1
    assert sql("SELECT key FROM queue_events") == [("kept",)]
    result = prune(dt.timedelta(days=1), batch_size=1)
    assert result.events == 1
    assert sql("SELECT key FROM queue_events") == []
