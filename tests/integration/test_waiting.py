"""wait() / await_job(): a job's outcome, woken by the NOTIFY of the statement that ends it.

Tests that prove the wake-up set the waits' own rechecks to an hour (`no_rechecks`)
and wait without a timeout: only a NOTIFY can end such a wait before the test's hang
guard, so a finishing statement that forgot to notify fails the test instead of
passing late.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from django_pgqueue import (
    JobCancelled,
    JobDead,
    JobNotFound,
    WaitTimeout,
    actions,
    await_job,
    chain,
    enqueue,
    step,
    wait,
    waiting,
)
from django_pgqueue.store.waiting import FINISHED_CHANNEL
from django_pgqueue.testing import run_due_jobs
from tests.conftest import database_url, sql

pytestmark = pytest.mark.django_db(transaction=True)
HANG_GUARD = 60.0


@pytest.fixture
def no_rechecks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "FIRST_RECHECK", 3600.0)
    monkeypatch.setattr(waiting, "MAX_RECHECK", 3600.0)


class Waiter:
    """wait() in a thread of its own; `outcome()` is its return value or its exception."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.value = call()
        except BaseException as exc:
            self.error = exc

    def outcome(self) -> Any:
        self.thread.join(HANG_GUARD)
        assert not self.thread.is_alive(), "the wait did not end"
        if self.error is not None:
            raise self.error
        return self.value


def waiters(job_id: int) -> int:
    return sql("SELECT count(*) FROM queue_job_waiters WHERE job_id = %s", [job_id])[0][0]


def waiters_elsewhere(job_id: int) -> int:
    """`waiters()` from a thread of asyncio's executor, closing that thread's connection."""
    try:
        return waiters(job_id)
    finally:
        connection.close()


def registered(job_id: int) -> None:
    """Return once a wait for `job_id` has registered (so its job is finished after)."""
    deadline = time.monotonic() + HANG_GUARD
    while not waiters(job_id):
        assert time.monotonic() < deadline, "the wait never registered"
        time.sleep(0.01)


def test_wait_returns_the_result_a_worker_stored(run_worker, no_rechecks):
    job = enqueue("qa.echo", {"n": [1, 2]}, queue="mail")
    waiter = Waiter(lambda: wait(job.id))
    registered(job.id)
    run_worker(["mail"])
    assert waiter.outcome() == {"n": [1, 2]}
    assert waiters(job.id) == 0  # the wait removed its row


def test_a_finished_job_returns_at_once_and_the_method_on_enqueued_job(run_worker):
    job = enqueue("qa.echo", "done", queue="mail")
    assert run_due_jobs(["mail"])["completed"] == 1
    assert job.wait(timeout=0) == "done"
    assert wait(job, timeout=0) == "done"


def test_a_retried_job_returns_the_result_of_its_successful_attempt(run_worker):
    # qa.flaky fails its first attempt, then returns "ok" (fixed delay retry of ~0).
    job = enqueue("qa.flaky", {}, queue="mail")
    run_worker(["mail"])
    assert wait(job, timeout=HANG_GUARD) == "ok"


def test_a_dead_job_raises_with_its_last_error(run_worker, no_rechecks):
    job = enqueue("qa.fail", {}, queue="mail", max_attempts=1)
    waiter = Waiter(lambda: wait(job))
    registered(job.id)
    run_worker(["mail"])
    with pytest.raises(JobDead) as caught:
        waiter.outcome()
    stored = sql("SELECT last_error FROM queue_job_state WHERE job_id = %s", [job.id])[0][0]
    assert caught.value.last_error == stored
    assert stored
    assert caught.value.error_class == "ValueError"
    assert caught.value.job_id == job.id
    assert f"job #{job.id} is dead: " in str(caught.value)


def test_a_permanent_failure_raises_job_dead(run_worker):
    job = enqueue("qa.permanent", {}, queue="mail")
    run_worker(["mail"])
    with pytest.raises(JobDead, match="is dead"):
        wait(job, timeout=HANG_GUARD)


def test_an_operator_cancel_wakes_the_wait(no_rechecks):
    job = enqueue("qa.noop", {}, queue="mail", delay=3600)
    waiter = Waiter(lambda: wait(job))
    registered(job.id)
    assert actions.cancel([job.id]).changed == [job.id]
    with pytest.raises(JobCancelled, match=f"job #{job.id} was cancelled"):
        waiter.outcome()


def test_a_step_its_dependency_cancelled_wakes_the_wait(no_rechecks):
    # b waits for a, c for b: cancelling a cancels b and c in the settle step, level
    # after level, and each of their waits is woken though nobody waits on a.
    run = chain(
        step("qa.noop", {}, queue="mail"),
        step("qa.noop", {}, queue="mail"),
        step("qa.noop", {}, queue="mail"),
    ).enqueue()
    a_id, b_id, c_id = run.jobs.values()
    waits = {job_id: Waiter(lambda job_id=job_id: wait(job_id)) for job_id in (b_id, c_id)}
    for job_id in waits:
        registered(job_id)
    assert actions.cancel([a_id]).changed == [a_id]
    for job_id, waiter in waits.items():
        with pytest.raises(JobCancelled, match=f"job #{job_id} was cancelled"):
            waiter.outcome()


def test_a_job_the_sweep_marks_dead_wakes_the_wait(stores, no_rechecks):
    job = enqueue("qa.noop", {}, queue="mail", max_attempts=1)
    store = stores()
    (_claimed,) = store.claim("mail", 1, "gone-worker", 30.0)
    waiter = Waiter(lambda: wait(job))
    registered(job.id)
    sql(
        "UPDATE queue_job_state SET locked_until = now() - interval '1 second' WHERE job_id = %s",
        [job.id],
    )
    assert [row[0] for row in store.sweep()] == [job.id]
    with pytest.raises(JobDead, match="lease expired"):
        waiter.outcome()


