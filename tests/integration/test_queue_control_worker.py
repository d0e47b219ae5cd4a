"""Queue control through a real Worker: limits, pause, snooze and cancelling a running job."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from django.db import transaction

import django_pgqueue
from django_pgqueue import (
    JobSpec,
    actions,
    enqueue,
    enqueue_many,
    pause_queue,
    resume_queue,
    set_key_limit,
    set_queue_limit,
    signals,
)
from django_pgqueue.metrics.counters import WorkerCounters
from django_pgqueue.store.claims import QueueClaims
from django_pgqueue.store.worker import Store
from django_pgqueue.worker.scheduler import ClaimScheduler
from django_pgqueue.worker_config import WorkerConfig
from tests.conftest import sql
from tests.integration.test_queue_control import most_at_once

pytestmark = pytest.mark.django_db(transaction=True)


def wait_until(check, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def status(job_id: int) -> str:
    return sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])[0][0]


def test_two_workers_keep_a_global_limit(run_worker):
    set_queue_limit("reports", 2)
    enqueue_many([("qa.nap", {"seconds": 0.05}) for _ in range(40)], queue="reports")
    # Polls an hour apart: the 20 rounds of 2 jobs drain only if a slot given back
    # wakes the next claim. A limit that waited for the poll after a short claim would
    # not finish within the guard (a loaded machine drains it in a few seconds).
    workers = [run_worker(["reports"], concurrency=5, poll_interval=3600) for _ in range(2)]
    wait_until(
        lambda: sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0] == 40,
        timeout=120,
    )
    for worker in workers:
        worker.stop()
    assert most_at_once("reports") == 2


def test_a_paused_queue_is_not_claimed_until_resumed(run_worker):
    pause_queue("mail")
    job = enqueue("qa.noop", queue="mail")
    worker = run_worker(["mail"], poll_interval=0.1)
    time.sleep(0.5)
    assert status(job.id) == "pending"
    resume_queue("mail")
    wait_until(lambda: status(job.id) == "completed")
    worker.stop()


def test_a_snoozed_job_runs_later_without_spending_attempts(run_worker):
    job = enqueue("qa.snooze", {"times": 2, "seconds": 0.2}, queue="later", max_attempts=1)
    worker = run_worker(["later"], poll_interval=0.05)
    wait_until(lambda: status(job.id) == "completed")
    worker.stop()
    assert sql(
        "SELECT status, attempt_index FROM queue_attempts WHERE job_id = %s ORDER BY id", [job.id]
    ) == [("snoozed", 1), ("snoozed", 1), ("succeeded", 1)]
    assert worker.worker.stats["snoozed"] == 2
    started = [
        row[0]
        for row in sql(
            "SELECT started_at FROM queue_attempts WHERE job_id = %s ORDER BY id", [job.id]
        )
    ]
    assert all((b - a).total_seconds() >= 0.2 for a, b in itertools.pairwise(started))


def test_a_handler_that_checks_stops_when_cancelled(run_worker):
    job = enqueue("qa.cancellable", {"seconds": 30}, queue="long")
    worker = run_worker(["long"], lease=1.5)  # renewals every 0.5 s bring the request
    wait_until(lambda: status(job.id) == "running")
    asked = time.monotonic()
    assert actions.cancel([job.id]).requested == [job.id]
    wait_until(lambda: status(job.id) == "cancelled", timeout=120)
    # The handler stopped on the request, not at the end of its 30 s (how soon after the
    # request depends on the machine's load).
    assert time.monotonic() - asked < 15.0
    worker.stop()
    assert sql("SELECT status, result FROM queue_attempts WHERE job_id = %s", [job.id]) == [
        ("succeeded", '"stopped on request"')
    ]


def test_a_handler_that_ignores_the_request_is_cancelled_when_it_ends(run_worker):
    job = enqueue("qa.sleep", {"seconds": 1.0}, queue="long", max_attempts=3)
    worker = run_worker(["long"], lease=1.5)
    wait_until(lambda: status(job.id) == "running")
    actions.cancel([job.id])
    wait_until(lambda: status(job.id) == "cancelled", timeout=120)
    worker.stop()
    assert sql("SELECT status FROM queue_attempts WHERE job_id = %s", [job.id]) == [("succeeded",)]
    assert sql("SELECT count(*) FROM qa_ledger WHERE job_id = %s", [job.id]) == [(1,)]


def test_a_running_job_that_ends_cancelled_sends_job_cancelled(run_worker):
    """Like every outcome the worker writes: job_cancelled with the attempt's arguments,
    never job_succeeded, and counted as cancelled."""
    events: list[tuple[str, dict]] = []

    def record(name):
        def receive(sender, **kwargs):
            kwargs.pop("signal")
            events.append((name, kwargs))

        return receive

    receivers = [
        (signals.job_cancelled, record("cancelled")),
        (signals.job_succeeded, record("succeeded")),
    ]
    for signal, receive in receivers:
        signal.connect(receive, weak=False)
    try:
        job = enqueue("qa.cancellable", {"seconds": 30}, queue="long")
        counters = WorkerCounters()
        worker = run_worker(["long"], lease=1.5, observers=[counters])
        wait_until(lambda: status(job.id) == "running")
        actions.cancel([job.id])
        wait_until(lambda: status(job.id) == "cancelled", timeout=120)
        wait_until(lambda: events)
        worker.stop()
    finally:
        for signal, receive in receivers:
            signal.disconnect(receive)
    assert events == [
        (
            "cancelled",
            {
                "job_id": job.id,
                "queue": "long",
                "type": "qa.cancellable",
                "attempt": 1,
                "lease_version": 1,
                "worker_id": worker.worker.worker_id,
            },
        )
    ]
    assert worker.worker.stats["cancelled"] == 1
    assert worker.worker.stats["completed"] == 0
    counts = counters.attempts()
    assert counts == {("long", "qa.cancellable", "cancelled"): 1}


def test_a_queue_claimed_without_controls_keeps_its_first_keyed_jobs_apart(run_worker):
    """The first keyed enqueue marks a queue keyed, but a running worker learns that only
    at its next view of queue_controls (half a poll interval): meanwhile its plain claim
    must leave keyed jobs alone, or it runs two jobs of one key at once."""
    warm_up = enqueue("qa.noop", queue="fresh")
    run_worker(["fresh"], poll_interval=6.0)  # the view is refreshed every 3 s
    wait_until(lambda: status(warm_up.id) == "completed")  # `fresh` is claimed uncontrolled
    with transaction.atomic():
        keyed = [
            enqueue("qa.nap", {"seconds": 0.3}, queue="fresh", concurrency_key="customer:42")
            for _ in range(2)
        ]
    wait_until(lambda: all(status(job.id) == "completed" for job in keyed), timeout=120)
    assert most_at_once("fresh") == 1


def test_a_burst_worker_looks_at_the_controls_before_calling_a_queue_empty():
    """A queue that became keyed since the worker's last view held keyed jobs its plain
    claim had to leave: the burst exit test must not count it as empty."""
    config = WorkerConfig.build(["late"], poll_interval=10.0, burst=True)
    store = Store("default", "burst check", view_every=config.poll_interval / 2)
    store.connect()
    try:
        control = store.claims
        claims = ClaimScheduler(config.queues, config.weights, config.poll_interval, control)
        assert not control.controlled("late")  # the view, taken before the keyed enqueue
        now = time.monotonic()
        claims.mark_empty("late", now, now + 10.0)  # what the short plain claim left
        enqueue("qa.noop", queue="late", concurrency_key="customer:1")
        assert not claims.idle(time.monotonic())
        assert control.controlled("late")
        assert claims.refresh(time.monotonic())  # tried again at once
        assert claims.order() == ["late"]
    finally:
        store.close()


def test_a_waiting_worker_reads_the_controls_before_a_notify_wakes_it(run_worker, monkeypatch):
    """The view of queue_controls falls due every half poll interval; a worker that waits
    reads it ahead of that, so the claim a NOTIFY wakes it for never waits for the read."""
    in_claim = threading.local()
    reads: list[bool] = []  # each read of the view after the warm-up: inside a claim?
    claim, refresh_view = QueueClaims.claim, QueueClaims.refresh_view

    def claiming(self, done, request):
        in_claim.on = True
        try:
            return claim(self, done, request)
        finally:
            in_claim.on = False

    def reading(self, now):
        reads.append(getattr(in_claim, "on", False))
        return refresh_view(self, now)

    monkeypatch.setattr(QueueClaims, "claim", claiming)
    monkeypatch.setattr(QueueClaims, "refresh_view", reading)
    warm_up = enqueue("qa.noop", queue="waiting")
    run_worker(["waiting"], poll_interval=1.0)  # the view falls due every 0.5 s
    wait_until(lambda: status(warm_up.id) == "completed")
    reads.clear()  # the first claim read it: nothing was read before
    for _ in range(3):
        time.sleep(0.7)  # idle for longer than the view lasts
        job = enqueue("qa.noop", queue="waiting")
        wait_until(lambda job=job: status(job.id) == "completed")
    assert reads, "the view was not read while the worker waited"
    assert not any(reads), "a claim woken by a NOTIFY read the view first"


RUNS: dict[int, tuple[float, float]] = {}


@django_pgqueue.handler("test.blocked_in_c", max_attempts=1)
def blocked_in_c(ctx):
    """One C call (time.sleep) longer than the job timeout: the timeout's exception only
    lands when it returns."""
    start = time.monotonic()
    try:
        time.sleep(float(ctx.payload["seconds"]))
    finally:  # the timeout's exception lands right after the call returns
        RUNS[ctx.job_id] = (start, time.monotonic())


@pytest.mark.parametrize("limit", ["queue", "key"])
def test_a_timed_out_handler_still_running_holds_its_slot(run_worker, limit):
    """A limit of 1 (of the queue, or of a concurrency key) with handlers stuck in one C
    call past their timeout: the next job starts only once the previous handler really
    returned, so never two at once (each still fails by its timeout)."""
    RUNS.clear()
    if limit == "queue":
        set_queue_limit("held", 1)
        jobs = enqueue_many([("test.blocked_in_c", {"seconds": 1.0})] * 3, queue="held")
    else:
        set_key_limit("held", 1)
        jobs = [
            enqueue("test.blocked_in_c", {"seconds": 1.0}, queue="held", concurrency_key="c:1")
            for _ in range(3)
        ]
    worker = run_worker(["held"], concurrency=4, job_timeout=0.2, lease=3.0)
    wait_until(lambda: all(status(job.id) == "dead" for job in jobs), timeout=30)
    worker.stop()
    runs = sorted(RUNS[job.id] for job in jobs)
    assert len(runs) == 3
    for (_, end), (start, _) in itertools.pairwise(runs):
        assert start >= end, f"a handler started {end - start:.2f}s before the last returned"
    errors = sql(
        "SELECT DISTINCT error_class FROM queue_attempts WHERE job_id = ANY(%s)",
        [[job.id for job in jobs]],
    )
    assert errors == [("django_pgqueue.exceptions.JobTimeout",)]


def test_a_key_at_its_limit_does_not_hold_up_the_other_keys(run_worker):
    """200 jobs of key A (key limit 1) ahead of one job each of keys B0-B2, a worker of 4
    threads: the B jobs run beside the first A jobs, not after the 200 (the walk passes
    over a saturated key's jobs)."""
    set_key_limit("keys", 1)
    ahead = enqueue_many(
        [JobSpec("qa.nap", {"seconds": 0.05}, concurrency_key="A") for _ in range(200)],
        queue="keys",
    )
    behind = [
        enqueue("qa.nap", {"seconds": 0.05}, queue="keys", concurrency_key=f"B{n}")
        for n in range(3)
    ]
    worker = run_worker(["keys"], concurrency=4)
    wait_until(lambda: all(status(job.id) == "completed" for job in behind), timeout=30)
    worker.stop()
    started = dict(sql("SELECT job_id, min(started_at) FROM queue_attempts GROUP BY 1"))
    a_starts = sorted(started[job.id] for job in ahead if job.id in started)
    assert len(a_starts) >= 1
    tenth = a_starts[9] if len(a_starts) >= 10 else None
    for job in behind:  # every B began before the tenth A did (or the tenth never did)
        assert tenth is None or started[job.id] < tenth
    assert most_at_once("keys") <= 4
