"""Scenario: chords and chains run by 4 worker processes, one SIGKILLed every ~2 s.

Every step is a `qa.ledger` job (the ledger records each handler start on its own
connection). Whatever the kills interrupt, each fan-in must count every member once:
0 callbacks made pending twice or run twice to success, 0 never fired, 0 steps started
before all their dependencies completed, 0 jobs lost.
"""

from __future__ import annotations

import random
import time

import pytest

from django_pgqueue import chain, chord, group, step
from tests.conftest import sql
from tests.reliability.conftest import outcome, size, stop_and_count, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = 4
SESSIONS = ("worker", "heartbeat", "listener")
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
Q = "flows"


def ledger(seconds: float):
    return step("qa.ledger", {"seconds": seconds}, queue=Q)


def test_chords_and_chains_under_sigkills(worker_process, report):
    """Workflows under SIGKILL"""
    chords, members, chains = size(16, 200), size(10, 50), size(16, 200)
    seconds = size(100, 20) / 1000  # long enough in CI for kills to land mid-workflow
    callbacks = []
    for _ in range(chords):
        run = chord(group(*(ledger(seconds) for _ in range(members))), ledger(seconds)).enqueue()
        callbacks.append(list(run.jobs.values())[-1])
    for _ in range(chains):
        chain(*(ledger(seconds) for _ in range(5))).enqueue()
    jobs = chords * (members + 1) + chains * 5

    rng = random.Random()
    generation = 0

    def start(slot: int):
        nonlocal generation
        generation += 1
        worker_id = f"flows-{slot}-{generation}"
        return worker_id, worker_process(Q, "--worker-id", worker_id, *OPTIONS)

    slots = [start(slot) for slot in range(WORKERS)]
    started = time.monotonic()
    deadline = started + size(300, 1800)
    kills = 0
    next_kill = started + rng.uniform(0.5, 1.0)  # the first kill early: a quiet CI drains fast
    while sql("SELECT count(*) FROM queue_job_state WHERE status <> 'completed'")[0][0]:
        assert time.monotonic() < deadline, "not drained in time"
        if time.monotonic() < next_kill:
            time.sleep(0.05)
            continue
        slot = rng.randrange(WORKERS)
        worker_id, victim = slots[slot]
        victim.kill()
        wait_until(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY (%s)",
            lambda n: n == 0,
            timeout=30,
            params=[[f"pgqueue {role} {worker_id}" for role in SESSIONS]],
        )
        kills += 1
        slots[slot] = start(slot)
        next_kill = time.monotonic() + rng.uniform(1.5, 2.5)
    drain_s = time.monotonic() - started
    wait_until(
        "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
        "WHERE application_name = ANY (%s)",
        lambda n: n == WORKERS,
        params=[[f"pgqueue worker {worker_id}" for worker_id, _ in slots]],
    )
    # 0 lost, and every job completed by exactly one succeeded attempt.
    counts = stop_and_count([worker for _, worker in slots], jobs)
    assert kills >= 1, "the workflows finished before the chaos started"
    # Each finished dependency counted once: no step waits for anything, none failed.
    assert sql(
        "SELECT count(*) FROM queue_workflow_steps WHERE waiting_for <> 0 OR failed <> 0"
    ) == [(0,)]
    # 0 callbacks never fired, 0 fired twice: each ran to success exactly once.
    fired = dict(
        sql(
            "SELECT job_id, count(*) FILTER (WHERE status = 'succeeded') FROM queue_attempts "
            "WHERE job_id = ANY (%s) GROUP BY job_id",
            [callbacks],
        )
    )
    assert sorted(fired) == sorted(callbacks)
    assert set(fired.values()) == {1}
    # 0 steps started before all their dependencies completed: every handler start of
    # a step (the ledger, on the handler's connection) and every claim of it came after
    # the transaction that completed each of its dependencies began.
    early = sql(
        """
        SELECT count(*) FROM queue_job_deps AS dep
        JOIN queue_attempts AS parent
          ON parent.job_id = dep.depends_on AND parent.status = 'succeeded'
        WHERE EXISTS (
            SELECT FROM queue_attempts AS child
            WHERE child.job_id = dep.job_id AND child.started_at < parent.finished_at
        ) OR EXISTS (
            SELECT FROM qa_ledger AS run
            WHERE run.job_id = dep.job_id AND run.started_at < parent.finished_at
        )
        """
    )[0][0]
    assert early == 0
    edges = sql("SELECT count(*) FROM queue_job_deps")[0][0]
    report(
        size=f"{chords} chords of {members} + {chains} chains of 5 ({jobs:,} jobs, "
        f"{edges:,} edges), {WORKERS} processes x 4 threads",
        **outcome(counts),
        callbacks_fired_twice=0,
        callbacks_never_fired=0,
        started_early=early,
        kills=kills,
        drain_s=round(drain_s, 1),
        notes=f"a random worker SIGKILLed every ~2 s (lease {LEASE:g} s, sweep 1 s); each "
        "settle counted once (every step's counters end at 0)",
    )
