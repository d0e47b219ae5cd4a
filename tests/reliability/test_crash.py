"""Scenarios 2 and 8: workers killed mid-job, and handlers that run long, hang or kill
their own process."""

from __future__ import annotations

import random
import signal
import statistics
import time
from typing import Any

import pytest

from django_pgqueue import enqueue
from tests.conftest import sql
from tests.reliability.conftest import ledger_counts, size, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 2.0
SWEEP = 1.0
WORKER_ARGS = ("--lease", "2", "--heartbeat-interval", "0.5", "--sweep-interval", "1", "-v", "0")


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def wait_ready(worker_id: str) -> None:
    """Until the worker's listener is connected: it is up and will hear the next NOTIFY."""
    wait_until(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = %s",
        lambda n: n == 1,
        params=[f"pgqueue listener {worker_id}"],
    )


class Supervisor:
    """Keeps `slots` run_queue_worker processes up, each under a fresh worker id."""

    def __init__(self, start: Any, queue: str, slots: int, *args: str) -> None:
        self.start, self.queue, self.args = start, queue, args
        self.started = 0
        self.procs: dict[str, Any] = {}
        self.exit_codes: list[int] = []
        for _ in range(slots):
            self.spawn()

    def spawn(self) -> str:
        worker_id = f"{self.queue}-{self.started}"
        self.started += 1
        self.procs[worker_id] = self.start(
            self.queue, *WORKER_ARGS, *self.args, "--worker-id", worker_id
        )
        return worker_id

    def ready(self) -> None:
        for worker_id in self.procs:
            wait_ready(worker_id)

    def kill(self, worker_id: str) -> None:
        proc = self.procs.pop(worker_id)
        proc.proc.kill()
        proc.proc.wait(10)
        self.spawn()

    def restart_dead(self) -> None:
        for worker_id, proc in list(self.procs.items()):
            code = proc.proc.poll()
            if code is not None:
                self.exit_codes.append(code)
                del self.procs[worker_id]
                self.spawn()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.signal(signal.SIGTERM)
        for proc in self.procs.values():
            code, output = proc.wait(60)
            assert code == 0, output


def test_sigkill_mid_job(worker_process, report):
    """2. SIGKILL mid-job"""
    rng = random.Random()
    kills = size(3, 20)
    plan: list[int] = []  # kills per job: 1 or 2
    while sum(plan) < kills:
        plan.append(min(rng.choice((1, 2)), kills - sum(plan)))
    handler_s = 0.6
    workers = Supervisor(worker_process, "crash", 2, "--concurrency", "1")
    reclaim_s: list[float] = []  # kill -> the job running again in another worker
    recovery_s: list[float] = []  # last kill of a job -> the job completed
    for job_kills in plan:
        job = enqueue("qa.ledger", {"seconds": handler_s}, queue="crash")
        killed_at = None
        for run in range(1, job_kills + 1):
            workers.ready()
            wait_until(
                "SELECT count(*) FROM qa_ledger WHERE job_id = %s", lambda n, r=run: n == r,
                params=[job.id],
            )  # fmt: skip
            if killed_at is not None:
                reclaim_s.append(seconds_since(killed_at, job.id, run))
            [(entry, worker_id)] = sql(
                "SELECT id, worker_id FROM qa_ledger WHERE job_id = %s AND attempt = %s",
                [job.id, run],
            )
            time.sleep(rng.uniform(0.05, handler_s - 0.1))
            [(killed_at,)] = sql("SELECT clock_timestamp()")
            workers.kill(worker_id)
            # Killed mid-job: the handler had started and had not finished.
            assert sql("SELECT finished_at FROM qa_ledger WHERE id = %s", [entry]) == [(None,)]
        wait_until(
            "SELECT status FROM queue_job_state WHERE job_id = %s",
            lambda status: status == "completed",
            params=[job.id],
        )
        reclaim_s.append(seconds_since(killed_at, job.id, job_kills + 1))
        [(done,)] = sql(
            "SELECT extract(epoch FROM finished_at - %s)::float8 FROM queue_job_state "
            "WHERE job_id = %s",
            [killed_at, job.id],
        )
        recovery_s.append(done)
        # One attempt per kill, each closed as lost by the sweep, then the one that
        # succeeded, in another worker than any that was killed; versions only grow.
        attempts = sql(
            "SELECT attempt_index, status, worker_id, lease_version FROM queue_attempts "
            "WHERE job_id = %s ORDER BY id",
            [job.id],
        )
        assert [(index, status) for index, status, _, _ in attempts] == [
            *((n, "lost") for n in range(1, job_kills + 1)),
            (job_kills + 1, "succeeded"),
        ]
        assert len({worker for _, _, worker, _ in attempts}) == job_kills + 1
        versions = [version for _, _, _, version in attempts]
        assert versions == sorted(set(versions))
        assert sql("SELECT attempts FROM queue_job_state WHERE job_id = %s", [job.id]) == [
            (job_kills + 1,)
        ]
    workers.stop()

    bound = LEASE + SWEEP + 2
    assert max(recovery_s) <= bound, recovery_s
    assert max(reclaim_s) <= bound, reclaim_s
    counts = ledger_counts()
    assert counts["lost"] == 0
    assert counts["completed_twice"] == 0
    assert counts["re_executions"] == kills
    report(
        size=kills,
        jobs=len(plan),
        lost=counts["lost"],
        completed_twice=counts["completed_twice"],
        re_executions=counts["re_executions"],
        recovery_s=round(max(recovery_s), 2),
        recovery_p50_s=round(statistics.median(recovery_s), 2),
        recovery_max_s=round(max(recovery_s), 2),
        reclaim_p50_s=round(statistics.median(reclaim_s), 2),
        reclaim_max_s=round(max(reclaim_s), 2),
        bound_s=bound,
        notes=f"SIGKILL at a random moment of a {handler_s:g} s handler (1 or 2 kills per "
        "job); recovery is kill to completion by another worker, lease 2 s, sweep 1 s.",
    )


def seconds_since(killed_at: Any, job_id: int, attempt: int) -> float:
    """Seconds from a kill to the start of the job's given attempt (database clock)."""
    return sql(
        "SELECT extract(epoch FROM started_at - %s)::float8 FROM queue_attempts "
        "WHERE job_id = %s AND attempt_index = %s",
        [killed_at, job_id, attempt],
    )[0][0]
