"""Scenario 15, a rolling deploy: four run_queue_worker processes draining long and
short jobs are restarted one after another with SIGTERM, twice over, the first pass
replacing the old release's code schedules with the new one's.

What runs meanwhile (a feeder enqueues it all through the deploy):

- queue `roll`, no limits: long jobs that outlast the shutdown grace (so every SIGTERM
  interrupts some, half of them on their last attempt, max_attempts=1), short jobs,
  and handlers that really fail (permanently, or every attempt of 3), or fail once;
- queue `roll-limited`, at most LIMIT running and one per concurrency key: long and
  short keyed jobs, and short unkeyed ones;
- queue `roll-ticks`: the code schedules of `DEPLOY_SCHEDULES` in the test project's
  settings. The old release has `deploy-steady` (every second), `deploy-retimed`
  (every 2 s) and `deploy-removed` (every 3 s); the new one keeps `deploy-steady`,
  retimes `deploy-retimed` to a cron every 5 s and removes `deploy-removed`.

A sampler thread reads, every 10 ms on its own connection, what executes in
`roll-limited`: the running rows, and the handlers the ledger shows started, not
finished, in a worker process still alive (a handler still running after its worker
was told to stop holds its slot as much as a running row does).

Pass criteria: every worker exits 0; no job dead whose handler did not fail, every
failing job dead or retried as its handler asked, none lost; the limits never
exceeded at any sample; no job executing twice at once; every due tick fired exactly
once (see `check_ticks` for what is due across the switch), and afterwards the new
release's schedules are in force.
"""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from django_pgqueue import JobSpec, enqueue_many, set_key_limit, set_queue_limit
from django_pgqueue.schedules.ticks import Ticks
from tests.conftest import database_url, sql
from tests.reliability.conftest import ledger_counts, size, wait_ready, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ("roll", "roll-limited", "roll-ticks")
WORKERS = 4
LIMIT = 3
KEYS = 4
GRACE = size(0.5, 2)  # seconds a SIGTERMed worker gives its running handlers
LONG_S = size(3, 6)  # the long jobs of `roll`: always past the grace
LIMITED_LONG_S = 1.2  # the long jobs of `roll-limited`: LIMIT slots keep up with the feed
SHORT_S = 0.05
GAP_S = size(0.5, 4)  # from one worker replaced to the next one's SIGTERM
PASSES = 2
OPTIONS = (
    "--concurrency", "4",
    "--batch-size", "4",
    "--lease", "2",
    "--heartbeat-interval", "0.6",
    "--sweep-interval", "1",
    "--poll-interval", "0.5",
    "--shutdown-grace", str(GRACE),
    "-v", "0",
)  # fmt: skip
OLD, NEW = "deploy-old", "deploy-new"
FAILING = ("qa.permanent", "qa.fail")  # handlers that always fail: their jobs end dead


