"""Queue control under real worker processes: limits, keys, rates and pause (issue 14).

Every scenario runs real `run_queue_worker` processes; a sampler thread reads the
running count from the database every 10 ms. Reduced sizes by default, the issue's
sizes under PGQUEUE_RELIABILITY=full.
"""

from __future__ import annotations

import signal
import threading
import time

import psycopg
import pytest
from django.db import transaction

from django_pgqueue import enqueue, enqueue_many, pause_queue, set_queue_limit, set_queue_rate
from tests.conftest import database_url, sql
from tests.reliability.conftest import FULL, size, wait_ready, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 2.0
SWEEP = 1.0
POLL = 0.5
OPTIONS = (
    "--concurrency", "10",
    "--batch-size", "10",
    "--lease", str(LEASE),
    "--heartbeat-interval", "0.6",
    "--sweep-interval", str(SWEEP),
    "--poll-interval", str(POLL),
    "-v", "0",
)  # fmt: skip
SESSIONS = ("worker", "heartbeat", "listener")
JOB_S = 0.05  # each job sleeps this long
LIMIT = 3
IDEAL_RATE = LIMIT / JOB_S  # jobs per second at the limit, with no gap between jobs


class Sampler:
    """Sample a queue's running count every 10 ms on its own connection."""

    def __init__(self, queue: str, every: float = 0.01) -> None:
        self.queue, self.every = queue, every
        self.samples: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            while not self.stop.is_set():
                (n,) = conn.execute(
                    "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'running'",
                    [self.queue],
                ).fetchone()
                self.samples.append(n)
                time.sleep(self.every)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def stop_all(workers: list) -> None:
    # A worker still starting has no SIGTERM handler yet: wait until each is connected
    # (its handlers are installed before it connects).
    names = [f"pgqueue worker {w.args[w.args.index('--worker-id') + 1]}" for w in workers]
    wait_until(
        "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
        "WHERE application_name = ANY (%s)",
        lambda n: n == len([w for w in workers if w.proc.poll() is None]),
        params=[names],
    )
    for worker in workers:
        if worker.proc.poll() is None:
            worker.signal(signal.SIGTERM)
    for worker in workers:
        if worker.proc.returncode is None:
            code, output = worker.wait(60)
            assert code == 0, output


def all_ready(workers: list) -> None:
    """Until every worker is up and listening. The scenarios that measure a drain enqueue
    after this, so the drain starts with every worker in it, not with the first one
    while Django still starts in the others (on a 2-core CI box, for seconds)."""
    for worker in workers:
        wait_ready(worker.args[worker.args.index("--worker-id") + 1])


def drained(queue: str, jobs: int, timeout: float) -> None:
    wait_until(
        "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'completed'",
        lambda n: n == jobs,
        timeout=timeout,
        params=[queue],
    )


def exactly_once(queue: str) -> None:
    """Every job of `queue` completed, with exactly one succeeded attempt."""
    bad = sql(
        """
        SELECT count(*) FROM queue_job_state s
        WHERE s.queue = %s AND (s.status <> 'completed' OR (
            SELECT count(*) FROM queue_attempts a
            WHERE a.job_id = s.job_id AND a.status = 'succeeded') <> 1)
        """,
        [queue],
    )[0][0]
    assert bad == 0


def drain_rate(queue: str) -> float:
    """Jobs per second from the first start to the last finish."""
    jobs, seconds = sql(
        """
        SELECT count(*), extract(epoch FROM max(a.finished_at) - min(a.started_at))
        FROM queue_attempts a JOIN queue_job_state s ON s.job_id = a.job_id
        WHERE s.queue = %s AND a.status = 'succeeded'
        """,
        [queue],
    )[0]
    return jobs / float(seconds)


