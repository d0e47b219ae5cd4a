"""Scenario 1: many jobs, several worker processes, several queues; and the claim's
row count under stale planner statistics."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import transaction

from django_pgqueue import JobSpec, enqueue_many
from django_pgqueue.store.worker import Store, connection_params
from tests.conftest import sql
from tests.reliability.conftest import (
    outcome,
    overlapping_runs,
    size,
    stop_and_count,
    wait_ready,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ("c1", "c2", "c3")
WORKERS = 4
CHUNK = 10_000


def test_every_job_completed_exactly_once(worker_process, report):
    """1. Concurrency"""
    jobs = size(3_000, 100_000)
    specs = [JobSpec("qa.ledger", {"seconds": 0}, queue=QUEUES[i % 3]) for i in range(jobs)]
    options = ["--concurrency", "4", "--batch-size", "10", "--lease", "2"]
    options += ["--heartbeat-interval", "0.6", "--sweep-interval", "1", "--poll-interval", "0.5"]
    workers = [
        worker_process(*QUEUES, "--worker-id", f"conc-{index}", *options, "-v", "0")
        for index in range(WORKERS)
    ]
    # Every worker is up before the jobs appear, all at once at the commit: the drain is
    # shared by four processes from its start, not begun by the first while Django still
    # starts in the others (on a 2-core CI box, the reduced drain could end before the
    # last one claimed anything).
    for index in range(WORKERS):
        wait_ready(f"conc-{index}")
    with transaction.atomic():
        for start in range(0, jobs, CHUNK):
            enqueue_many(specs[start : start + CHUNK])
        assert sql("SELECT count(*) FROM queue_job_state WHERE status = 'pending'")[0][0] == jobs
    started = time.monotonic()
    first_claim = wait_until("SELECT count(*) FROM queue_attempts", lambda n: n > 0, timeout=60)
    assert first_claim > 0
    wait_until(
        "SELECT count(*) FROM queue_job_state WHERE status <> 'completed'",
        lambda n: n == 0,
        timeout=size(120, 1200),
    )
    drain_s = time.monotonic() - started
    counts = stop_and_count(workers, jobs)
    # No crash, no expired lease: every handler ran exactly once.
    assert counts["executions"] == jobs
    assert counts["re_executions"] == 0
    # One attempt per job, succeeded, and no two ledger runs of a job overlapping.
    attempts = sql(
        """
        SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'), count(DISTINCT job_id),
               (SELECT count(*) FROM queue_job_state WHERE lease_version <> 1 OR attempts <> 1)
        FROM queue_attempts
        """
    )[0]
    assert attempts == (jobs, jobs, jobs, 0)
    overlapping = overlapping_runs("qa_ledger")
    assert overlapping == 0
    # The work really was shared: every process and every queue did part of it.
    per_worker = dict(sql("SELECT worker_id, count(*) FROM queue_attempts GROUP BY worker_id"))
    assert sorted(per_worker) == [f"conc-{index}" for index in range(WORKERS)]
    per_queue = dict(sql("SELECT queue, count(*) FROM queue_job_state GROUP BY queue"))
    assert per_queue == {queue: jobs // 3 + (i < jobs % 3) for i, queue in enumerate(QUEUES)}
    report(
        size=f"{jobs:,} jobs, {WORKERS} processes x 4 threads, 3 queues",
        **outcome(counts),
        drain_s=round(drain_s, 1),
        jobs_per_s=round(jobs / drain_s),
        per_worker=[per_worker[f"conc-{index}"] for index in range(WORKERS)],
        notes="one succeeded attempt per job, no two runs of a job overlapping in the ledger",
    )


def _locked_rows(probe: psycopg.Connection, queue: str) -> int:
    """Rows of `queue` another transaction holds a row lock on right now."""
    total, free = probe.execute(
        """
        SELECT (SELECT count(*) FROM queue_job_state WHERE queue = %(q)s),
               (SELECT count(*) FROM (SELECT 1 FROM queue_job_state WHERE queue = %(q)s
                                      FOR UPDATE SKIP LOCKED) AS x)
        """,
        {"q": queue},
    ).fetchone()
    probe.rollback()
    return total - free


def test_claim_never_takes_more_than_asked_on_stale_statistics(report):
    """1. Claim on stale statistics"""
    rows = size(10_000, 10_000)
    # Statistics taken on empty tables, then rows loaded behind the planner's back
    # (autovacuum cannot fix it in time; on the shared test server it is off).
    sql("ANALYZE queue_jobs, queue_job_state, queue_attempts")
    estimate = sql("SELECT reltuples FROM pg_class WHERE relname = 'queue_job_state'")[0][0]
    assert estimate <= 0
    for queue in ("s1", "s10", "s100"):
        enqueue_many([("qa.noop", {}) for _ in range(rows)], queue=queue)

    store = Store("default", "qa stale claim")
    probe = psycopg.connect(**connection_params("default", "qa lock probe"))
    results = {}
    try:
        for limit in (1, 10, 100):
            queue = f"s{limit}"
            rounds = []
            for round_ in range(3):
                # The production claim, held open in a transaction so its row locks
                # can be counted from another connection before they are released.
                with store.raw.transaction():
                    claimed = store.claim(queue, limit, "qa-stale", 30)
                    locked = _locked_rows(probe, queue)
                assert len(claimed) == limit, (limit, round_, len(claimed))
                assert locked == limit, (limit, round_, locked)
                rounds.append((len(claimed), locked))
            running, opened = sql(
                """
                SELECT (SELECT count(*) FROM queue_job_state WHERE queue = %s
                          AND status = 'running'),
                       (SELECT count(*) FROM queue_attempts a JOIN queue_job_state s
                          ON s.job_id = a.job_id WHERE s.queue = %s)
                """,
                [queue, queue],
            )[0]
            assert running == opened == 3 * limit
            results[limit] = {"returned, locked": rounds, "running": running, "attempts": opened}
    finally:
        store.close()
        probe.close()
    # The statistics were still stale at the end (nothing re-analyzed behind our back).
    assert sql("SELECT reltuples FROM pg_class WHERE relname = 'queue_job_state'")[0][0] <= 0
    report(
        size=f"3 x {rows:,} rows unanalyzed, batch 1/10/100",
        lost=0,
        completed_twice=0,
        notes="claims return, lock, move to running and open attempts for exactly the batch "
        "size asked",
        per_batch=results,
    )