def _timing(release: str, name: str) -> Ticks:
    entry = settings.DEPLOY_SCHEDULES[release][name]
    every = entry.get("every")
    return Ticks(
        cron=entry.get("cron"), every=None if every is None else dt.timedelta(seconds=every)
    )


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has exited: its threads are gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class Sampler:
    """Every 10 ms, on its own connection: what executes in roll-limited (running rows,
    and unfinished ledger runs of live processes), and the two changing schedules."""

    def __init__(self) -> None:
        self.samples = 0
        self.max_running = 0  # most executions of roll-limited at one sample
        self.max_per_key = 0  # most executions of one key at one sample
        self.max_same_job = 0  # most executions of one job at one sample, any queue
        self.released_early = 0  # samples with a handler running whose row was not
        self.held = 0  # samples with a slot held for a stopping worker's handler
        self.in_force_at: dt.datetime | None = None  # first seen: the new release in force
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with psycopg.connect(database_url(), autocommit=True) as conn:
                while not self.stop.is_set():
                    self._sample(conn)
                    time.sleep(0.01)
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc

    def _sample(self, conn: psycopg.Connection) -> None:
        rows = conn.execute(
            """
            SELECT s.job_id, s.lease_version, s.queue, s.concurrency_key, NULL::integer,
                   s.locked_until <= clock_timestamp()
            FROM queue_job_state s WHERE s.queue = ANY(%(queues)s) AND s.status = 'running'
            UNION ALL
            SELECT l.job_id, l.lease_version, s.queue, s.concurrency_key, l.pid, false
            FROM qa_ledger l JOIN queue_job_state s ON s.job_id = l.job_id
            WHERE l.finished_at IS NULL AND s.queue = ANY(%(queues)s)
            """,
            {"queues": list(QUEUES)},
        ).fetchall()
        # Checked after the query: a process alive now was alive when it read.
        alive = {pid: _alive(pid) for pid in {row[4] for row in rows if row[4] is not None}}
        running = {(job, version) for job, version, _, _, pid, _ in rows if pid is None}
        executions = {}
        for job, version, queue, key, pid, _ in rows:
            if pid is None or alive[pid]:
                executions[(job, version)] = (queue, key)
        limited = [key for queue, key in executions.values() if queue == "roll-limited"]
        per_key = Counter(key for key in limited if key is not None)
        per_job = Counter(job for job, _ in executions)
        self.samples += 1
        self.max_running = max(self.max_running, len(limited))
        self.max_per_key = max(self.max_per_key, max(per_key.values(), default=0))
        self.max_same_job = max(self.max_same_job, max(per_job.values(), default=0))
        if set(executions) - running:
            self.released_early += 1
        if any(lease_ended for *_, lease_ended in rows):
            self.held += 1
        if self.in_force_at is None:
            self._look_at_schedules(conn)

    def _look_at_schedules(self, conn: psycopg.Connection) -> None:
        """The new release is in force once the retimed schedule has its new timing and
        a next tick of it, and the removed one is disabled."""
        now, retimed, removed = conn.execute(
            """
            SELECT clock_timestamp(),
              (SELECT cron IS NOT NULL AND next_tick IS NOT NULL FROM queue_schedules
               WHERE name = 'deploy-retimed'),
              (SELECT NOT enabled FROM queue_schedules WHERE name = 'deploy-removed')
            """
        ).fetchone()
        if retimed and removed:
            self.in_force_at = now

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        if self.error is not None:
            raise self.error


class Feeder:
    """Enqueue the scenario's mix every half second until stopped."""

    def __init__(self) -> None:
        self.rounds = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def batch(self, n: int) -> list[JobSpec]:
        key = f"customer:{n % KEYS}"
        last = 1 if n % 2 else None  # every other job of a kind on its last attempt
        jobs = [
            JobSpec("qa.ledger", {"seconds": LONG_S}, queue="roll", max_attempts=last),
            *(
                JobSpec("qa.ledger", {"seconds": SHORT_S}, queue="roll", max_attempts=m)
                for m in (1, None, None, None)
            ),
            JobSpec("qa.ledger", {"seconds": SHORT_S}, queue="roll-limited", max_attempts=last),
            JobSpec(
                "qa.ledger", {"seconds": LIMITED_LONG_S}, queue="roll-limited",
                concurrency_key=key, max_attempts=1 if n % 4 < 2 else None,
            ),
            JobSpec(
                "qa.ledger", {"seconds": SHORT_S}, queue="roll-limited", concurrency_key=key,
                max_attempts=last,
            ),
        ]  # fmt: skip
        if n % 4 == 0:
            jobs += [
                JobSpec("qa.permanent", {}, queue="roll"),
                JobSpec("qa.fail", {}, queue="roll"),
                JobSpec("qa.flaky", {"failures": 1}, queue="roll"),
            ]
        return jobs

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                enqueue_many(self.batch(self.rounds))
                self.rounds += 1
                self.stop.wait(0.5)
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc
        finally:
            connection.close()

    def __enter__(self) -> Feeder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error


