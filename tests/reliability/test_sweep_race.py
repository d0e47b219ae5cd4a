"""Scenario 4: the lease sweep against completions, claims and other sweeps.

The sweep (core.sql "lease_sweep") is one statement: it locks expired rows with
FOR UPDATE SKIP LOCKED and its UPDATE re-checks status, lease_version and the expiry
on the row it changes. These tests drive the production statements (Store.sweep,
Store.claim, the job_complete statement) from real threads and connections.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg
import pytest

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.sql import QUERIES
from django_pgqueue.store.arrays import int_array
from django_pgqueue.store.rows import owned_params
from django_pgqueue.store.worker import Store, connection_params
from tests.conftest import sql
from tests.reliability.conftest import overlapping_runs, size, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def store(name: str) -> Store:
    return Store("default", f"qa {name}")


def claim_all(queue: str, lease: float, worker_id: str = "qa-claimer") -> list[Any]:
    """Claim every due job of `queue` with the production claim, 500 at a time."""
    claimer = store(worker_id)
    rows: list[Any] = []
    try:
        while batch := claimer.claim(queue, 500, worker_id, lease):
            rows.extend(batch)
    finally:
        claimer.close()
    return rows


def wait_expired(count: int) -> None:
    wait_until(
        "SELECT count(*) FROM queue_job_state WHERE status = 'running' AND locked_until < now()",
        lambda n: n == count,
        timeout=30,
    )


def complete_params(row: Any) -> dict[str, Any]:
    return {
        **owned_params([(row.job_id, row.lease_version)]),
        "attempt_ids": int_array([row.attempt_id]),
        "results": "{}",
    }


def test_sweep_never_undoes_a_completion_in_flight(report):
    """4. The sweep races a completion"""
    job = enqueue("qa.noop", {}, queue="sr")
    (row,) = claim_all("sr", lease=0.5)
    wait_expired(1)

    # A completion that started before the sweep and has not committed yet: it holds
    # the row lock, the lease has already run out.
    completer = psycopg.connect(**connection_params("default", "qa completer"))
    try:
        cursor = completer.execute(QUERIES["job_complete"], complete_params(row))
        assert [r[0] for r in cursor.fetchall()] == [job.id]

        sweeper = store("sweeper")
        swept: list[Any] = []
        thread = threading.Thread(target=lambda: swept.extend(sweeper.sweep()))
        started = time.monotonic()
        thread.start()
        thread.join(5)
        sweep_s = time.monotonic() - started
        blocked = thread.is_alive()
        completer.commit()
        thread.join(10)
        assert not thread.is_alive()
        # The sweep skipped the locked row: it did not wait for the lock (and then
        # act on whatever the completion left), and it requeued nothing.
        assert swept == []
        assert not blocked, "the sweep waited on the completion's row lock"
        # And a sweep after the commit finds nothing to requeue either.
        assert sweeper.sweep() == []
        sweeper.close()
    finally:
        completer.close()

    state = sql(
        "SELECT status, lease_version, locked_by FROM queue_job_state WHERE job_id = %s", [job.id]
    )
    assert state == [("completed", 1, None)]
    attempts = sql(
        "SELECT status, lease_version FROM queue_attempts WHERE job_id = %s ORDER BY id", [job.id]
    )
    assert attempts == [("succeeded", 1)]

    # The other order: the sweep commits first, the completion that was waiting on
    # its lock is fenced off (zero rows) and the job is requeued, exactly once.
    job2 = enqueue("qa.noop", {}, queue="sr2")
    (row2,) = claim_all("sr2", lease=0.5)
    wait_expired(1)
    holder = psycopg.connect(
        **connection_params("default", "qa sweeper in a transaction"), autocommit=True
    )
    completer = psycopg.connect(**connection_params("default", "qa late completer"))
    try:
        holder.execute("BEGIN")
        sweeper = store("sweeper2")
        sweeper._conn = holder  # the production statement, inside an open transaction
        swept2 = sweeper.sweep()
        assert [(r[0], r[2], r[3]) for r in swept2] == [(job2.id, 1, "pending")]
        done: list[Any] = []
        late = threading.Thread(
            target=lambda: done.extend(
                completer.execute(QUERIES["job_complete"], complete_params(row2)).fetchall()
            )
        )
        late.start()
        time.sleep(0.3)
        assert late.is_alive(), "the completion should wait on the sweep's row lock"
        holder.execute("COMMIT")
        late.join(10)
        assert not late.is_alive()
        completer.commit()
        assert done == []
    finally:
        holder.close()
        completer.close()
    assert sql(
        "SELECT status, lease_version, attempts FROM queue_job_state WHERE job_id = %s", [job2.id]
    ) == [("pending", 2, 1)]
    assert sql("SELECT status FROM queue_attempts WHERE job_id = %s ORDER BY id", [job2.id]) == [
        ("lost",)
    ]
    report(
        size="2 jobs, each order",
        lost=0,
        completed_twice=0,
        re_executions=0,
        sweep_blocked_s=round(sweep_s, 3),
        notes=(
            "a completion holding the row lock is skipped by the sweep and stays completed;"
            " a completion that waited behind a committed sweep changes 0 rows"
        ),
    )


def test_concurrent_sweeps_requeue_each_expired_job_once(report):
    """4. Concurrent sweeps"""
    jobs = size(2_000, 20_000)
    sweepers = 8
    enqueue_many([("qa.noop", {}) for _ in range(jobs)], queue="sw")
    claimed = claim_all("sw", lease=0.5)
    assert len(claimed) == jobs
    wait_expired(jobs)

    barrier = threading.Barrier(sweepers)
    returned: list[list[Any]] = [[] for _ in range(sweepers)]
    errors: list[BaseException] = []

    def sweep(index: int) -> None:
        own = store(f"sweeper {index}")
        try:
            barrier.wait()
            # Small batches, so that the sweepers really interleave over the same rows.
            while batch := own.sweep(limit=50):
                returned[index].extend(batch)
        except BaseException as exc:  # a deadlock would surface here
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=sweep, args=(i,)) for i in range(sweepers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    elapsed = time.monotonic() - started
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []

    all_rows = [row for rows in returned for row in rows]
    assert len(all_rows) == jobs
    assert len({row[0] for row in all_rows}) == jobs
    assert sum(1 for rows in returned if rows) >= 2, "the sweeps did not run concurrently"
    counts = sql(
        """
        SELECT count(*) FILTER (WHERE st.status = 'pending' AND st.lease_version = 2
                                AND st.locked_by IS NULL),
               (SELECT count(*) FROM queue_attempts WHERE status = 'lost'),
               (SELECT count(*) FROM queue_attempts),
               (SELECT count(*) FROM (SELECT job_id FROM queue_attempts
                                      GROUP BY job_id HAVING count(*) <> 1) AS x)
        FROM queue_job_state AS st
        """
    )[0]
    assert counts == (jobs, jobs, jobs, 0)
    report(
        size=f"{jobs:,} expired jobs, {sweepers} sweepers",
        lost=0,
        completed_twice=0,
        re_executions=0,
        sweep_s=round(elapsed, 2),
        sweeps_per_sweeper=[len(rows) for rows in returned],
        notes="every expired job requeued exactly once (lease_version +1, one lost attempt), "
        "no deadlock",
    )


def test_claims_racing_sweeps_never_give_a_job_two_live_leases(report):
    """4. Claims racing the sweep"""
    jobs = size(300, 2_000)
    seconds = size(8, 30)
    # Enough attempts that no job dies of being swept over and over.
    enqueue_many([("qa.noop", {}) for _ in range(jobs)], queue="cs", max_attempts=1000)
    stop = threading.Event()
    errors: list[BaseException] = []
    completed: dict[int, int] = {}  # job_id -> lease_version that completed it
    stats = {"claimed": 0, "swept": 0, "completed": 0, "fenced": 0}
    lock = threading.Lock()

    def claimer(index: int) -> None:
        own = store(f"claimer {index}")
        rng = random.Random(index)
        worker_id = f"qa-claimer-{index}"
        try:
            while not stop.is_set():
                rows = own.claim("cs", rng.choice((1, 5, 20)), worker_id, 0.2)
                with lock:
                    stats["claimed"] += len(rows)
                if not rows:
                    time.sleep(0.01)
                    continue
                # Act like workers that sometimes die (never finish: the sweep takes
                # the job back) and sometimes finish late (after the lease ran out).
                time.sleep(rng.uniform(0, 0.35))
                finish = [row for row in rows if rng.random() < 0.2]
                if finish:
                    done = own.complete(
                        [(row.job_id, row.lease_version, row.attempt_id, None) for row in finish]
                    )
                    with lock:
                        for row in finish:
                            if row.job_id in done:
                                assert row.job_id not in completed
                                completed[row.job_id] = row.lease_version
                                stats["completed"] += 1
                            else:
                                stats["fenced"] += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    def sweeper(index: int) -> None:
        own = store(f"race sweeper {index}")
        try:
            while not stop.is_set():
                swept = own.sweep(limit=100)
                with lock:
                    stats["swept"] += len(swept)
                time.sleep(0.02)
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=sweeper, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert stats["swept"] > 0, stats
    assert stats["completed"] > 0, stats
    assert stats["fenced"] > 0, stats

    # No two attempts of a job overlap: each attempt ended (lost or succeeded) before
    # the next one was claimed, and at most one is still running.
    overlaps = overlapping_runs("queue_attempts")
    assert overlaps == 0
    assert (
        sql(
            "SELECT count(*) FROM (SELECT job_id FROM queue_attempts WHERE status = 'running' "
            "GROUP BY job_id HAVING count(*) > 1) AS x"
        )[0][0]
        == 0
    )
    # lease_version strictly grows along a job's attempts, and the job's current
    # version is the one its latest attempt got (or one more, after a sweep).
    assert (
        sql(
            """
            SELECT count(*) FROM (
              SELECT lease_version <= lag(lease_version) OVER (PARTITION BY job_id ORDER BY id)
                     AS backwards
              FROM queue_attempts) AS x
            WHERE backwards
            """
        )[0][0]
        == 0
    )
    # A completion that won is never undone: those jobs are completed, at the version
    # that completed them, with that attempt the last one and succeeded.
    rows = sql(
        """
        SELECT st.job_id, st.status, st.lease_version,
               (SELECT count(*) FROM queue_attempts a WHERE a.job_id = st.job_id
                  AND a.lease_version > st.lease_version),
               (SELECT count(*) FROM queue_attempts a WHERE a.job_id = st.job_id
                  AND a.status = 'succeeded')
        FROM queue_job_state st WHERE st.status = 'completed'
        """
    )
    assert {job_id: version for job_id, _, version, _, _ in rows} == completed
    assert all(later == 0 and ok == 1 for _, _, _, later, ok in rows)
    lost = sql(
        "SELECT count(*) FROM queue_job_state WHERE status NOT IN ('pending', 'running', "
        "'completed')"
    )[0][0]
    assert lost == 0
    report(
        size=f"{jobs:,} jobs, 4 claimers + 3 sweepers, {seconds} s",
        lost=0,
        completed_twice=0,
        notes="no two attempts of a job overlap; fenced late completions change nothing",
        **stats,
    )
