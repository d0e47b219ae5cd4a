"""Durable event waits in real workers: a parked job is in no claim index until its
event is emitted (in the emitter's transaction) or its wait times out; an emit racing
a wait or a timeout is decided once."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest
from django.db import connection, transaction
from django.urls import reverse
from psycopg.types.json import Jsonb
from qa.models import DurableEffect

from django_pgqueue import chain, emit_event, enqueue, enqueue_many, step
from django_pgqueue.actions import retry_now
from django_pgqueue.models import Attempt, EventWait, JobState, JobStep
from django_pgqueue.sql import QUERIES
from django_pgqueue.store.connection import connection_params
from tests.conftest import sql
from tests.integration.test_worker import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = {"poll_interval": 0.05, "sweep_interval": 0.2, "concurrency": 4}


def status(job_id: int) -> str:
    return JobState.objects.get(pk=job_id).status


def result(job_id: int) -> object:
    return Attempt.objects.get(job_id=job_id, status="succeeded").result


def after_calls(job_ids: list[int]) -> dict[int, int]:
    rows = sql(
        "SELECT job_id, count(*) FROM qa_durable_call WHERE job_id = ANY(%s) AND step = 'after' "
        "GROUP BY job_id",
        [job_ids],
    )
    return dict(rows)


def test_an_event_emitted_before_the_wait_is_delivered_without_parking(run_worker):
    assert emit_event("order-1:paid", {"amount": 5}) is True
    assert emit_event("order-1:paid", {"amount": 6}) is False  # the first emit wins
    job = enqueue("qa.durable_event", {"key": "order-1:paid"}, queue="ev")
    run_worker(["ev"], **WORKER)
    wait_until(lambda: status(job.id) == "completed")
    assert result(job.id) == {"amount": 5}
    assert [a.status for a in Attempt.objects.filter(job_id=job.id)] == ["succeeded"]


def test_a_parked_job_waits_out_of_the_claim_index_until_the_emit_commits(run_worker):
    job = enqueue("qa.durable_event", {"key": "order-2:paid"}, queue="ev")
    run_worker(["ev"], **WORKER)
    wait_until(lambda: status(job.id) == "waiting")
    assert EventWait.objects.get(job_id=job.id).key == "order-2:paid"

    def emit_then_fail() -> None:
        with transaction.atomic():
            emit_event("order-2:paid", "rolled back")
            raise RuntimeError("the caller's transaction rolls back")

    with pytest.raises(RuntimeError):
        emit_then_fail()
    time.sleep(0.5)  # not a bound: whatever a worker does meanwhile, the job still waits
    assert status(job.id) == "waiting"
    with transaction.atomic():
        emit_event("order-2:paid", {"ok": True})
    wait_until(lambda: status(job.id) == "completed")
    assert result(job.id) == {"ok": True}
    assert [a.status for a in Attempt.objects.filter(job_id=job.id).order_by("id")] == [
        "snoozed",
        "succeeded",
    ]
    assert JobState.objects.get(pk=job.id).attempts == 1  # the wait spent no attempt
    step = JobStep.objects.get(job_id=job.id, name="event:order-2:paid")
    assert (step.kind, step.result) == ("event", {"payload": {"ok": True}})
    assert after_calls([job.id]) == {job.id: 1}
    assert not EventWait.objects.exists()


def test_a_wait_times_out(run_worker):
    job = enqueue("qa.durable_event", {"key": "never", "timeout": 0.5}, queue="ev")
    run_worker(["ev"], **WORKER)
    wait_until(lambda: status(job.id) == "completed")
    assert result(job.id) == "timed out"
    assert JobStep.objects.get(job_id=job.id, name="event:never").result == {"timed_out": True}
    # A late emit changes nothing for it.
    emit_event("never", 1)
    assert JobStep.objects.get(job_id=job.id, name="event:never").result == {"timed_out": True}


def test_one_emit_reaches_every_job_waiting_for_its_key_once(run_worker):
    jobs = enqueue_many([("qa.durable_event", {"key": "shared"}) for _ in range(5)], queue="ev")
    run_worker(["ev"], **WORKER)
    wait_until(lambda: JobState.objects.filter(status="waiting").count() == 5)
    emit_event("shared", "go")
    ids = [j.id for j in jobs]
    wait_until(lambda: JobState.objects.filter(pk__in=ids, status="completed").count() == 5)
    assert all(result(i) == "go" for i in ids)
    assert after_calls(ids) == dict.fromkeys(ids, 1)


def _emit_all(keys: list[str], spread: float, seed: int) -> None:
    """Emit each key at a random moment within `spread` seconds, from this thread."""
    rng = random.Random(seed)
    moments = sorted((rng.uniform(0, spread), key) for key in keys)
    started = time.monotonic()
    try:
        for at, key in moments:
            time.sleep(max(0.0, started + at - time.monotonic()))
            emit_event(key, {"key": key})
    finally:
        connection.close()


def test_emits_racing_the_waits_are_never_lost(run_worker):
    keys = [f"race-{i}" for i in range(60)]
    jobs = enqueue_many([("qa.durable_event", {"key": key}) for key in keys], queue="er")
    run_worker(["er"], **WORKER)
    run_worker(["er"], **WORKER)
    emitter = threading.Thread(target=_emit_all, args=(keys, 1.0, 1))
    emitter.start()
    emitter.join(120)
    ids = [j.id for j in jobs]
    # No wait missed its emit: every job ends, with its own event's payload.
    wait_until(lambda: JobState.objects.filter(pk__in=ids, status="completed").count() == 60)
    assert [result(j.id) for j in jobs] == [{"key": key} for key in keys]
    assert after_calls(ids) == dict.fromkeys(ids, 1)
    assert not EventWait.objects.exists()


def test_emits_racing_the_timeouts_are_decided_once(run_worker):
    keys = [f"late-{i}" for i in range(60)]
    jobs = enqueue_many(
        [("qa.durable_event", {"key": key, "timeout": 1.0}) for key in keys], queue="et"
    )
    ids = [j.id for j in jobs]
    run_worker(["et"], **WORKER)
    # Half the jobs have parked (each park gives its attempt back, and the snoozed
    # attempt stays): the emits then race the waits' timeouts. Counting the jobs waiting
    # at one moment instead missed its mark under load: a wait times out a second after
    # its park, so when parking the jobs took the worker over a second, no moment had
    # half of them waiting, and the test hung until its guard.
    wait_until(lambda: Attempt.objects.filter(job_id__in=ids, status="snoozed").count() >= 30)
    emitter = threading.Thread(target=_emit_all, args=(keys, 2.0, 2))
    emitter.start()
    emitter.join(120)
    wait_until(lambda: JobState.objects.filter(pk__in=ids, status="completed").count() == 60)
    outcomes = {}
    for job, key in zip(jobs, keys, strict=True):
        stored = JobStep.objects.get(job_id=job.id, name=f"event:{key}").result
        # The handler saw what the one checkpoint says: the event, or the timeout.
        if stored == {"timed_out": True}:
            assert result(job.id) == "timed out"
            outcomes["timed out"] = outcomes.get("timed out", 0) + 1
        else:
            assert stored == {"payload": {"key": key}}
            assert result(job.id) == {"key": key}
            outcomes["delivered"] = outcomes.get("delivered", 0) + 1
    assert after_calls(ids) == dict.fromkeys(ids, 1)
    assert not EventWait.objects.exists()
    assert sum(outcomes.values()) == 60


def test_the_job_page_lists_a_durable_jobs_steps_and_its_wait(run_worker, superuser_client):
    job = enqueue("qa.durable_event", {"key": "page:1", "timeout": 3600}, queue="ev")
    plain = enqueue("qa.noop", queue="ev")
    run_worker(["ev"], **WORKER)
    wait_until(lambda: status(job.id) == "waiting" and status(plain.id) == "completed")
    page = superuser_client.get(reverse("admin:django_pgqueue_job_change", args=[job.id]))
    html = page.content.decode()
    assert "Durable steps" in html
    assert (
        '<td class="pgqueue-step-name">before</td><td>step</td><td><span class="pgqueue-status '
        'pgqueue-completed">done</span></td><td><code>&quot;before&quot;</code></td>'
    ) in html
    assert (
        '<td class="pgqueue-step-name">event:page:1</td><td>event</td><td><span class="pgqueue-'
        'status pgqueue-waiting">waiting</span></td><td>for <code>page:1</code>, until'
    ) in html
    plain_page = superuser_client.get(reverse("admin:django_pgqueue_job_change", args=[plain.id]))
    assert "Durable steps" not in plain_page.content.decode()


def test_an_async_handler_runs_the_async_spellings(run_worker):
    job = enqueue("qa.adurable", {"key": "async:1"}, queue="ea")
    run_worker(["ea"], **WORKER)
    wait_until(lambda: status(job.id) == "waiting")
    emit_event("async:1", "went")
    wait_until(lambda: status(job.id) == "completed")
    effect = DurableEffect.objects.get(job_id=job.id)
    assert result(job.id) == ["a", effect.pk, "went"]
    assert [a.status for a in Attempt.objects.filter(job_id=job.id).order_by("id")] == [
        "snoozed",
        "snoozed",
        "succeeded",
    ]
    assert sql(
        "SELECT step, count(*) FROM qa_durable_call WHERE job_id = %s GROUP BY step", [job.id]
    ) == [("a", 1)]


def test_a_parked_step_stays_parked_through_a_retry_of_its_dependency(run_worker):
    # A step that runs whatever its dependency did, parked for an event mid-run, when
    # an operator retries that dependency and it dies again: the settle leaves the
    # parked step to its event (it started), instead of waking it as a step whose
    # dependencies just finished (it ran again and parked anew, its timeout restarted).
    run = chain(
        step("qa.fail", queue="ew", max_attempts=1),
        step("qa.durable_event", {"key": "ew:paid", "timeout": 3600}, queue="ew", on_failure="run"),
    ).enqueue()
    parent, parked = run.jobs.values()
    run_worker(["ew"], burst=True).join()
    assert (status(parent), status(parked)) == ("dead", "waiting")
    wait = EventWait.objects.get(job_id=parked)

    assert retry_now([parent]).changed == [parent]
    run_worker(["ew"], burst=True).join()
    assert (status(parent), status(parked)) == ("dead", "waiting")
    assert Attempt.objects.filter(job_id=parked).count() == 1
    assert EventWait.objects.get(job_id=parked).created_at == wait.created_at

    emit_event("ew:paid", "go")
    run_worker(["ew"], burst=True).join()
    assert status(parked) == "completed"
    assert result(parked) == "go"


def _parked(key: str) -> int:
    """A job parked for `key`, its wait due now: an emit and the timeout both want it."""
    job = enqueue("qa.durable_event", {"key": key}, queue="er1")
    sql("UPDATE queue_job_state SET status = 'waiting' WHERE job_id = %s", [job.id])
    sql(
        "INSERT INTO queue_event_waits (job_id, key, name, timeout_at, created_at) "
        "VALUES (%s, %s, %s, now(), now())",
        [job.id, key, f"event:{key}"],
    )
    return job.id


def _session() -> psycopg.Connection:
    return psycopg.connect(**connection_params("default", "event race"))


def _emit_in_thread(key: str, done: list) -> tuple[threading.Thread, int]:
    emitter = _session()
    pid = emitter.info.backend_pid

    def emit() -> None:
        with emitter:
            done.append(
                emitter.execute(QUERIES["event_emit"], {"key": key, "payload": Jsonb(1)}).fetchone()
            )

    thread = threading.Thread(target=emit)
    thread.start()
    return thread, pid


def test_a_wait_the_timeout_took_is_not_delivered_by_an_emit_that_waited_for_it():
    job_id = _parked("race:timeout-first")
    with _session() as timeout:
        assert [
            row[0] for row in timeout.execute(QUERIES["event_wait_timeout"], {"limit": 10})
        ] == ["er1"]
        done: list = []
        thread, pid = _emit_in_thread("race:timeout-first", done)
        # The emit waits for the wait's row the timeout holds (not committed yet).
        wait_until(
            lambda: (
                sql("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
                == [("Lock",)]
            )
        )
    thread.join(60)
    assert done == [(True, 0)]  # stored, delivered to no wait: the timeout took it
    steps = JobStep.objects.filter(job_id=job_id)
    assert [(s.name, s.result) for s in steps] == [
        ("event:race:timeout-first", {"timed_out": True})
    ]
    assert status(job_id) == "pending"
    assert not EventWait.objects.exists()


def test_a_wait_an_emit_holds_is_skipped_by_the_timeout():
    job_id = _parked("race:emit-first")
    with _session() as emitter:
        delivered = emitter.execute(
            QUERIES["event_emit"], {"key": "race:emit-first", "payload": Jsonb(2)}
        ).fetchone()
        assert delivered == (True, 1)
        # The timeout skips the row the emit holds (not committed yet): nothing to do.
        with _session() as timeout:
            assert timeout.execute(QUERIES["event_wait_timeout"], {"limit": 10}).fetchall() == []
    steps = JobStep.objects.filter(job_id=job_id)
    assert [(s.name, s.result) for s in steps] == [("event:race:emit-first", {"payload": 2})]
    assert status(job_id) == "pending"
    assert not EventWait.objects.exists()
