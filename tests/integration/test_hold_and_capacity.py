"""The hold and the capacity count, with real worker threads and connections.

One hold: while a handler may still execute (past its timeout, an event loop blocked
past it, a shutdown past its grace), its job keeps its row and its slots until the code
really returned. One capacity count: `concurrency` handler threads and
`async_concurrency` event-loop tasks are hard limits that no claim can pass.

What executes when is recorded by the handlers themselves (`qa.jobs.EXECUTIONS`, in
this process's monotonic clock); the tests compare those records with each other and
with what the database said meanwhile, never with a wall-clock bound.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

import psycopg
import psycopg.sql
import pytest
from django.db import connection
from qa.jobs import EXECUTIONS

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.control.api import set_queue_limit
from tests.conftest import sql
from tests.integration.test_worker import wait_until
from tests.integration.test_worker_faults import status

pytestmark = pytest.mark.django_db(transaction=True)

HANG_GUARD = 60.0  # seconds: a hang guard, not a bound the tests measure


@pytest.fixture(autouse=True)
def executions():
    EXECUTIONS.reset()
    yield EXECUTIONS
    EXECUTIONS.reset()


def finished(*job_ids: int) -> bool:
    return all(status(job_id) in ("completed", "dead", "cancelled") for job_id in job_ids)


def overlapping(spans: list[list[float | None]]) -> list[tuple[list, list]]:
    """The pairs of executions of one job that ran at the same time."""
    ordered = sorted(spans, key=lambda span: span[0])
    return [
        (first, second)
        for first, second in itertools.pairwise(ordered)
        if first[1] is None or second[0] < first[1]
    ]


class RowWatch:
    """Samples, from the test's side, whether a job's row was out of `running` while its
    handler still executed (read: one execution running before the status was read and
    still running after)."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RowWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(HANG_GUARD)

    def _run(self) -> None:
        from django.db import connection

        try:
            while not self._stop.wait(0.02):
                before = EXECUTIONS.running(self.job_id)
                row = status(self.job_id)
                # One execution ran from before the read to after it: the row it read
                # belongs to that run (a retry starting just after the read is another).
                if row != "running" and before & EXECUTIONS.running(self.job_id):
                    self.violations.append(row)
        finally:
            connection.close()


@pytest.mark.parametrize("threads", [1, 4])
def test_async_concurrency_is_a_hard_limit_whatever_the_threads(run_worker, threads):
    jobs = enqueue_many([("qa.aspan", {"seconds": 0.2})] * 6, queue="acap")
    run_worker(["acap"], concurrency=threads, async_concurrency=1)
    wait_until(lambda: finished(*(job.id for job in jobs)), timeout=HANG_GUARD)
    assert EXECUTIONS.most["async"] == 1


def test_a_sync_timeout_holds_the_handler_slot_until_the_handler_returns(run_worker):
    # Each handler outlives its timeout by more than a lease (not by as much again: it
    # never counts as stuck) in one C call; with one thread, the second job may start
    # only once the first call really returned.
    jobs = enqueue_many([("qa.span", {"seconds": 3.4, "c": True})] * 2, queue="stime")
    run_worker(["stime"], concurrency=1, job_timeout=2.0, lease=1.0)
    wait_until(lambda: finished(*(job.id for job in jobs)), timeout=HANG_GUARD)
    assert EXECUTIONS.most["sync"] == 1


def test_an_async_handler_blocking_the_loop_keeps_its_row_and_queue_slot(run_worker):
    # A queue of limit 1: the async job blocks the event loop past its timeout; the sync
    # job behind it may start only once the blocking call returned, and the async job's
    # row stays running until then.
    set_queue_limit("ablock", 1)
    blocking = enqueue("qa.aspan", {"seconds": 2.0, "block": True}, queue="ablock")
    behind = enqueue("qa.span", {"seconds": 0.1}, queue="ablock")
    with RowWatch(blocking.id) as watch:
        run_worker(["ablock"], concurrency=2, async_concurrency=2, job_timeout=0.5)
        wait_until(lambda: finished(blocking.id, behind.id), timeout=HANG_GUARD)
    assert watch.violations == []
    # Its first run timed out (the job was retried once the blocking call returned).
    blocked_until = EXECUTIONS.spans[blocking.id][0][1]
    [(behind_from, _)] = EXECUTIONS.spans[behind.id]
    assert behind_from >= blocked_until


def test_a_stopping_worker_holds_a_timed_out_job_until_its_handler_returns(run_worker):
    # Worker A's handler outlives its timeout in one C call when A is asked to stop;
    # worker B serves the same queue. The job runs again (its timeout spent an attempt)
    # only once A's call returned.
    job = enqueue("qa.span", {"seconds": 2.0, "c": True, "later": 0.05}, queue="sdhold")
    first = run_worker(["sdhold"], concurrency=1, job_timeout=0.3, shutdown_grace=10)
    wait_until(lambda: EXECUTIONS.started(job.id), timeout=HANG_GUARD)
    dispatcher = first.worker._dispatcher
    wait_until(lambda: any(item.timed_out for item in dispatcher.capacity), timeout=HANG_GUARD)
    run_worker(["sdhold"], concurrency=1)
    first.worker.stop_gracefully()
    wait_until(lambda: finished(job.id), timeout=HANG_GUARD)
    first.join(HANG_GUARD)
    assert len(EXECUTIONS.spans[job.id]) == 2
    assert overlapping(EXECUTIONS.spans[job.id]) == []