def slot_gaps(queue: str) -> dict[str, float]:
    """Where a slot's time goes, in ms per job: `held_extra_ms`, how much longer than the
    handler's JOB_S an attempt held its slot (claim to completion); `idle_ms`, how long
    a slot stood free per job (LIMIT x the drain's length, minus every attempt's hold);
    `gap_p50_ms` / `gap_p90_ms`, from an attempt's end to the next start."""
    jobs, seconds, held, p50, p90 = sql(
        """
        WITH a AS (
            SELECT a.started_at, a.finished_at FROM queue_attempts a
            JOIN queue_job_state s ON s.job_id = a.job_id
            WHERE s.queue = %s AND a.status = 'succeeded'
        ), gaps AS (
            SELECT extract(epoch FROM (
                SELECT min(b.started_at) FROM a AS b WHERE b.started_at >= a.finished_at
            ) - a.finished_at) AS gap
            FROM a
        )
        SELECT (SELECT count(*) FROM a),
               (SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM a),
               (SELECT sum(extract(epoch FROM finished_at - started_at)) FROM a),
               (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY gap) FROM gaps),
               (SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY gap) FROM gaps)
        """,
        [queue],
    )[0]
    return {
        "held_extra_ms": round((float(held) / jobs - JOB_S) * 1000, 2),
        "idle_ms": round((LIMIT * float(seconds) - float(held)) / jobs * 1000, 2),
        "gap_p50_ms": round(float(p50 or 0) * 1000, 2),
        "gap_p90_ms": round(float(p90 or 0) * 1000, 2),
    }


def kill_and_wait(victim, worker_id: str) -> tuple:
    """SIGKILL a worker, wait until its sessions are gone; (db time, jobs it held)."""
    victim.kill()
    wait_until(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY (%s)",
        lambda n: n == 0,
        timeout=30,
        params=[[f"pgqueue {role} {worker_id}" for role in SESSIONS]],
    )
    return sql(
        "SELECT clock_timestamp(), coalesce(array_agg(job_id), '{}') FROM queue_job_state "
        "WHERE locked_by = %s AND status = 'running'",
        [worker_id],
    )[0]


def test_global_limit_with_four_workers(worker_process, report):
    """13a. Queue control: Global limit 3, 4 workers x 10"""
    jobs = size(300, 2_000)
    set_queue_limit("limited", LIMIT)
    with Sampler("limited") as sampler:
        workers = [
            worker_process("limited", "--worker-id", f"limit-{i}", *OPTIONS) for i in range(4)
        ]
        all_ready(workers)
        enqueue_many([("qa.nap", {"seconds": JOB_S}) for _ in range(jobs)], queue="limited")
        drained("limited", jobs, timeout=size(120, 300))
    stop_all(workers)
    exactly_once("limited")
    rate = drain_rate("limited")
    # How long a slot is held per job: the handler's 50 ms plus the worker's own
    # latency (dispatch, the outcome's write). The drain can reach at most 3 / that.
    (held_s,) = sql(
        "SELECT avg(extract(epoch FROM finished_at - started_at))::float8 FROM queue_attempts"
    )[0]
    report(
        size=jobs,
        lost=0,
        completed_twice=0,
        samples=len(sampler.samples),
        max_running=max(sampler.samples),
        drain_per_s=round(rate, 1),
        of_ideal=round(rate / IDEAL_RATE, 3),
        slot_held_ms=round(held_s * 1000, 1),
        of_slot_bound=round(rate / (LIMIT / held_s), 3),
        **slot_gaps("limited"),
    )
    assert len(sampler.samples) > 100
    assert max(sampler.samples) == LIMIT  # reached, and never above at any sample
    # The bar (90% of 3 / 50 ms) at full size on a quiet machine; the reduced
    # run in `make test` shares a loaded CI box, so it checks that the limit does not
    # halve throughput, and that slots are reused without a gap (the slot-bound ratio).
    assert rate >= (0.9 if FULL else 0.5) * IDEAL_RATE, rate
    assert rate >= 0.8 * LIMIT / held_s, (rate, held_s)


