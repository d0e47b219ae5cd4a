"""Scenario: hard time limits firing in supervised worker processes while other handlers
run, under SIGKILLs of children and of the supervisor."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from django_pgqueue import enqueue_many, set_queue_limit
from django_pgqueue.enqueue import JobSpec
from django_pgqueue.supervisor import QUICK_EXIT
from tests.acceptance.test_time_limits import LIMITED, RunningSampler
from tests.conftest import sql
from tests.reliability.conftest import kill_not_due, overlapping_runs, size, wait_ready

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "hardlim"
LIMIT = 6
OPTIONS = (
    "--processes", "2",
    "--concurrency", "4",
    "--lease", "2",
    "--heartbeat-interval", "0.6",
    "--sweep-interval", "1",
    "--poll-interval", "0.5",
    "--shutdown-grace", "5",
    "-v", "0",
)  # fmt: skip


def test_hard_limits_under_sigkills(supervised, report):
    """Hard time limits firing under SIGKILLs of children and the supervisor"""
    set_queue_limit(QUEUE, LIMIT)
    plain = size(1_500, 20_000)
    limited = size(6, 60)
    specs = [JobSpec("qa.ledger", {"seconds": 0.05}, queue=QUEUE) for _ in range(plain)]
    step = max(1, plain // limited)
    for index in range(limited):  # spread through the queue
        specs.insert(index * (step + 1), JobSpec("qa.limit_sleep", {}, queue=QUEUE, max_attempts=2))
    enqueue_many(specs)

    def start_supervisor(name: str):
        workers = supervised(QUEUE, "--worker-id", name, *OPTIONS, env=LIMITED)
        for child in workers.wait_children(2).values():
            wait_ready(child.worker_id)
        return workers

    rng = random.Random()
    sampler = RunningSampler(QUEUE)
    sampler.start()
    workers = start_supervisor("ha")
    started = time.monotonic()
    deadline = started + size(900, 3600)  # a hang guard, not a bound
    child_kills = 0
    supervisor_killed = False
    next_kill = started + rng.uniform(2, 4)
    try:
        while True:
            remaining = sql(
                "SELECT count(*) FROM queue_job_state WHERE status NOT IN ('completed', 'dead')"
            )[0][0]
            if remaining == 0:
                break
            if kill_not_due(remaining, deadline, next_kill):
                continue
            if not supervisor_killed and remaining < (plain + limited) // 2:
                # Once, half way: its children stop gracefully on their own (or end for
                # a time limit, their last words to no one: the sweep takes their jobs).
                supervisor_killed = True
                workers.proc.kill()
                workers.proc.wait(10)
                workers = start_supervisor("hb")
            else:
                candidates = [c for c in workers.children().values() if c.age_s > QUICK_EXIT]
                if candidates:
                    os.kill(rng.choice(candidates).pid, signal.SIGKILL)
                    child_kills += 1
            next_kill = time.monotonic() + rng.uniform(2, 4)
    finally:
        most = sampler.stop()
    drain_s = time.monotonic() - started
    workers.signal(signal.SIGTERM)
    code, output = workers.wait(60)
    assert code == 0, output

    assert supervisor_killed, "the queue drained before the supervisor was killed"
    assert most <= LIMIT, f"{most} jobs ran at once in a queue limited to {LIMIT}"
    # Nothing lost: every plain job completed once; every limited job died of its
    # limit, no attempt of it succeeding (one is given back when another of its process
    # ends it, or lost when the process was SIGKILLed).
    assert sql(
        "SELECT j.type, s.status, count(*) FROM queue_jobs j JOIN queue_job_state s "
        "ON s.job_id = j.id GROUP BY 1, 2 ORDER BY 1"
    ) == [("qa.ledger", "completed", plain), ("qa.limit_sleep", "dead", limited)]
    assert sql(
        "SELECT count(*) FROM (SELECT job_id FROM queue_attempts WHERE status = 'succeeded' "
        "GROUP BY job_id HAVING count(*) > 1) twice"
    ) == [(0,)]
    assert sql(
        "SELECT count(*) FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id "
        "WHERE j.type = 'qa.limit_sleep' AND a.status NOT IN ('failed', 'lost', 'interrupted')"
    ) == [(0,)]
    # Never run twice at once: each attempt of a limited job ran in a process of its
    # own (the one before was gone), and no two attempts of a job overlapped (an
    # attempt's row closes once its code stopped: a killed process's, after its end).
    assert sql(
        "SELECT count(*) FROM (SELECT l.job_id FROM qa_ledger l JOIN queue_jobs j "
        "ON j.id = l.job_id WHERE j.type = 'qa.limit_sleep' GROUP BY l.job_id "
        "HAVING count(*) <> count(DISTINCT l.pid)) shared"
    ) == [(0,)]
    assert overlapping_runs("queue_attempts") == 0
    limit_failures = sql(
        "SELECT count(*) FROM queue_attempts WHERE error_class = 'django_pgqueue.TimeLimitExceeded'"
        " AND status = 'failed'"
    )[0][0]
    given_back = sql(
        "SELECT count(*) FROM queue_attempts WHERE error_class = 'django_pgqueue.TimeLimitExceeded'"
        " AND status = 'interrupted'"
    )[0][0]
    assert limit_failures > 0
    report(
        size=f"{plain:,} jobs and {limited} past a 2 s hard limit, 2 processes x 4 threads",
        lost=0,
        completed_twice=0,
        re_executions=sql(
            "SELECT count(*) - count(DISTINCT job_id) FROM qa_ledger l JOIN queue_jobs j "
            "ON j.id = l.job_id WHERE j.type = 'qa.ledger'"
        )[0][0],
        limit_failures=limit_failures,
        given_back=given_back,
        child_kills=child_kills,
        supervisor_kills=1,
        most_running=most,
        drain_s=round(drain_s, 1),
        notes=f"queue limit {LIMIT}; a random child (older than 10 s) SIGKILLed every 2-4 s, "
        "the supervisor once; each hard limit ends its process, its other jobs given back",
    )