def db_now() -> dt.datetime:
    return sql("SELECT clock_timestamp()")[0][0]


def test_rolling_deploy(worker_process, report):
    """15. Rolling deploy: 4 workers restarted with SIGTERM, twice over, new schedules"""
    set_queue_limit("roll-limited", LIMIT)
    set_key_limit("roll-limited", 1)
    generation = 0

    def start(slot: int, release: str) -> tuple[str, Any]:
        nonlocal generation
        generation += 1
        worker_id = f"roll-{slot}-{generation}"
        worker = worker_process(
            *QUEUES, "--worker-id", worker_id, *OPTIONS,
            env={"PGQUEUE_TEST_SCHEDULES": release},
        )  # fmt: skip
        return worker_id, worker

    began = time.monotonic()
    slots = [start(slot, OLD) for slot in range(WORKERS)]
    for worker_id, _ in slots:
        wait_ready(worker_id)
    wait_until(
        "SELECT count(*) FROM queue_schedules WHERE next_tick IS NOT NULL",
        lambda n: n == len(settings.DEPLOY_SCHEDULES[OLD]),
    )
    window_start = db_now() + dt.timedelta(seconds=1)
    # The deploy begins inside the window: on a quiet machine the new release's first
    # worker can start and sync its schedules within a second.
    while db_now() < window_start:
        time.sleep(0.02)
    restarts = []
    phases = {"start_s": round(time.monotonic() - began, 1)}
    began = time.monotonic()
    with Sampler() as sampler, Feeder() as feeder:
        for _ in range(PASSES):
            for slot in range(WORKERS):
                time.sleep(GAP_S)
                # The new worker starts as the old one stops (a surge of one).
                replacement = start(slot, NEW)
                _, worker = slots[slot]
                signalled = time.monotonic()
                worker.signal(signal.SIGTERM)
                code, output = worker.wait(60)
                assert code == 0, output
                restarts.append(round(time.monotonic() - signalled, 2))
                wait_ready(replacement[0])
                slots[slot] = replacement
        time.sleep(GAP_S)
        window_end = db_now()
        phases["deploy_s"] = round(time.monotonic() - began, 1)
        began = time.monotonic()
        feeder.stop.set()
        feeder.thread.join(30)
        # Drained: every job of the two work queues finished (the ticks' are checked
        # with the ticks).
        wait_until(
            "SELECT count(*) FROM queue_job_state WHERE queue IN ('roll', 'roll-limited') "
            "AND status NOT IN ('completed', 'dead')",
            lambda n: n == 0,
            timeout=size(60, 180),
        )
        wait_until(  # the window's last ticks have fired
            "SELECT count(*) FROM queue_schedule_ticks WHERE tick_at >= %s",
            lambda n: n >= 2,
            params=[window_end],
        )
    phases["drain_s"] = round(time.monotonic() - began, 1)
    ticks = check_ticks(window_start, window_end, sampler.in_force_at)
    for _, worker in slots:
        worker.signal(signal.SIGTERM)
    for _, worker in slots:
        code, output = worker.wait(60)
        assert code == 0, output
    jobs = check_jobs()
    figures = {
        "samples": sampler.samples,
        "max_running": sampler.max_running,
        "limit": LIMIT,
        "max_per_key": sampler.max_per_key,
        "max_same_job_at_once": sampler.max_same_job,
        "samples_slot_held_for_a_stopping_handler": sampler.held,
        "samples_handler_running_row_released": sampler.released_early,
    }
    report(
        size=f"{jobs['jobs']} jobs, {WORKERS} workers, {len(restarts)} SIGTERM restarts",
        lost=jobs["lost"],
        completed_twice=jobs["completed_twice"],
        re_executions=jobs["re_executions"],
        **{
            k: v
            for k, v in jobs.items()
            if k not in ("jobs", "lost", "completed_twice", "re_executions")
        },
        **figures,
        **ticks,
        stop_s=restarts,
        **phases,
        notes="4 workers (old schedule code) restarted one after another with SIGTERM "
        f"(grace {GRACE} s, handlers of {LONG_S} s interrupted), twice over, each replaced "
        "by a worker of the new schedule code; limits sampled every 10 ms (running rows and "
        "the handlers still running in stopping workers); every due tick fired once",
    )
    assert sampler.samples > 500
    assert sampler.max_running == LIMIT, figures  # reached, and never above
    assert sampler.max_per_key == 1, figures
    assert sampler.max_same_job == 1, figures
    assert sampler.released_early == 0, figures
    assert jobs["interrupted_last_attempt"] >= 1, jobs  # the deploy did hit such jobs


