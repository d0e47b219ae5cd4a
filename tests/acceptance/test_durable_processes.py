"""Durable steps in `run_queue_worker` processes killed or frozen at the worst moment."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from django_pgqueue import enqueue
from tests.conftest import database_url, sql

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER_ARGS = ("--lease", "2", "--heartbeat-interval", "0.5", "--sweep-interval", "0.5")


def wait_for(predicate: Callable[[], Any], timeout: float = 120.0) -> Any:
    """Until `predicate()` is truthy (the timeout is a hang guard); its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def calls(job_id: int) -> dict[str, int]:
    rows = sql(
        "SELECT step, count(*) FROM qa_durable_call WHERE job_id = %s GROUP BY step", [job_id]
    )
    return dict(rows)


def status(job_id: int) -> str:
    return sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])[0][0]


def backend(condition: str) -> int | None:
    """The pid of this database's backend matching `condition`, if one does."""
    rows = sql(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND " + condition
    )
    return rows[0][0] if rows else None


def test_a_worker_killed_between_a_steps_function_and_its_checkpoint_runs_it_again(
    worker_process, tmp_path
):
    go = tmp_path / "go"
    job = enqueue("qa.durable_steps", {"steps": 3, "hold_at": 1, "hold": str(go)}, queue="dk")
    first = worker_process("dk", *WORKER_ARGS)
    wait_for(lambda: calls(job.id).get("s1") == 1)
    # The job's state row held by the test: the step's fenced checkpoint (FOR SHARE)
    # waits on it, its function returned.
    with psycopg.connect(database_url()) as lock:
        lock.execute("SELECT FROM queue_job_state WHERE job_id = %s FOR UPDATE", [job.id])
        go.touch()
        waiting = wait_for(
            lambda: backend("wait_event_type = 'Lock' AND query LIKE '-- name: step_record%%'")
        )
        first.kill()
        # The server ends a dead client's backend when it next talks to it (or at a
        # keepalive): here at once, before its statement could commit.
        sql("SELECT pg_terminate_backend(%s)", [waiting])
        wait_for(lambda: backend(f"pid = {waiting}") is None)
        lock.rollback()
    assert calls(job.id) == {"s0": 1, "s1": 1}
    worker_process("dk", *WORKER_ARGS)
    wait_for(lambda: status(job.id) == "completed")
    # s0's checkpoint was committed: not run again; s1's was not: run once more.
    assert calls(job.id) == {"s0": 1, "s1": 2, "s2": 1}
    # The sweep and the claim each moved the lease on: the later steps are the new
    # owner's.
    (final,) = sql("SELECT lease_version FROM queue_job_state WHERE job_id = %s", [job.id])[0]
    assert final > 1
    assert sql(
        "SELECT name, lease_version FROM queue_job_steps WHERE job_id = %s ORDER BY name",
        [job.id],
    ) == [("s0", 1), ("s1", final), ("s2", final)]


def test_a_frozen_stale_owners_atomic_step_rolls_back_whole(worker_process, tmp_path):
    go = tmp_path / "go"
    job = enqueue("qa.durable_atomic", {"hold": str(go)}, queue="da")
    first = worker_process("da", *WORKER_ARGS)
    # Its atomic step wrote its effect and holds the transaction open: frozen there.
    wait_for(
        lambda: backend(
            "state = 'idle in transaction' AND query LIKE 'INSERT INTO \"qa_durable_effect\"%%'"
        )
    )
    first.signal(signal.SIGSTOP)
    try:
        worker_process("da", *WORKER_ARGS)
        # Its lease ran out and the sweep moved the lease on; the other worker's run of
        # the job, once it claims it, waits on the frozen transaction's effect's key.
        wait_for(
            lambda: (
                sql("SELECT lease_version FROM queue_job_state WHERE job_id = %s", [job.id])[0][0]
                >= 2
            )
        )
        go.touch()
    finally:
        first.signal(signal.SIGCONT)
    wait_for(lambda: status(job.id) == "completed")
    (final,) = sql("SELECT lease_version FROM queue_job_state WHERE job_id = %s", [job.id])[0]
    # The stale owner's checkpoint was refused by the fence, so its transaction (the
    # effect with it) rolled back; each effect exists once, the new owner's.
    assert sql(
        "SELECT step, lease_version FROM qa_durable_effect WHERE job_id = %s ORDER BY step",
        [job.id],
    ) == [("a1", final), ("a2", final)]
    assert sql(
        "SELECT name, kind, lease_version FROM queue_job_steps WHERE job_id = %s ORDER BY name",
        [job.id],
    ) == [("a1", "atomic", final), ("a2", "atomic", final), ("s", "step", final)]
    stale = sql(
        "SELECT status FROM queue_attempts WHERE job_id = %s AND lease_version = 1", [job.id]
    )
    assert stale == [("lost",)]
