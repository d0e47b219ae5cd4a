"""Scenario 5: a random worker process SIGKILLed and replaced every ~2 s until the queue
drains; with handler threads, and with async handlers on the workers' event loops."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest

from django_pgqueue import enqueue_many
from tests.conftest import sql
from tests.reliability.conftest import FULL, kill_not_due, outcome, size, stop_and_count, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = 4
# Kills that land while jobs remain: the queue is topped up until they have.
MIN_KILLS = 2
SESSIONS = ("worker", "heartbeat", "listener")  # a worker's connections, by application_name
LEASE = 2.0
OPTIONS = (
    "--lease", str(LEASE),
    "--heartbeat-interval", "0.6",
    "--sweep-interval", "1",
    "--concurrency", "4",
    "--batch-size", "5",
    "--poll-interval", "0.5",
    "-v", "0",
)  # fmt: skip


def test_random_sigkills_until_drained(worker_process, report):
    """5. Chaos"""
    jobs = size(4_000, 20_000)
    seconds = 0.01  # a few ms per job, so that kills land mid-job
    chaos(worker_process, report, jobs, "qa.ledger", {"seconds": seconds}, OPTIONS, "4 threads")


def test_random_sigkills_with_async_handlers_until_drained(worker_process, report):
    """5b. Chaos, async handlers"""
    jobs = size(3_000, 20_000)
    # 50 in flight per process on its event loop, each awaiting 50 ms: kills land on
    # many jobs at once.
    options = (*OPTIONS, "--async-concurrency", "50", "--batch-size", "25")
    chaos(worker_process, report, jobs, "qa.asleep", {"seconds": 0.05}, options, "50 on the loop")


def chaos(
    worker_process: Any,
    report: Any,
    jobs: int,
    job_type: str,
    payload: dict[str, Any],
    options: tuple[str, ...],
    each: str,
) -> None:
    def load(count: int) -> None:
        for start in range(0, count, 10_000):
            part = min(10_000, count - start)
            enqueue_many([(job_type, payload) for _ in range(part)], queue="chaos")

    load(jobs)

    rng = random.Random()
    generation = 0

    def start(slot: int):
        nonlocal generation
        generation += 1
        worker_id = f"chaos-{slot}-{generation}"
        return worker_id, worker_process("chaos", "--worker-id", worker_id, *options)

    slots = [start(slot) for slot in range(WORKERS)]
    started = time.monotonic()
    kills: list[tuple[str, object, set[int]]] = []  # (worker id, db time, jobs held)
    deadline = started + size(600, 1800)  # a hang guard: a loaded machine restarts workers slowly
    next_kill = started + rng.uniform(1.5, 2.5)
    while True:
        remaining = sql("SELECT count(*) FROM queue_job_state WHERE status <> 'completed'")[0][0]
        if len(kills) < MIN_KILLS and remaining < jobs // 4:
            # Workers faster than the kills: more jobs, so that kills land on work.
            load(jobs // 2)
            jobs += jobs // 2
            continue
        if remaining == 0:
            break
        if kill_not_due(remaining, deadline, next_kill):
            continue
        slot = rng.randrange(WORKERS)
        worker_id, victim = slots[slot]
        victim.kill()  # SIGKILL, and wait for the process to be gone
        # A statement the process sent just before it died still runs to its end on
        # the server (a claim, a completion): wait until its sessions are gone too.
        wait_until(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY (%s)",
            lambda n: n == 0,
            timeout=30,
            params=[[f"pgqueue {role} {worker_id}" for role in SESSIONS]],
        )
        # The dead process can change nothing any more, and its leases run for
        # another ~LEASE seconds: what it holds now is exactly what it held at the kill.
        killed_at, held = sql(
            """
            SELECT clock_timestamp(),
                   coalesce(array_agg(job_id), '{}') FROM queue_job_state
            WHERE locked_by = %s AND status = 'running'
            """,
            [worker_id],
        )[0]
        kills.append((worker_id, killed_at, set(held)))
        slots[slot] = start(slot)
        next_kill = time.monotonic() + rng.uniform(1.5, 2.5)
    drain_s = time.monotonic() - started
    # A replacement still starting up has no SIGTERM handler yet: wait until each one
    # is connected (its handlers are installed before it connects).
    wait_until(
        "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
        "WHERE application_name = ANY (%s)",
        lambda n: n == WORKERS,
        params=[[f"pgqueue worker {worker_id}" for worker_id, _ in slots]],
    )
    counts = stop_and_count([worker for _, worker in slots], jobs)
    assert len(kills) >= MIN_KILLS
    in_flight = [len(held) for _, _, held in kills]
    assert sum(in_flight) > 0, "no kill landed on a worker holding jobs"

    # Re-executions: never more than the jobs the killed workers held.
    holders = Counter(job for _, _, held in kills for job in held)
    runs = dict(sql("SELECT job_id, count(*) FROM qa_ledger GROUP BY job_id"))
    assert len(runs) == jobs
    assert counts["re_executions"] <= sum(in_flight)
    over = {job: n - 1 for job, n in runs.items() if n - 1 > holders[job]}
    assert over == {}, f"jobs re-run more often than kills held them: {over}"
    # Each kill cost its held jobs exactly one lost attempt apiece; nothing else was lost.
    lost = dict(
        sql("SELECT job_id, count(*) FROM queue_attempts WHERE status = 'lost' GROUP BY job_id")
    )
    assert lost == dict(holders)
    assert sql("SELECT count(*) FROM queue_attempts WHERE status NOT IN ('lost', 'succeeded')") == [
        (0,)
    ]
    # Recovery, for each job a kill held: how long until the sweep put it back
    # (its lost attempt closed) and until another worker ran it again.
    requeued_s, rerun_s = sql(
        """
        WITH k AS (
            SELECT * FROM unnest(%s::text[], %s::timestamptz[], %s::text[])
                AS k(worker_id, killed_at, held)
        ), per_job AS (
            SELECT (SELECT extract(epoch FROM a.finished_at - k.killed_at)
                    FROM queue_attempts a
                    WHERE a.job_id = h.job_id AND a.worker_id = k.worker_id
                      AND a.status = 'lost') AS requeued,
                   (SELECT extract(epoch FROM min(a.started_at) - k.killed_at)
                    FROM queue_attempts a
                    WHERE a.job_id = h.job_id AND a.started_at > k.killed_at) AS rerun
            FROM k CROSS JOIN LATERAL unnest(k.held::bigint[]) AS h(job_id)
        )
        SELECT coalesce(max(requeued), 0), coalesce(max(rerun), 0) FROM per_job
        """,
        [
            [worker_id for worker_id, _, _ in kills],
            [killed_at for _, killed_at, _ in kills],
            ["{" + ",".join(map(str, held)) + "}" for _, _, held in kills],
        ],
    )[0]
    # The sweep puts a job back within a lease plus a sweep interval (and the time
    # the surviving workers need to come round to sweeping, on a loaded machine) ...
    # ... and, keeping its place in line, it runs again right after (not behind the
    # backlog). Wall-clock promises: asserted at full size (make reliability); CI
    # reports them, its property being that every held job was put back and rerun.
    if FULL:
        assert float(requeued_s) < LEASE + 1 + 5
        assert float(rerun_s) < LEASE + 1 + 5
    report(
        size=f"{jobs:,} jobs, {WORKERS} processes x {each}",
        **outcome(counts),
        recovery_s=round(float(rerun_s), 2),
        requeued_s=round(float(requeued_s), 2),
        kills=len(kills),
        in_flight_at_kills=sum(in_flight),
        max_in_flight_at_kill=max(in_flight),
        drain_s=round(drain_s, 1),
        notes=f"a random worker SIGKILLed every ~2 s (lease {LEASE:g} s, sweep 1 s); "
        "every re-execution is a job the killed worker held; recovery: kill to the job "
        "running again",
    )
