"""Queue control with a stale worker: SIGSTOPped past its lease under a global limit."""

from __future__ import annotations

import signal
import time

import pytest

from django_pgqueue import enqueue_many, set_queue_limit
from tests.conftest import sql
from tests.reliability.conftest import FULL, size, wait_until
from tests.reliability.test_limits import (
    LEASE,
    LIMIT,
    OPTIONS,
    SESSIONS,
    SWEEP,
    Sampler,
    drained,
    exactly_once,
    stop_all,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_global_limit_with_a_stale_sigstopped_worker(worker_process, report):
    """13f. Queue control: Global limit 3, a worker SIGSTOPped past its lease"""
    jobs = size(150, 600)
    set_queue_limit("stale", LIMIT)
    enqueue_many([("qa.nap", {"seconds": 0.2}) for _ in range(jobs)], queue="stale")
    with Sampler("stale") as sampler:
        workers = [worker_process("stale", "--worker-id", f"stale-{i}", *OPTIONS) for i in range(3)]
        # Freeze the worker holding the most slots, mid-job. What it holds is read once
        # it is frozen and none of its statements is still running on the server: one
        # it had sent (a completion, under load) may still land after the signal.
        held: list[int] = []
        deadline = time.monotonic() + 60
        while not held:
            assert time.monotonic() < deadline, "no worker could be frozen holding a slot"
            rows = sql(
                "SELECT locked_by FROM queue_job_state WHERE queue = 'stale' "
                "AND status = 'running' GROUP BY locked_by ORDER BY count(*) DESC LIMIT 1"
            )
            if not rows:
                time.sleep(0.01)
                continue
            worker_id = rows[0][0]
            victim = workers[int(worker_id.rsplit("-", 1)[1])]
            stopped_at = sql("SELECT clock_timestamp()")[0][0]
            victim.signal(signal.SIGSTOP)
            if not _quiesced(worker_id):
                victim.signal(signal.SIGCONT)  # frozen inside a transaction: try again
                continue
            (held,) = sql(
                "SELECT coalesce(array_agg(job_id), '{}') "
                "FROM queue_job_state WHERE locked_by = %s AND status = 'running'",
                [worker_id],
            )[0]
            if not held:
                victim.signal(signal.SIGCONT)
        # Its slots come back with the sweep, and the others use them.
        wait_until(
            "SELECT count(*) FROM queue_attempts WHERE job_id = ANY(%s) AND status = 'lost'",
            lambda n: n == len(held),
            timeout=LEASE + SWEEP + 10,
            params=[held],
        )
        back_s = sql(
            "SELECT extract(epoch FROM max(finished_at) - %s)::float8 FROM queue_attempts "
            "WHERE job_id = ANY(%s) AND status = 'lost'",
            [stopped_at, held],
        )[0][0]
        time.sleep(LEASE)
        victim.signal(signal.SIGCONT)  # it wakes up stale: its writes must change nothing
        drained("stale", jobs, timeout=size(120, 300))
    stop_all(workers)
    exactly_once("stale")
    stale_succeeded = sql(
        "SELECT count(*) FROM queue_attempts a WHERE a.job_id = ANY(%s) AND a.worker_id = %s "
        "AND a.status = 'succeeded'",
        [held, worker_id],
    )[0][0]
    report(
        size=jobs,
        lost=0,
        completed_twice=0,
        held_when_stopped=len(held),
        max_running=max(sampler.samples),
        recovery_s=round(back_s, 2),
        stale_completions_accepted=stale_succeeded,
    )
    assert max(sampler.samples) <= LIMIT
    assert stale_succeeded == 0  # its old leases' completions were all refused
    # Recovery within a lease and a sweep (1 s for the worker's next cycle): a
    # wall-clock promise, asserted at full size (make reliability), reported in CI.
    if FULL:
        assert back_s <= LEASE + SWEEP + 1.0


def _quiesced(worker_id: str, timeout: float = 5.0) -> bool:
    """Whether every session of the (frozen) worker is idle on the server within `timeout`."""
    names = [f"pgqueue {role} {worker_id}" for role in SESSIONS]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = sql(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = ANY (%s) AND state IS DISTINCT FROM 'idle'",
            [names],
        )[0][0]
        if busy == 0:
            return True
        time.sleep(0.02)
    return False