def check_jobs() -> dict[str, int]:
    """Every job of the work queues ended as its handler decided; the figures."""
    by_outcome = dict(
        sql(
            """
            SELECT CASE
                     WHEN j.type IN ('qa.permanent', 'qa.fail') AND s.status = 'dead'
                       THEN 'failed, dead'
                     WHEN j.type NOT IN ('qa.permanent', 'qa.fail') AND s.status = 'completed'
                       THEN 'completed'
                     ELSE j.type || ' ended ' || s.status
                   END, count(*)
            FROM queue_jobs j JOIN queue_job_state s ON s.job_id = j.id
            WHERE j.queue IN ('roll', 'roll-limited') GROUP BY 1
            """
        )
    )
    unexpected = {k: v for k, v in by_outcome.items() if k not in ("failed, dead", "completed")}
    assert unexpected == {}, by_outcome
    # A dead job's attempts all failed in its handler (qa.fail: 3 of them), none was
    # spent by an interruption or a lost lease.
    spent_otherwise = sql(
        """
        SELECT j.type, count(*) FILTER (WHERE a.status = 'failed'),
               count(*) FILTER (WHERE a.status IN ('lost', 'interrupted'))
        FROM queue_jobs j JOIN queue_job_state s ON s.job_id = j.id
        JOIN queue_attempts a ON a.job_id = j.id
        WHERE s.status = 'dead' GROUP BY j.id, j.type
        EXCEPT SELECT * FROM (VALUES ('qa.permanent', 1, 0), ('qa.fail', 3, 0)) AS v(t, f, o)
        """
    )
    assert spent_otherwise == []
    # The job that fails once completed on its second attempt.
    assert sql(
        "SELECT count(*) FROM queue_jobs j JOIN queue_job_state s ON s.job_id = j.id "
        "WHERE j.type = 'qa.flaky' AND (s.status <> 'completed' OR (SELECT count(*) "
        "FROM queue_attempts a WHERE a.job_id = j.id AND a.status = 'failed') <> 1)"
    ) == [(0,)]
    ledger_jobs = (
        "SELECT id FROM queue_jobs WHERE queue IN ('roll', 'roll-limited') AND type = 'qa.ledger'"
    )
    counts = ledger_counts(ledger_jobs)
    assert counts["lost"] == 0, counts
    assert counts["completed_twice"] == 0, counts
    assert counts["completed_without_success"] == 0, counts
    [(interrupted, interrupted_last, lost_leases)] = sql(
        """
        SELECT count(*) FILTER (WHERE a.status = 'interrupted'),
               count(DISTINCT a.job_id) FILTER (WHERE a.status = 'interrupted'
                                                AND s.max_attempts = 1),
               count(*) FILTER (WHERE a.status = 'lost')
        FROM queue_attempts a JOIN queue_job_state s ON s.job_id = a.job_id
        WHERE s.queue IN ('roll', 'roll-limited')
        """
    )
    return {
        **counts,
        "dead_failed": by_outcome.get("failed, dead", 0),
        "interrupted_attempts": interrupted,
        "interrupted_last_attempt": interrupted_last,
        "lost_leases": lost_leases,
    }


