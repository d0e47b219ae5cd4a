"""Lifecycle signals: one test per event, from real enqueues and real worker threads."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from django_pgqueue import actions, enqueue, enqueue_many, signals
from django_pgqueue.metrics.counters import WorkerCounters
from django_pgqueue.models import Job, JobState
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder:
    """A receiver that keeps every (signal name, kwargs) it gets, thread-safely."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def receiver(self, name: str) -> Any:
        def receive(sender: Any, **kwargs: Any) -> None:
            assert sender is Job
            kwargs.pop("signal")
            with self.lock:
                self.events.append((name, kwargs))

        return receive

    def of(self, name: str, job_id: int | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                kw
                for n, kw in self.events
                if n == name and (job_id is None or kw["job_id"] == job_id)
            ]


SIGNALS = (
    "job_enqueued",
    "job_started",
    "job_succeeded",
    "job_retried",
    "job_failed",
    "job_lease_lost",
    "job_cancelled",
)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    receivers = [(getattr(signals, name), rec.receiver(name)) for name in SIGNALS]
    for signal, receive in receivers:
        signal.connect(receive, weak=False)
    yield rec
    for signal, receive in receivers:
        signal.disconnect(receive)


def wait_until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_job_enqueued_is_sent_on_commit_and_never_for_a_rollback(recorder: Recorder) -> None:
    outside = enqueue("qa.echo", {"n": 1}, queue="sig", priority=5)
    assert recorder.of("job_enqueued") == [
        {
            "job_id": outside.id,
            "queue": "sig",
            "type": "qa.echo",
            "payload": {"n": 1},
            "priority": 5,
        }
    ]
    with transaction.atomic():
        inside = enqueue("qa.echo", {"n": 2}, queue="sig")
        assert recorder.of("job_enqueued", inside.id) == []  # not before the commit
    assert len(recorder.of("job_enqueued", inside.id)) == 1
    with transaction.atomic():
        rolled_back = enqueue("qa.echo", {"n": 3}, queue="sig")
        transaction.set_rollback(True)
    assert recorder.of("job_enqueued", rolled_back.id) == []
    assert not Job.objects.filter(pk=rolled_back.id).exists()
    # A second enqueue matched by its idempotency key creates nothing and says nothing.
    first = enqueue("qa.echo", queue="sig", idempotency_key="k1")
    again = enqueue("qa.echo", queue="sig", idempotency_key="k1")
    assert again.created is False
    assert len(recorder.of("job_enqueued", first.id)) == 1
    many = enqueue_many([("qa.noop", n) for n in range(3)], queue="bulk")
    assert [kw["job_id"] for kw in recorder.of("job_enqueued") if kw["queue"] == "bulk"] == [
        job.id for job in many
    ]
    assert [kw["payload"] for kw in recorder.of("job_enqueued") if kw["queue"] == "bulk"] == [
        0,
        1,
        2,
    ]


def test_job_started_and_succeeded(recorder: Recorder, run_worker: Any) -> None:
    job = enqueue("qa.echo", {"n": 7}, queue="sig")
    run_worker(["sig"], burst=True).join()
    (started,) = recorder.of("job_started", job.id)
    assert started["attempt"] == 1
    assert started["max_attempts"] >= 1
    assert started["lease_version"] == 1
    assert started["context"].payload == {"n": 7}
    assert started["queue"] == "sig"
    (succeeded,) = recorder.of("job_succeeded", job.id)
    assert json.loads(succeeded["result"]) == {"n": 7}  # the return value as JSON text
    assert succeeded["worker_id"] == started["worker_id"]
    # Sent after the completion was written: the table says so already.
    assert JobState.objects.get(pk=job.id).status == "completed"
    assert recorder.of("job_failed") == recorder.of("job_retried") == []


def test_job_retried_carries_the_delay_then_job_failed_when_attempts_are_spent(
    recorder: Recorder, run_worker: Any, settings: Any
) -> None:
    settings.PGQUEUE = {"RETRY_BACKOFF_BASE": 0.05, "RETRY_BACKOFF_CAP": 0.1}
    job = enqueue("qa.fail", queue="sig")  # max_attempts=3
    run_worker(["sig"], poll_interval=0.05)
    wait_until(lambda: len(recorder.of("job_failed", job.id)) == 1)
    retried = recorder.of("job_retried", job.id)
    assert [kw["attempt"] for kw in retried] == [1, 2]
    assert all(0 <= kw["delay"] <= 0.1 for kw in retried)
    assert all("qa.fail always fails" in kw["error"] for kw in retried)
    assert all(kw["run_at"] is not None for kw in retried)
    (failed,) = recorder.of("job_failed", job.id)
    assert failed["attempt"] == 3
    assert failed["error"] == "ValueError: qa.fail always fails (attempt 3)"
    assert JobState.objects.get(pk=job.id).status == "dead"


