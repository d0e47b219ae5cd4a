"""Durable sleeps in real workers: the job is given back until its wake-up, holding no
thread, slot or lease and spending no attempt, and its handler never resumes early;
the stats and the metrics count the parked jobs."""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue import chain, enqueue, enqueue_many, set_queue_limit, stats, step
from django_pgqueue.actions import retry_now
from django_pgqueue.metrics import collector
from django_pgqueue.models import Attempt, JobState, JobStep
from tests.conftest import sql
from tests.factories import run_command
from tests.integration.test_worker import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def wake_at(job_id: int) -> dt.datetime:
    step = JobStep.objects.get(job_id=job_id, name="nap")
    return dt.datetime.fromisoformat(step.result["wake_at"])


def test_a_sleeping_job_holds_no_slot_and_never_wakes_early(run_worker):
    set_queue_limit("sl", 1)
    sleeper = enqueue("qa.durable_sleep", {"seconds": 3}, queue="sl")
    run_worker(["sl"], concurrency=2, poll_interval=0.05)
    wait_until(lambda: JobStep.objects.filter(job_id=sleeper.id, name="nap").exists())
    wait_until(lambda: JobState.objects.get(pk=sleeper.id).status == "pending")
    # The queue runs one job at a time: the others run while the sleeper sleeps.
    others = enqueue_many([("qa.noop", i) for i in range(5)], queue="sl")
    wait_until(
        lambda: (
            JobState.objects.filter(pk__in=[j.id for j in others], status="completed").count() == 5
        )
    )
    woke = wake_at(sleeper.id)
    assert JobState.objects.get(pk=sleeper.id).status == "pending"
    assert sql("SELECT now() < %s", [woke])[0][0], "the others ran only after the wake-up"
    wait_until(lambda: JobState.objects.get(pk=sleeper.id).status == "completed")
    state = JobState.objects.get(pk=sleeper.id)
    assert state.attempts == 1  # the sleep spent no attempt
    attempts = list(Attempt.objects.filter(job_id=sleeper.id).order_by("lease_version"))
    assert [a.status for a in attempts] == ["snoozed", "succeeded"]
    assert attempts[1].started_at >= woke
    assert dt.datetime.fromisoformat(attempts[1].result["woke"]) >= woke
    # Each step's function ran once.
    assert sql(
        "SELECT step, count(*) FROM qa_durable_call WHERE job_id = %s GROUP BY step", [sleeper.id]
    ) == [("before", 1)]


def test_a_sleeper_run_before_its_wake_up_sleeps_again_for_what_is_left(run_worker):
    sleeper = enqueue("qa.durable_sleep", {"seconds": 4}, queue="se")
    run_worker(["se"], poll_interval=0.05)
    wait_until(lambda: JobStep.objects.filter(job_id=sleeper.id, name="nap").exists())
    wait_until(lambda: JobState.objects.get(pk=sleeper.id).status == "pending")
    woke = wake_at(sleeper.id)
    # Due now, as an operator's "run now" would make it: it runs, and sleeps again.
    sql("UPDATE queue_job_state SET run_at = now() WHERE job_id = %s", [sleeper.id])
    sql("SELECT pg_notify('pgqueue', 'se')")  # the idle worker looks at once
    wait_until(lambda: Attempt.objects.filter(job_id=sleeper.id).count() >= 2)
    wait_until(lambda: JobState.objects.get(pk=sleeper.id).status == "completed")
    attempts = list(Attempt.objects.filter(job_id=sleeper.id).order_by("lease_version"))
    assert [a.status for a in attempts] == ["snoozed", "snoozed", "succeeded"]
    assert attempts[1].started_at < woke <= attempts[2].started_at
    assert dt.datetime.fromisoformat(attempts[2].result["woke"]) >= woke
    assert JobState.objects.get(pk=sleeper.id).attempts == 1


def test_the_stats_and_the_metrics_count_the_parked_jobs(run_worker):
    # A sleeper and a job parked for an event, in one queue; a scheduled job (pending,
    # not due) and a workflow step waiting for its parent are parked for neither.
    sleeper = enqueue("qa.durable_sleep", {"seconds": 3600}, queue="pk")
    waiter = enqueue("qa.durable_event", {"key": "pk:paid"}, queue="pk")
    enqueue("qa.noop", 1, queue="pk", delay=3600)
    chain(step("qa.noop", queue="pk-flow", delay=3600), step("qa.noop", queue="pk-flow")).enqueue()
    run_worker(["pk"], poll_interval=0.05)
    wait_until(lambda: JobStep.objects.filter(job_id=sleeper.id, name="nap").exists())
    wait_until(lambda: JobState.objects.get(pk=sleeper.id).status == "pending")
    wait_until(lambda: JobState.objects.get(pk=waiter.id).status == "waiting")

    figures = {f.queue: f for f in stats.collect().queues}
    parked = {
        q: (f.pending, f.due, f.waiting, f.sleeping, f.awaiting_event) for q, f in figures.items()
    }
    assert parked == {"pk": (2, 0, 1, 1, 1), "pk-flow": (1, 0, 1, 0, 0)}
    assert stats.collect().totals.sleeping == 1
    assert "sleeping" in stats.collect().as_dict()["totals"]

    collector._readings.clear()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in collector.QueueCollector().collect()
        for sample in family.samples
    }
    collector._readings.clear()
    parked_metric = {
        labels: value for (name, labels), value in samples.items() if name == "pgqueue_jobs_parked"
    }
    assert parked_metric == {
        (("queue", "pk"), ("reason", "sleep")): 1,
        (("queue", "pk"), ("reason", "event")): 1,
        (("queue", "pk-flow"), ("reason", "sleep")): 0,
        (("queue", "pk-flow"), ("reason", "event")): 0,
    }
    # The command's table has a column for each.
    out = run_command("queue_stats")
    assert out.splitlines()[0].split()[8:11] == ["waiting", "sleeping", "awaiting"]


def test_a_retry_of_its_dependency_leaves_a_sleeping_step_run(run_worker):
    # A step that runs whatever its dependency did, asleep mid-run (pending until its
    # wake-up) when an operator retries that dependency: it started, so it stays run,
    # like a running step; it is not put back to waiting for the dependency.
    run = chain(
        step("qa.fail", queue="dw", max_attempts=1),
        step("qa.durable_sleep", {"seconds": 3600}, queue="dw", on_failure="run"),
    ).enqueue()
    parent, sleeper = run.jobs.values()
    run_worker(["dw"], burst=True).join()
    assert JobState.objects.get(pk=parent).status == "dead"
    before = JobState.objects.get(pk=sleeper)
    assert before.status == "pending"
    assert JobStep.objects.filter(job_id=sleeper, name="nap").exists()

    assert retry_now([parent]).changed == [parent]
    after = JobState.objects.get(pk=sleeper)
    assert (after.status, after.run_at, after.lease_version) == (
        "pending",
        before.run_at,
        before.lease_version,
    )