def check_ticks(
    start: dt.datetime, end: dt.datetime, in_force_at: dt.datetime | None
) -> dict[str, Any]:
    """Every due tick of the schedule in force fired exactly once; the figures.

    The switch: the new release's first worker notes its set of schedules
    (queue_schedule_code.first_seen, `switch`), writes the schedules, then fires what
    is due; the sampler saw the new release in force (the retimed schedule with its
    new timing and a next tick of it, the removed one disabled) at `in_force_at`.
    Due, and so fired exactly once: a tick in the window of `deploy-steady`; of the old
    timings of `deploy-retimed` and `deploy-removed` before `switch`; of the new timing
    of `deploy-retimed` after `in_force_at`. Between the two instants (milliseconds: one
    worker's sync and its next pass) a tick of either timing fires at most once.
    Nothing else fires in the window: no old timing after the switch, no removed
    schedule, no tick merged into a catch-up.
    """
    assert in_force_at is not None, "the new release's schedules never came in force"
    fingerprints = sql("SELECT first_seen FROM queue_schedule_code ORDER BY first_seen")
    assert len(fingerprints) == 2, fingerprints  # the old release's set and the new one's
    switch = fingerprints[1][0]
    assert start < switch < in_force_at < end

    def ticks(release: str, name: str, low: dt.datetime, high: dt.datetime) -> set:
        return {(name, t) for t in _timing(release, name).between(low, high, 100_000)}

    exact = (
        ticks(OLD, "deploy-steady", start, end)
        | ticks(OLD, "deploy-retimed", start, switch)
        | ticks(OLD, "deploy-removed", start, switch)
        | {(n, t) for n, t in ticks(NEW, "deploy-retimed", in_force_at, end) if t > in_force_at}
    )
    either = (
        ticks(OLD, "deploy-retimed", switch, in_force_at)
        | ticks(NEW, "deploy-retimed", switch, in_force_at)
        | ticks(OLD, "deploy-removed", switch, in_force_at)
    ) - exact
    fired = sql(
        "SELECT schedule, tick_at, missed FROM queue_schedule_ticks "
        "WHERE tick_at BETWEEN %s AND %s",
        [start, end],
    )
    seen = Counter((name, tick) for name, tick, _ in fired)
    missing = exact - set(seen)
    doubled = {key: n for key, n in seen.items() if n > 1}
    unexpected = set(seen) - exact - either
    assert (missing, doubled, unexpected) == (set(), {}, set())
    assert [row for row in fired if row[2] != 0] == []
    # One job per tick, each completed once.
    tick_jobs = (
        "SELECT job_id AS id FROM queue_schedule_ticks "
        f"WHERE tick_at BETWEEN '{start.isoformat()}' AND '{end.isoformat()}'"
    )
    wait_until(
        f"SELECT count(*) FROM queue_job_state WHERE status <> 'completed' "
        f"AND job_id IN ({tick_jobs})",
        lambda n: n == 0,
    )
    counts = ledger_counts(tick_jobs)
    assert counts["jobs"] == len(fired)
    assert (counts["lost"], counts["completed_twice"]) == (0, 0), counts
    # After the deploy the new release is in force.
    assert sql(
        "SELECT name, enabled, source, cron, extract(epoch FROM every)::float8 "
        "FROM queue_schedules ORDER BY name"
    ) == [
        ("deploy-removed", False, "removed", None, 3.0),
        ("deploy-retimed", True, "code", "*/5 * * * * *", None),
        ("deploy-steady", True, "code", None, 1.0),
    ]
    return {
        "ticks_expected": len(exact),
        "ticks_fired": len(fired),
        "ticks_in_switch": len(either & set(seen)),
        "ticks_missing": len(missing),
        "ticks_doubled": len(doubled),
        "switch_ms": round((in_force_at - switch).total_seconds() * 1000, 1),
    }
