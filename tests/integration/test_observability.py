"""The worker registry and the per-minute rollup, written by real worker threads."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection, transaction

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.observability import rollup, workers
from django_pgqueue.sql import QUERIES
from django_pgqueue.store.session import Session
from django_pgqueue.store.worker import Store
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


def wait_until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_a_worker_registers_shows_its_jobs_and_is_gone_after_stopping(run_worker: Any) -> None:
    job = enqueue("qa.nap", {"seconds": 30}, queue="reg")  # touches no database
    thread = run_worker(["reg", "other"], concurrency=3, lease=3, heartbeat_interval=0.2)
    me = thread.worker.worker_id
    wait_until(lambda: any(w.jobs for w in workers.list_workers("default")))
    (info,) = workers.list_workers("default")
    assert info.id == me
    assert info.alive
    assert info.gone_at is None
    assert info.queues == ["reg", "other"]
    assert info.concurrency == 3
    assert info.lease_seconds == 3
    assert [j.job_id for j in info.jobs] == [job.id]
    assert info.jobs[0].type == "qa.nap"
    assert info.jobs[0].attempt == 1
    assert info.jobs[0].started_at is not None
    wait_until(lambda: workers.list_workers("default")[0].running == 1)
    seen = info.last_seen_at
    wait_until(lambda: workers.list_workers("default")[0].last_seen_at > seen)  # heartbeats
    thread.worker.stop(force=True)
    thread.join()
    (info,) = workers.list_workers("default")
    assert not info.alive
    assert info.gone_at is not None
    assert info.running == 0
    assert workers.count_workers("default") == (0, 1)


def test_silent_workers_are_marked_gone_after_two_leases_and_pruned_later() -> None:
    store = Store("default", "test registry")
    try:
        for name, lease in (("quiet", 1.0), ("recent", 60.0)):
            me = workers.Identity(name, "host", 1, ("q",), 2, lease, "0")
            workers.record_beat(store, me, 0)
        sql("UPDATE queue_workers SET last_seen_at = now() - interval '3 seconds'")
        assert workers.count_workers("default") == (1, 1)  # the page sees it gone already
        assert workers.mark_gone(store) == ["quiet"]
        assert workers.mark_gone(store) == []
        assert workers.prune(store) == (0, 0)  # gone only just now: kept
        sql("UPDATE queue_workers SET gone_at = now() - interval '2 days' WHERE id = 'quiet'")
        assert workers.prune(store) == (1, 0)
        # A worker marked gone that reports again is alive again.
        sql("UPDATE queue_workers SET gone_at = now() WHERE id = 'recent'")
        workers.record_beat(store, workers.Identity("recent", "h", 1, ("q",), 2, 60.0, "0"), 4)
        (info,) = workers.list_workers("default")
        assert (info.id, info.alive, info.running) == ("recent", True, 4)
    finally:
        store.close()


def test_the_rollup_counts_what_workers_finished_and_how_long_it_waited(
    run_worker: Any, settings: Any
) -> None:
    settings.PGQUEUE = {"RETRY_BACKOFF_BASE": 0.01, "RETRY_BACKOFF_CAP": 0.02}
    enqueue_many([("qa.noop", n) for n in range(40)], queue="roll")
    enqueue("qa.permanent", queue="roll")
    enqueue("qa.flaky", {"failures": 1}, queue="roll")
    # Two jobs that waited already: due 45 s before the worker claims them.
    late = enqueue_many([("qa.noop", "late"), ("qa.noop", "late")], queue="late")
    sql(
        "UPDATE queue_job_state SET run_at = now() - interval '45 seconds' WHERE job_id = ANY(%s)",
        [[job.id for job in late]],
    )
    run_worker(["roll", "late"], burst=True, heartbeat_interval=0.1).join()
    rows = sql(
        "SELECT queue, sum(completed), sum(retried), sum(dead), "
        "array_agg(wait_buckets) FROM queue_stats_minutely GROUP BY queue ORDER BY queue"
    )
    assert [row[:4] for row in rows] == [("late", 2, 0, 0), ("roll", 41, 1, 1)]
    # The same figures as the attempts table.
    assert sql(
        "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE "
        "status = 'failed') FROM queue_attempts"
    ) == [(43, 2)]
    window = rollup.read_window("default", 60)
    by_queue = {series.queue: series for series in window.queues}
    assert sum(by_queue["roll"].completed) == 41
    assert sum(by_queue["roll"].failed) == 2
    late_p50 = [v for v in by_queue["late"].wait_p50 if v is not None]
    assert late_p50
    assert 30 <= late_p50[-1] <= 60  # the bucket [30 s, 60 s)
    roll_p95 = [v for v in by_queue["roll"].wait_p95 if v is not None]
    assert roll_p95
    assert roll_p95[-1] < 30


def test_quantile_reads_the_buckets() -> None:
    empty = [0] * (len(rollup.WAIT_BOUNDS) + 1)
    assert rollup.quantile(empty, 0.5) is None
    one_second = list(empty)
    one_second[rollup.WAIT_BOUNDS.index(1) + 1] = 10  # [1 s, 2.5 s)
    assert 1 <= rollup.quantile(one_second, 0.5) <= 2.5
    forever = list(empty)
    forever[-1] = 3
    assert rollup.quantile(forever, 0.95) == rollup.WAIT_BOUNDS[-1]


def test_the_rollup_read_is_an_index_range_walk() -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table would be seq-scanned
        cursor.execute("EXPLAIN " + QUERIES["stats_minute_range"], {"minutes": 60})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "queue_stats_minutely_key" in plan  # a range of the index, whatever the table size


def test_a_window_in_points_of_five_minutes_sums_them() -> None:
    sql(
        "INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead, "
        "wait_seconds_sum, wait_buckets) "
        "SELECT date_trunc('minute', now()) - make_interval(mins => m), 'w', 10, 1, 0, 0, "
        "'{0,0,0,0,0,2,0,0,0,0,0,0,0,0}' FROM generate_series(0, 59) AS m"
    )
    window = rollup.read_window("default", 60, 5)
    (series,) = window.queues
    assert window.step == 5
    assert series.completed == [50] * 12  # five minutes of 10 in each point
    assert series.failed == [5] * 12
    assert all(1 <= p <= 2.5 for p in series.wait_p50)  # bucket [1 s, 2.5 s)
    with pytest.raises(ValueError, match="multiple of step"):
        rollup.read_window("default", 60, 7)


def test_the_rollup_keeps_how_long_attempts_ran(run_worker: Any) -> None:
    # Three jobs of 0.3 s: each attempt counted in the bucket [250 ms, 500 ms).
    enqueue_many([("qa.sleep", {"seconds": 0.3}) for _ in range(3)], queue="slow")
    run_worker(["slow"], burst=True, heartbeat_interval=0.1).join()
    ((runs, run_sum),) = sql(
        "SELECT array_agg(run_buckets), sum(run_seconds_sum) FROM queue_stats_minutely "
        "WHERE queue = 'slow'"
    )
    merged = [sum(column) for column in zip(*runs, strict=True)]
    assert sum(merged) == 3, runs
    # Each in [250 ms, 500 ms), or a later bucket when a loaded machine stretched the run.
    assert sum(merged[rollup.WAIT_BOUNDS.index(0.25) + 1 :]) == 3, merged
    assert run_sum >= 0.9, run_sum
    (series,) = rollup.read_window("default", 15).queues
    p50 = [v for v in series.run_p50 if v is not None]
    assert p50
    assert p50[-1] >= 0.25, p50


def test_the_backlog_is_sampled_per_queue_into_the_current_minute() -> None:
    enqueue_many([("qa.noop", n) for n in range(7)], queue="deep")
    enqueue("qa.noop", queue="deep", delay=3600)  # not due: not in the backlog
    session = Session("default", "pgqueue backlog test", prepared=False)
    try:
        rollup.sample_backlog(session, ["deep", "idle"])
        sql("DELETE FROM queue_job_state WHERE queue = 'deep' AND run_at <= now() "
            "AND job_id IN (SELECT job_id FROM queue_job_state WHERE queue = 'deep' "
            "ORDER BY job_id LIMIT 2)")  # fmt: skip
        rollup.sample_backlog(session, ["deep", "idle"])  # the minute keeps the last one
    finally:
        session.close()
    # The idle queue (nothing due, nothing finished) gets no row.
    assert sql("SELECT queue, backlog FROM queue_stats_minutely") == [("deep", 5)]
    (series,) = rollup.read_window("default", 15).queues
    # One point has the sample (the minute may have turned since): the others none.
    assert [value for value in series.backlog if value is not None] == [5]
    assert series.run_p50 == [None] * 15