def test_global_limit_with_a_worker_sigkilled_every_period(worker_process, report):
    """13b. Queue control: Global limit 3, a worker SIGKILLed every 10 s"""
    jobs = size(400, 2_000)
    period = size(3, 10)
    set_queue_limit("killed", LIMIT)
    enqueue_many([("qa.nap", {"seconds": JOB_S}) for _ in range(jobs)], queue="killed")
    generation = 0

    def start(slot: int):
        nonlocal generation
        generation += 1
        worker_id = f"kill-{slot}-{generation}"
        return worker_id, worker_process("killed", "--worker-id", worker_id, *OPTIONS)

    kills = []
    with Sampler("killed") as sampler:
        slots = [start(slot) for slot in range(4)]
        next_kill = time.monotonic() + period
        deadline = time.monotonic() + size(180, 600)
        while sql(
            "SELECT count(*) FROM queue_job_state WHERE queue = 'killed' AND status <> 'completed'"
        )[0][0]:
            assert time.monotonic() < deadline, "not drained in time"
            if time.monotonic() < next_kill:
                time.sleep(0.05)
                continue
            # Kill the worker that holds the most slots: the hard case.
            holders = dict(
                sql(
                    "SELECT locked_by, count(*) FROM queue_job_state WHERE queue = 'killed' "
                    "AND status = 'running' GROUP BY locked_by"
                )
            )
            slot = max(range(4), key=lambda s: holders.get(slots[s][0], 0))
            worker_id, victim = slots[slot]
            killed_at, held = kill_and_wait(victim, worker_id)
            kills.append((killed_at, held))
            slots[slot] = start(slot)
            next_kill = time.monotonic() + period
    stop_all([worker for _, worker in slots])
    exactly_once("killed")
    assert len(kills) >= 2
    assert any(held for _, held in kills), "no kill landed on a worker holding a slot"
    # Each killed worker's slots came back with the sweep: its held jobs' attempts were
    # closed as lost within one lease plus one sweep interval (plus scheduling slack).
    back = [
        sql(
            "SELECT extract(epoch FROM max(finished_at) - %s) FROM queue_attempts "
            "WHERE job_id = ANY(%s) AND status = 'lost'",
            [killed_at, list(held)],
        )[0][0]
        for killed_at, held in kills
        if held
    ]
    report(
        size=jobs,
        lost=0,
        completed_twice=0,
        kills=len(kills),
        max_running=max(sampler.samples),
        recovery_s=round(max(float(b) for b in back), 2),
    )
    assert max(sampler.samples) <= LIMIT
    # Recovery within a lease and a sweep (1 s for the worker's next cycle): a
    # wall-clock promise, asserted at full size (make reliability), reported in CI,
    # where every held job is back (its lost attempt closed) whatever the load.
    assert all(b is not None for b in back)
    if FULL:
        assert max(float(b) for b in back) <= LEASE + SWEEP + 1.0


def test_key_limit_one_with_fifty_keys(worker_process, report):
    """13c. Queue control: Key limit 1, 50 keys"""
    jobs = size(400, 2_000)

    def keyed(n: int) -> None:
        enqueue("qa.nap", {"seconds": 0.02}, queue="keyed", concurrency_key=f"customer:{n % 50}")

    # Enqueued once every worker claims the queue without controls: the first keyed job
    # makes it keyed, which a running worker learns only at its next view of the
    # controls; its plain claim must leave keyed jobs alone meanwhile.
    workers = [worker_process("keyed", "--worker-id", f"key-{i}", *OPTIONS) for i in range(4)]
    all_ready(workers)
    with transaction.atomic():
        for n in range(jobs):
            keyed(n)
    drained("keyed", jobs, timeout=size(120, 300))
    stop_all(workers)
    exactly_once("keyed")
    overlaps = sql(
        """
        SELECT count(*)
        FROM queue_attempts a JOIN queue_job_state s ON s.job_id = a.job_id
        JOIN queue_attempts b ON b.id > a.id
        JOIN queue_job_state t ON t.job_id = b.job_id AND t.concurrency_key = s.concurrency_key
        WHERE s.queue = 'keyed' AND t.queue = 'keyed'
          AND a.started_at < b.finished_at AND b.started_at < a.finished_at
        """
    )[0][0]
    most = sql(
        """
        SELECT max(n) FROM (
            SELECT (SELECT count(DISTINCT s2.concurrency_key) FROM queue_attempts b
                    JOIN queue_job_state s2 ON s2.job_id = b.job_id
                    WHERE b.started_at <= a.started_at AND a.started_at < b.finished_at) AS n
            FROM queue_attempts a
        ) AS x
        """
    )[0][0]
    report(
        size=jobs, lost=0, completed_twice=0, overlapping_same_key=overlaps, most_keys_at_once=most
    )
    assert overlaps == 0
    assert most > 10  # the keys really ran side by side