def test_job_failed_for_a_permanent_failure(recorder: Recorder, run_worker: Any) -> None:
    job = enqueue("qa.permanent", queue="sig")
    run_worker(["sig"], burst=True).join()
    (failed,) = recorder.of("job_failed", job.id)
    assert failed["attempt"] == 1
    assert "PermanentFailure" in failed["error"]
    assert recorder.of("job_retried", job.id) == []


def test_job_lease_lost_is_sent_once(recorder: Recorder, run_worker: Any) -> None:
    job = enqueue("qa.sleep", {"seconds": 1.5}, queue="sig")
    run_worker(["sig"], lease=1.2, heartbeat_interval=0.2)
    wait_until(lambda: recorder.of("job_started", job.id))
    # Someone else takes the job over (as a sweep would): the worker's lease is dead.
    sql(
        "UPDATE queue_job_state SET status = 'pending', locked_by = NULL, "
        "locked_until = NULL, lease_version = lease_version + 1, run_at = now() + '1 hour' "
        "WHERE job_id = %s",
        [job.id],
    )
    wait_until(lambda: recorder.of("job_lease_lost", job.id))
    time.sleep(2.0)  # the handler ends and its completion is refused: no second signal
    (lost,) = recorder.of("job_lease_lost", job.id)
    assert lost["lease_version"] == 1
    assert lost["detected_by"] in ("renewal", "write")
    assert recorder.of("job_succeeded", job.id) == []
    assert JobState.objects.get(pk=job.id).status == "pending"


def test_a_renewal_finds_the_lease_lost_while_the_handler_runs(
    recorder: Recorder, run_worker: Any
) -> None:
    job = enqueue("qa.sleep", {"seconds": 4}, queue="sig")
    counters = WorkerCounters()
    worker = run_worker(["sig"], lease=2, heartbeat_interval=0.2, observers=[counters])
    wait_until(lambda: recorder.of("job_started", job.id))
    sql(
        "UPDATE queue_job_state SET status = 'pending', locked_by = NULL, "
        "locked_until = NULL, lease_version = lease_version + 1, run_at = now() + '1 hour' "
        "WHERE job_id = %s",
        [job.id],
    )
    # The heartbeat (every 0.2 s) sees it long before the 4 s handler's write could.
    wait_until(lambda: recorder.of("job_lease_lost", job.id), timeout=120)
    (lost,) = recorder.of("job_lease_lost", job.id)
    assert lost["detected_by"] == "renewal"
    assert lost["attempt"] == 1
    assert lost["worker_id"] == worker.worker.worker_id
    counts = counters.attempts()
    assert counts == {("sig", "qa.sleep", "lease_lost"): 1}


def test_job_cancelled_on_commit(recorder: Recorder) -> None:
    job = enqueue("qa.noop", queue="sig")
    with transaction.atomic():
        report = actions.cancel([job.id])
        assert report.changed == [job.id]
        assert recorder.of("job_cancelled") == []
    assert recorder.of("job_cancelled") == [{"job_id": job.id, "queue": "sig", "type": "qa.noop"}]
    actions.cancel([job.id])  # already cancelled: nothing changes, nothing is sent
    assert len(recorder.of("job_cancelled")) == 1


def test_a_failing_receiver_is_logged_and_never_harms_the_job(
    run_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise ZeroDivisionError("receiver bug")

    names = ("job_enqueued", "job_started", "job_succeeded")
    for name in names:
        getattr(signals, name).connect(broken, weak=False)
    try:
        with caplog.at_level(logging.ERROR):
            job = enqueue("qa.echo", {"n": 1}, queue="sig")
            run_worker(["sig"], burst=True).join()
    finally:
        for name in names:
            getattr(signals, name).disconnect(broken)
    state = JobState.objects.get(pk=job.id)
    assert state.status == "completed"
    assert state.attempts == 1
    logged = [r for r in caplog.records if "receiver bug" in r.getMessage()]
    assert len(logged) == 3  # enqueued, started, succeeded
    assert all(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in logged)