def test_a_stopping_worker_that_cannot_hold_a_job_leaves_it_running(run_worker):
    # Worker A's handler still runs when A's grace ends, and the database refuses the
    # connection A's hold needs (connections already open go on). A must not give the
    # job back by a write: worker B, connected before, would run it beside A's handler.
    # Its row stays running under A's lease; once that ran out (A's process gone), the
    # sweep gives the interrupted attempt back: the job, on its only attempt, runs again.
    job = enqueue("qa.span", {"seconds": 3.0, "later": 0.01}, queue="nohold", max_attempts=1)
    first = run_worker(["nohold"], concurrency=1, shutdown_grace=0.1, lease=60)
    wait_until(lambda: EXECUTIONS.started(job.id), timeout=HANG_GUARD)
    second = run_worker(["nohold"], concurrency=1, poll_interval=0.05, sweep_interval=0.2)
    wait_until(lambda: sessions(f"pgqueue worker {second.worker.worker_id}"), timeout=HANG_GUARD)
    with new_connections_refused(connection.settings_dict["NAME"]):
        first.worker.stop_gracefully()
        first.join(HANG_GUARD)
        wait_until(lambda: not EXECUTIONS.running(job.id), timeout=HANG_GUARD)
    assert len(EXECUTIONS.spans[job.id]) == 1
    assert status(job.id) == "running"
    assert attempts(job.id) == [("interrupted", first.worker.worker_id)]
    # A's process is gone, here in one process: its lease runs out now, not in a minute.
    sql("UPDATE queue_job_state SET locked_until = now() WHERE job_id = %s", [job.id])
    wait_until(lambda: finished(job.id), timeout=HANG_GUARD)
    assert status(job.id) == "completed"
    assert attempts(job.id) == [
        ("interrupted", first.worker.worker_id),
        ("succeeded", second.worker.worker_id),
    ]


def attempts(job_id: int) -> list[tuple[str, str]]:
    """The job's attempts: (status, worker), in order."""
    return sql(
        "SELECT status, worker_id FROM queue_attempts WHERE job_id = %s ORDER BY id", [job_id]
    )


@contextlib.contextmanager
def new_connections_refused(database: str) -> Iterator[None]:
    """The server refuses new sessions of `database` (those open go on), set from a
    session of the server's maintenance database (not of `database` itself)."""
    params = {**connection.get_connection_params(), "dbname": "postgres"}
    params.pop("cursor_factory", None)
    params.pop("context", None)
    name = psycopg.sql.Identifier(database)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
        try:
            yield
        finally:
            admin.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name))


def sessions(application_name: str) -> int:
    """The sessions of this database whose name starts with `application_name`."""
    [(count,)] = sql(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name LIKE %s",
        [application_name + "%"],
    )
    return count


@pytest.mark.parametrize("look", ["last collect", "hold"])
def test_a_handler_returning_as_the_shutdown_looks_has_its_own_outcome_written(
    run_worker, monkeypatch, caplog, look
):
    # The grace ends with the handler still running. It returns just after the
    # shutdown's last look at the outcomes ("last collect"), or while the shutdown
    # takes its hold ("hold"): either way it returned before it was recorded as
    # interrupted, so its own outcome is written and the job does not run again.
    from qa.jobs import RELEASE

    job = enqueue("qa.nap", {"seconds": HANG_GUARD}, queue="sdlook")
    first = run_worker(["sdlook"], concurrency=1, shutdown_grace=0.1)
    worker, dispatcher = first.worker, first.worker._dispatcher
    wait_until(lambda: any(item.started for item in dispatcher.capacity), timeout=HANG_GUARD)
    past_grace = threading.Event()  # the shutdown cancelled the async handlers: grace over

    def stop_async(stop=dispatcher.aio.stop):
        stop()
        past_grace.set()

    def then_return(real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            if past_grace.is_set() and not RELEASE.is_set():
                RELEASE.set()  # the handler returns and hands its outcome over, now
                wait_until(lambda: not dispatcher.pool._outcomes.empty(), timeout=HANG_GUARD)
            return result

        return call

    monkeypatch.setattr(dispatcher.aio, "stop", stop_async)
    if look == "last collect":
        monkeypatch.setattr(
            dispatcher, "collect_outcomes", then_return(dispatcher.collect_outcomes)
        )
    else:
        monkeypatch.setattr(worker, "_hold", then_return(worker._hold))
    worker.stop_gracefully()
    first.join(HANG_GUARD)
    assert worker.wait_for_held(HANG_GUARD)
    assert RELEASE.is_set()  # the handler returned where the test put it
    # Only its own outcome: recorded as interrupted too, its row would read the same (the
    # completion overwrites the attempt), but the shutdown would have said so.
    assert "handler(s) still running" not in caplog.text
    assert attempts(job.id) == [("succeeded", worker.worker_id)]
    assert status(job.id) == "completed"