def test_rate_limit_over_a_window(worker_process, report):
    """13d. Queue control: Rate 100/s"""
    seconds = size(6, 30)
    jobs = 100 * seconds + 200
    set_queue_rate("rated", "100/s")
    workers = [worker_process("rated", "--worker-id", f"rate-{i}", *OPTIONS) for i in range(4)]
    all_ready(workers)
    enqueue_many([("qa.noop", {}) for _ in range(jobs)], queue="rated")
    wait_until(
        "SELECT count(*) FROM queue_attempts",
        lambda n: n >= 100 * (seconds + 1),
        timeout=seconds * 3 + 30,
    )
    stop_all(workers)
    # Never above 100 in any window of 1 s starting at any start.
    busiest = sql(
        """
        SELECT max((SELECT count(*) FROM queue_attempts b
                    WHERE b.started_at >= a.started_at
                      AND b.started_at < a.started_at + interval '1 second'))
        FROM queue_attempts a
        """
    )[0][0]
    # Starts in each whole second after the first start (the last, partial one left out).
    per_second = [
        row[0]
        for row in sql(
            """
            WITH first AS (SELECT min(started_at) AS t FROM queue_attempts),
            buckets AS (
                SELECT floor(extract(epoch FROM a.started_at - first.t))::int AS s
                FROM queue_attempts a, first
            )
            SELECT count(*) FROM buckets GROUP BY s ORDER BY s
            """
        )
    ][:seconds]
    report(size=jobs, seconds=seconds, busiest_1s_window=busiest, per_second=per_second)
    assert busiest <= 100
    assert all(95 <= n <= 105 for n in per_second), per_second


def test_pause_stops_claims_within_a_poll_interval(worker_process, report):
    """13e. Queue control: Pause"""
    jobs = size(2_000, 10_000)
    enqueue_many([("qa.nap", {"seconds": 0.02}) for _ in range(jobs)], queue="paused")
    workers = [worker_process("paused", "--worker-id", f"pause-{i}", *OPTIONS) for i in range(4)]
    wait_until("SELECT count(*) FROM queue_attempts", lambda n: n >= 200, timeout=60)
    pause_queue("paused")
    paused_at = sql("SELECT clock_timestamp()")[0][0]
    time.sleep(POLL + 1.5)
    late = sql(
        "SELECT count(*), extract(epoch FROM max(started_at) - %s) FROM queue_attempts "
        "WHERE started_at > %s",
        [paused_at, paused_at],
    )[0]
    after_poll = sql(
        "SELECT count(*) FROM queue_attempts WHERE started_at > %s + make_interval(secs => %s)",
        [paused_at, POLL],
    )[0][0]
    enqueue("qa.nap", {"seconds": 0.0}, queue="paused")  # enqueue still works
    still = sql("SELECT count(*) FROM queue_job_state WHERE status = 'pending'")[0][0]
    running = sql("SELECT count(*) FROM queue_job_state WHERE status = 'running'")[0][0]
    stop_all(workers)
    report(
        size=jobs,
        started_after_pause=late[0],
        last_start_after_pause_s=None if late[1] is None else round(float(late[1]), 3),
        started_after_pause_plus_poll=after_poll,
    )
    assert after_poll == 0
    assert running == 0  # running jobs finished
    assert still > 0
