"""Async handlers on the worker's event loop: each outcome, timeouts, cancellation,
handlers that swallow their cancellation or block the loop, lost leases, Django's
async ORM, and a worker serving async and sync handlers at once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from qa.jobs import RELEASE

from django_pgqueue import actions, enqueue, enqueue_many
from django_pgqueue.models import Attempt, JobState
from django_pgqueue.testing import run_due_jobs
from tests.conftest import sql
from tests.integration.test_worker import wait_until
from tests.integration.test_worker_faults import status

pytestmark = pytest.mark.django_db(transaction=True)

HANG_GUARD = 60.0  # seconds: a hang guard, not a bound the test measures


def attempts(job_id: int) -> list[Attempt]:
    return list(Attempt.objects.filter(job_id=job_id).order_by("lease_version"))


def settled(job_id: int) -> bool:
    return status(job_id) in ("completed", "dead", "cancelled")


def test_an_async_handler_that_returns_completes_its_job_with_its_result(run_worker):
    job = enqueue("qa.aoutcome", {"do": "return"}, queue="aret")
    worker = run_worker(["aret"], poll_interval=0.1)
    wait_until(lambda: status(job.id) == "completed", timeout=HANG_GUARD)
    [attempt] = attempts(job.id)
    assert attempt.status == "succeeded"
    # It ran on the event loop, not on a handler thread.
    assert worker.worker._dispatcher.aio.started
    assert worker.worker._dispatcher.aio.in_flight == 0


@pytest.mark.parametrize(
    ("do", "final", "error_class", "count"),
    [
        ("raise", "dead", "ValueError", 2),  # retried by its policy, then dead
        ("permanent", "dead", "django_pgqueue.exceptions.PermanentFailure", 1),
        ("retry_later", "dead", "django_pgqueue.exceptions.RetryLater", 2),
    ],
)
def test_an_async_handler_that_raises_is_failed_like_a_sync_one(
    run_worker, do, final, error_class, count
):
    job = enqueue("qa.aoutcome", {"do": do}, queue="araise")
    run_worker(["araise"], poll_interval=0.1)
    wait_until(lambda: status(job.id) == final, timeout=HANG_GUARD)
    runs = attempts(job.id)
    assert len(runs) == count
    assert {a.error_class for a in runs} == {error_class}
    assert [a.status for a in runs][-1] == "failed"
    if count == 2:
        assert runs[0].status in ("failed", "retried")


def test_an_async_handler_that_snoozes_comes_back_with_its_attempt_given_back(run_worker):
    job = enqueue("qa.aoutcome", {"do": "snooze"}, queue="asnz", max_attempts=1)
    run_worker(["asnz"], poll_interval=0.1)
    # Snoozed each time it runs: its attempts are given back, so it never goes dead.
    wait_until(lambda: Attempt.objects.filter(job_id=job.id).count() >= 2, timeout=HANG_GUARD)
    assert status(job.id) in ("pending", "running")
    assert {a.status for a in attempts(job.id)} <= {"snoozed", "running"}


def test_an_async_handler_past_its_timeout_is_cancelled_and_failed_once(run_worker):
    job = enqueue("qa.aoutcome", {"do": "hang", "seconds": 600}, queue="ato", max_attempts=1)
    worker = run_worker(["ato"], poll_interval=0.1, job_timeout=1.0)
    wait_until(lambda: status(job.id) == "dead", timeout=HANG_GUARD)
    [attempt] = attempts(job.id)
    assert attempt.error_class == "django_pgqueue.exceptions.JobTimeout"
    # Cancelled at the timeout: the attempt lasted about the timeout, not the 600 s.
    assert (attempt.finished_at - attempt.started_at).total_seconds() < 30
    wait_until(lambda: worker.worker._dispatcher.aio.in_flight == 0, timeout=HANG_GUARD)
    assert worker.worker.stats["timed_out"] == 1
    assert worker.worker._dispatcher.aio.ignored_cancel == 0


@pytest.mark.parametrize("do", ["swallow", "swallow_return"])
def test_an_async_handler_that_swallows_its_cancellation_is_reported_and_its_job_held(
    run_worker, caplog, do
):
    # It ignores the cancellation its timeout sent: it is named and counted, and its job
    # keeps its row until the task really ended (the hold); then it is failed once.
    job = enqueue("qa.aoutcome", {"do": do, "seconds": 600}, queue="aswl", max_attempts=1)
    caplog.set_level(logging.WARNING, logger="django_pgqueue.worker.aio")
    worker = run_worker(["aswl"], poll_interval=0.1, job_timeout=1.0)
    wait_until(lambda: worker.worker._dispatcher.aio.ignored_cancel == 1, timeout=HANG_GUARD)
    warned = [r.getMessage() for r in caplog.records if "CancelledError" in r.getMessage()]
    assert warned, caplog.text
    assert "qa.aoutcome" in warned[0]
    if do == "swallow":  # still running: held meanwhile, until it ends
        assert status(job.id) == "running"
        RELEASE.set()
    try:
        wait_until(lambda: status(job.id) == "dead", timeout=HANG_GUARD)
    finally:
        RELEASE.clear()
    [attempt] = attempts(job.id)
    assert attempt.error_class == "django_pgqueue.exceptions.JobTimeout"
    # The worker goes on running async jobs.
    later = enqueue("qa.aoutcome", {"do": "return"}, queue="aswl")
    wait_until(lambda: status(later.id) == "completed", timeout=HANG_GUARD)


def test_an_async_handler_that_blocks_the_loop_is_named_and_its_timeout_still_lands(
    run_worker, caplog
):
    caplog.set_level(logging.WARNING, logger="django_pgqueue.worker.aio")
    job = enqueue("qa.aoutcome", {"do": "block", "seconds": 8}, queue="ablk", max_attempts=1)
    worker = run_worker(["ablk"], poll_interval=0.1, job_timeout=1.0)
    aio = worker.worker._dispatcher
    # The loop is blocked for 8 s: the watchdog records the timeout meanwhile.
    wait_until(lambda: status(job.id) == "dead", timeout=HANG_GUARD)
    [attempt] = attempts(job.id)
    assert attempt.error_class == "django_pgqueue.exceptions.JobTimeout"
    blocked = [r.getMessage() for r in caplog.records if "event loop is blocked" in r.getMessage()]
    assert blocked, caplog.text
    assert f"job {job.id} (qa.aoutcome)" in blocked[0]
    assert aio.aio.blocked >= 1
    assert aio.aio.lag_max >= 0.25
    later = enqueue("qa.aoutcome", {"do": "return"}, queue="ablk")
    wait_until(lambda: status(later.id) == "completed", timeout=HANG_GUARD)


def test_an_operator_cancel_is_delivered_to_an_async_handler_as_task_cancellation(run_worker):
    job = enqueue("qa.aoutcome", {"do": "hang", "seconds": 600}, queue="acan")
    run_worker(["acan"], poll_interval=0.1, lease=3.0)
    wait_until(lambda: status(job.id) == "running", timeout=HANG_GUARD)
    wait_until(lambda: Attempt.objects.filter(job_id=job.id).exists(), timeout=HANG_GUARD)
    actions.cancel([job.id])
    # Seen at the next renewal (a third of the lease), then the task is cancelled.
    wait_until(lambda: status(job.id) == "cancelled", timeout=HANG_GUARD)
    # The attempt says how it ended: its task cancelled, on the operator's request.
    [attempt] = attempts(job.id)
    assert (attempt.status, attempt.error_class) == ("failed", "asyncio.CancelledError")
    assert "operator" in attempt.error_message
    assert (attempt.finished_at - attempt.started_at).total_seconds() < 30


def test_an_async_handler_whose_lease_is_lost_is_cancelled_and_its_write_refused(run_worker):
    job = enqueue("qa.aoutcome", {"do": "hang", "seconds": 600}, queue="alost")
    worker = run_worker(["alost"], poll_interval=0.1, lease=3.0, sweep_interval=600)
    wait_until(lambda: status(job.id) == "running", timeout=HANG_GUARD)
    # Another owner takes the job: its lease version moves on under this worker.
    sql(
        "UPDATE queue_job_state SET lease_version = lease_version + 1, locked_by = 'other' "
        "WHERE job_id = %s",
        [job.id],
    )
    aio = worker.worker._dispatcher.aio
    wait_until(lambda: worker.worker.stats["leases_lost"] >= 1, timeout=HANG_GUARD)
    wait_until(lambda: aio.in_flight == 0, timeout=HANG_GUARD)
    # Its task was cancelled, its outcome's write refused: the new owner's row stands.
    state = JobState.objects.get(pk=job.id)
    assert (state.status, state.locked_by) == ("running", "other")


def test_async_orm_and_sync_to_async_in_handlers_leak_no_connection(run_worker):
    before = _connections()
    jobs = enqueue_many([("qa.aoutcome", {"do": "orm", "pause": 0.05})] * 200, queue="aorm")
    worker = run_worker(["aorm"], poll_interval=0.1, batch_size=100, async_concurrency=100)
    ids = [job.id for job in jobs]
    wait_until(
        lambda: (
            sql(
                "SELECT count(*) FROM queue_job_state "
                "WHERE job_id = ANY(%s) AND status = 'completed'",
                [ids],
            )[0][0]
            == 200
        ),
        timeout=HANG_GUARD,
    )
    # 200 jobs, 100 at once, each with three database calls: the loop's calls share
    # Django's one thread for thread-sensitive work, so one connection (not one per
    # job or per task) serves them; the worker's own are its dispatcher's, heartbeat's,
    # listener's and its periodic services'.
    during = _connections()
    assert during - before <= 6, (before, during)
    worker.worker.stop()
    worker.thread.join(HANG_GUARD)
    wait_until(lambda: _connections() <= before, timeout=HANG_GUARD)


def test_a_worker_runs_async_and_sync_handlers_at_once(run_worker):
    # The first claim (sized to the free threads) brings async jobs: from then on the
    # queue's claims count the loop's free places too, and bring the sync jobs along.
    many_async = enqueue_many([("qa.asleep", {"seconds": 1.0})] * 50, queue="mix")
    slow_sync = enqueue_many([("qa.sleep", {"seconds": 1.0})] * 2, queue="mix")
    worker = run_worker(["mix"], concurrency=2, async_concurrency=50, batch_size=100, burst=True)
    worker.thread.join(HANG_GUARD)
    ids = [job.id for job in slow_sync + many_async]
    runs, overlapping = sql(
        "SELECT count(*), max(started_at) < min(finished_at) FROM qa_ledger WHERE job_id = ANY(%s)",
        [ids],
    )[0]
    assert runs == 52
    # All 52 ran at the same time: 50 on the loop, 2 on the threads.
    assert overlapping, "the async and sync handlers did not all run at once"


def _connections() -> int:
    return sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    )[0][0]


def test_a_worker_without_async_handlers_starts_no_event_loop(run_worker):
    job = enqueue("qa.noop", {}, queue="plain")
    worker = run_worker(["plain"], poll_interval=0.1)
    wait_until(lambda: status(job.id) == "completed", timeout=HANG_GUARD)
    assert not worker.worker._dispatcher.aio.started


def test_a_stopping_worker_cancels_its_async_handlers_and_gives_their_attempts_back(run_worker):
    job = enqueue("qa.aoutcome", {"do": "hang", "seconds": 600}, queue="astop", max_attempts=1)
    worker = run_worker(["astop"], poll_interval=0.1, shutdown_grace=0.5)
    # The handler started (its ledger row): claimed only, it would be released instead.
    started = "SELECT count(*) FROM qa_ledger WHERE job_id = %s"
    wait_until(lambda: sql(started, [job.id])[0][0] == 1, timeout=HANG_GUARD)
    worker.stop(timeout=HANG_GUARD)
    # Interrupted by the shutdown: due again at once, its one attempt given back.
    [attempt] = attempts(job.id)
    assert attempt.status == "interrupted"
    state = JobState.objects.get(pk=job.id)
    assert (state.status, state.attempts) == ("pending", 0)
    assert not worker.worker.event_loop._thread.is_alive()


def test_a_worker_run_from_async_code_completes_an_async_task():
    # As Django's own Tasks tests run a worker: from async code, through sync_to_async.
    # The task's own sync_to_async calls must not be sent to the calling thread (it is
    # inside the worker): the worker's tasks run in a context of their own.
    job = enqueue("qa.aoutcome", {"do": "return"}, queue="afromasync")

    async def main() -> Any:
        run = sync_to_async(run_due_jobs)
        return await asyncio.wait_for(run(["afromasync"], concurrency=1), HANG_GUARD)

    counts = asyncio.run(main())
    assert counts["completed"] == 1
    assert status(job.id) == "completed"
