"""Cancel-in-progress (Unique.cancel_running): a new job of a key cancels the key's other
jobs, asks its running one to stop, and starts only once that job's code stopped.

Real connections and a real worker: the database decides under the key's sequence row,
and the hold (the running job keeps its place until its code returned) keeps the new
job from overlapping the cancelled one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import transaction

from django_pgqueue import EnqueuedJob, EnqueueError, Unique, enqueue, handler
from django_pgqueue.registry import registry
from tests.conftest import sql
from tests.integration.test_unique_races import HANG_GUARD, wave

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "cancel-running:1:abc"


def states(queue: str) -> list[tuple[int, str, bool]]:
    """(id, status, cancel requested) of every job of `queue`, oldest first."""
    return sql(
        "SELECT job_id, status, cancel_requested_at IS NOT NULL FROM queue_job_state "
        "WHERE queue = %s ORDER BY job_id",
        [queue],
    )


def wait_until(check, timeout: float = HANG_GUARD) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def start_running(
    run_worker: Any, type_: str, payload: Any, queue: str, key: Unique
) -> tuple[EnqueuedJob, Any]:
    """Enqueue a job of `key` and start a worker (renewals every 0.5 s bring a cancel
    request); return the job, once running, and the worker."""
    job = enqueue(type_, payload, queue=queue, unique=key)
    worker = run_worker([queue], lease=1.5, poll_interval=0.05)
    wait_until(lambda: states(queue)[0][1] == "running")
    return job, worker


def test_a_new_job_cancels_the_pending_one_and_asks_the_running_one_to_stop(stores):
    key = Unique.cancel_running("sync:7")
    store = stores()
    first = enqueue("qa.noop", {"n": 1}, queue="cr1", unique=key)
    assert first.created
    # Nothing running: the pending job of the key is cancelled, the new one is pending.
    second = enqueue("qa.noop", {"n": 2}, queue="cr1", unique=key)
    assert second.created
    assert second.id != first.id
    assert states("cr1") == [(first.id, "cancelled", False), (second.id, "pending", False)]
    (row,) = store.claim("cr1", 10, WORKER, 300)
    assert row.job_id == second.id
    # Running: asked to stop; the new job waits behind it (the hold).
    third = enqueue("qa.noop", {"n": 3}, queue="cr1", unique=key)
    fourth = enqueue("qa.noop", {"n": 4}, queue="cr1", unique=key)
    assert states("cr1")[1:] == [
        (second.id, "running", True),
        (third.id, "cancelled", False),
        (fourth.id, "waiting", False),
    ]
    assert store.claim("cr1", 10, WORKER, 300) == []
    # Its code returned: it ends cancelled, and only then the newest job is due.
    done = [(row.job_id, row.lease_version, row.attempt_id, None)]
    assert store.complete(done) == {row.job_id}
    assert states("cr1")[1:] == [
        (second.id, "cancelled", True),
        (third.id, "cancelled", False),
        (fourth.id, "pending", False),
    ]
    (row,) = store.claim("cr1", 10, WORKER, 300)
    assert row.job_id == fourth.id


def test_a_rolled_back_enqueue_cancels_nothing(stores):
    key = Unique.cancel_running("k")
    first = enqueue("qa.noop", queue="cr2", unique=key)
    (row,) = stores().claim("cr2", 10, WORKER, 300)
    assert row.job_id == first.id
    with transaction.atomic():
        enqueue("qa.noop", queue="cr2", unique=key)
        transaction.set_rollback(True)
    assert states("cr2") == [(first.id, "running", False)]


def test_a_cancel_running_key_takes_no_sequence_of_its_own():
    with pytest.raises(EnqueueError, match="takes no idempotency_key or unique key"):
        enqueue("qa.noop", queue="cr3", unique=Unique.cancel_running("k"), sequence="s")


@dataclass(frozen=True)
class Stubborn:
    gate: threading.Event  # set: the handler returns
    heard: threading.Event  # set by the handler once it heard the cancel request


@pytest.fixture
def stubborn(monkeypatch: Any) -> Iterator[Stubborn]:
    """The job type "cr.stubborn": its handler records its run in the ledger, notes when
    it hears a cancel request (`heard`), and ignores it until the test sets `gate` (or
    the test ends)."""
    # The test project's, loaded with Django.
    from qa.jobs import RELEASE
    from qa.ledger import ledger_end, ledger_start

    monkeypatch.setattr(registry, "_handlers", dict(registry._handlers))
    events = Stubborn(threading.Event(), threading.Event())
    gate, heard = events.gate, events.heard

    @handler("cr.stubborn")
    def stubborn_job(ctx: Any) -> None:
        entry = ledger_start(ctx)
        while not gate.wait(0.01) and not RELEASE.is_set():
            if ctx.cancel_requested():
                heard.set()
        ledger_end(entry)

    yield events
    gate.set()


def test_concurrent_enqueues_while_one_runs_leave_one_job_that_never_overlaps_it(
    run_worker, stubborn
):
    queue = "cr-race"
    key = Unique.cancel_running("tenant-1")
    # The running job ignores the request until the test lets it go: its code keeps
    # running while the enqueues race, and the worker holds it until it returns.
    first, worker = start_running(run_worker, "cr.stubborn", None, queue, key)
    result = wave(16, lambda n: enqueue("qa.sleep", {"seconds": 0.05}, queue=queue, unique=key))
    assert len(result.committed) == 8
    # Exactly one job of the wave is left: the last committed (ids are drawn under the
    # key's lock, in commit order), waiting while the first job's code runs; the rest
    # are cancelled.
    survivor = max(result.ids())
    rows = states(queue)
    assert rows[0] == (first.id, "running", True)
    assert [(job_id, status) for job_id, status, _ in rows[1:] if status != "cancelled"] == [
        (survivor, "waiting")
    ]
    assert len(rows) == 1 + len(result.committed)
    # The worker told the handler; its code still runs, so the survivor still waits.
    assert stubborn.heard.wait(HANG_GUARD)
    assert {j: s for j, s, _ in states(queue)}[survivor] == "waiting"
    assert sql("SELECT count(*) FROM queue_attempts WHERE job_id = %s", [survivor]) == [(0,)]
    stubborn.gate.set()
    wait_until(lambda: {j: s for j, s, _ in states(queue)}[survivor] == "completed")
    worker.stop()
    final = states(queue)
    assert [(job_id, status) for job_id, status, _ in final if status != "cancelled"] == [
        (survivor, "completed")
    ]
    assert final[0] == (first.id, "cancelled", True)
    # The code of the two jobs that ran (the ledger's clock_timestamp at their start and
    # end) never overlapped: the survivor started after the cancelled code returned.
    ran = sql(
        "SELECT job_id, started_at, finished_at FROM qa_ledger WHERE job_id = ANY(%s) "
        "ORDER BY started_at",
        [[job.id for job in result.committed] + [first.id]],
    )
    assert [job_id for job_id, _, _ in ran] == [first.id, survivor]
    assert ran[0][2] is not None
    assert ran[0][2] <= ran[1][1]


def test_a_handler_that_checks_stops_and_the_new_job_runs(run_worker):
    queue = "cr-stop"
    key = Unique.cancel_running("k")
    first, worker = start_running(run_worker, "qa.cancellable", {"seconds": 60}, queue, key)
    second = enqueue("qa.noop", queue=queue, unique=key)
    wait_until(lambda: [s for _, s, _ in states(queue)] == ["cancelled", "completed"])
    worker.stop()
    assert sql("SELECT result FROM queue_attempts WHERE job_id = %s", [first.id]) == [
        ('"stopped on request"',)
    ]
    (started,) = sql("SELECT started_at FROM queue_attempts WHERE job_id = %s", [second.id])[0]
    (ended,) = sql("SELECT finished_at FROM queue_attempts WHERE job_id = %s", [first.id])[0]
    assert ended <= started