def test_timeout_on_a_job_that_never_runs():
    job = enqueue("qa.noop", {}, queue="mail", delay=3600)
    with pytest.raises(WaitTimeout) as caught:
        wait(job, timeout=0.2)
    assert isinstance(caught.value, TimeoutError)
    assert str(caught.value) == f"job #{job.id} did not finish within 0.2s (it is pending)"
    assert waiters(job.id) == 0
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job.id]) == [("pending",)]


def test_a_job_enqueued_in_an_open_transaction_is_not_found_yet():
    with transaction.atomic():
        job = enqueue("qa.noop", {}, queue="mail")
        with pytest.raises(JobNotFound, match="commit the enqueue before waiting"):
            wait(job, timeout=HANG_GUARD)


def test_no_such_job():
    with pytest.raises(JobNotFound, match=r"no job #987654321: .*commit the enqueue"):
        wait(987654321, timeout=1)


@pytest.mark.parametrize(
    ("job", "timeout", "error", "message"),
    [
        (1, -1, ValueError, "timeout must be >= 0 seconds or None, got -1"),
        (1, float("nan"), ValueError, "timeout must be >= 0"),
        (1, "5", TypeError, "timeout must be a number of seconds or None, got '5'"),
        (1, True, TypeError, "timeout must be a number"),
        (
            "seven",
            1,
            TypeError,
            r"wait\(\) takes a job id \(a bigint >= 1\), a result id .*got 'seven'",
        ),
        ("queues2:0", 1, TypeError, "takes a job id"),
        (1.0, 1, TypeError, "takes a job id"),
        (0, 1, TypeError, "takes a job id"),
        (2**63, 1, TypeError, "takes a job id"),
    ],
)
def test_bad_arguments_are_refused_before_connecting(job, timeout, error, message):
    with pytest.raises(error, match=message):
        wait(job, timeout=timeout)


def test_await_job_returns_the_result(run_worker, no_rechecks):
    job = enqueue("qa.echo", [3], queue="mail")

    async def main() -> Any:
        waiting_task = asyncio.ensure_future(await_job(job))
        while not await asyncio.to_thread(waiters_elsewhere, job.id):
            await asyncio.sleep(0.01)
        run_worker(["mail"])
        return await asyncio.wait_for(waiting_task, HANG_GUARD)

    assert asyncio.run(main()) == [3]
    assert waiters(job.id) == 0


def test_await_job_raises_like_wait():
    dead = enqueue("qa.permanent", {}, queue="mail")
    never = enqueue("qa.noop", {}, queue="mail", delay=3600)
    run_due_jobs(["mail"])
    with pytest.raises(JobDead):
        asyncio.run(dead.wait_async(timeout=HANG_GUARD))
    with pytest.raises(WaitTimeout):
        asyncio.run(await_job(never.id, timeout=0.1))
    assert waiters(never.id) == 0


def test_a_cancelled_await_removes_its_row():
    job = enqueue("qa.noop", {}, queue="mail", delay=3600)

    async def main() -> None:
        waiting_task = asyncio.ensure_future(await_job(job))
        while not await asyncio.to_thread(waiters_elsewhere, job.id):
            await asyncio.sleep(0.01)
        waiting_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting_task

    asyncio.run(main())
    assert waiters(job.id) == 0


def test_a_crashed_waiters_row_is_deleted_by_the_next_registration():
    job = enqueue("qa.noop", {}, queue="mail", delay=3600)
    sql(
        "INSERT INTO queue_job_waiters (job_id, queue, expires_at) "
        "VALUES (%s, 'mail', now() - interval '1 second')",
        [job.id],
    )
    with pytest.raises(WaitTimeout):
        wait(job, timeout=0)
    assert waiters(job.id) == 0


def test_jobs_nobody_waits_on_send_no_notification(run_worker):
    listener = psycopg.connect(database_url(), autocommit=True)
    try:
        listener.execute(f"LISTEN {FINISHED_CHANNEL}")
        done = enqueue("qa.echo", 1, queue="mail")
        dead = enqueue("qa.permanent", {}, queue="mail")
        cancelled = enqueue("qa.noop", {}, queue="mail", delay=3600)
        actions.cancel([cancelled.id])
        assert run_due_jobs(["mail"])["completed"] == 1
        assert {done.id, dead.id} == {
            row[0]
            for row in sql(
                "SELECT job_id FROM queue_job_state WHERE status IN ('completed', 'dead')"
            )
        }
        # Notifications arrive in commit order: the marker sent now comes first only if
        # none of those finishing statements sent one.
        sql("SELECT pg_notify(%s, 'marker')", [FINISHED_CHANNEL])
        first = next(listener.notifies(timeout=HANG_GUARD, stop_after=1))
        assert first.payload == "marker"
    finally:
        listener.close()


def test_an_await_cancelled_at_any_moment_leaves_no_waiter_row():
    # Cancellations spread over the wait's start: some land while its row is committed
    # but the answer naming it is not read yet.
    job = enqueue("qa.noop", {}, queue="mail", delay=3600)

    async def main() -> int:
        for moment in range(120):
            waiting_task = asyncio.ensure_future(await_job(job))
            await asyncio.sleep(moment * 0.0002)
            waiting_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting_task
        return await asyncio.to_thread(waiters_elsewhere, job.id)

    assert asyncio.run(main()) == 0
