"""Scenarios 19a and 19b: hard time limits in supervised worker processes.

19a: a handler blocked in time.sleep(60) and one in a CPU loop, each with a hard limit
of 2 s, stopped (their process ended) within 2 s + STOP_MARGIN of their start, their
jobs failed with the timeout and retried, the other jobs of their process given back
without a spent attempt, the queue's limit held. The bound is asserted at full size
only (`make reliability`); the reduced size asserts the rest.

19b: hard limits firing while other handlers run, under SIGKILLs of children and of
the supervisor."""

from __future__ import annotations

import os
import random
import signal
import statistics
import time

import pytest

from django_pgqueue import enqueue, enqueue_many, set_queue_limit
from django_pgqueue.enqueue import JobSpec
from django_pgqueue.supervisor import QUICK_EXIT
from tests.acceptance.test_time_limits import LIMITED, RunningSampler, attempts_of, stop
from tests.conftest import sql
from tests.reliability.conftest import (
    FULL,
    kill_not_due,
    overlapping_runs,
    size,
    wait_ready,
    wait_until,
)
from tests.supervised import process_gone

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
TIME_TO_STOP = (
    "--lease", "30",
    "--heartbeat-interval", "0.5",
    "--sweep-interval", "1",
    "-v", "1",
)  # fmt: skip


HARD_LIMIT = 2.0  # qa.limit_sleep's and qa.limit_spin's time_limit
# What a stop may take past the hard limit, from the handler's start to its failure
# written: the dispatcher waking at the deadline, the outcomes of the process's other handlers
# written, its exit, the supervisor's next look (every 0.1 s), and its write of the
# process's jobs on a connection of its own.
STOP_MARGIN = 1.5
OTHERS = 3  # other jobs enqueued with each limited one
KINDS = {"qa.limit_sleep": "time.sleep(60)", "qa.limit_spin": "a CPU loop"}


def test_hard_limit_time_to_stop(supervised, report):
    """19a. Hard time limit of 2 s: a handler in time.sleep(60) and one in a CPU loop stopped"""
    queue = "tts"
    set_queue_limit(queue, 3)
    workers = supervised(
        queue, "--concurrency", "4", "--worker-id", "tts", *TIME_TO_STOP, env=LIMITED
    )
    rounds = size(1, 10)
    stops: dict[str, list[float]] = {type_: [] for type_ in KINDS}
    from_claim: dict[str, list[float]] = {type_: [] for type_ in KINDS}
    given_back = 0
    sampler = RunningSampler(queue)
    sampler.start()
    try:
        for _ in range(rounds):
            for type_ in KINDS:
                workers.wait_children(1)
                limited = enqueue(type_, {}, queue=queue, max_attempts=2).id
                # Others of the same process, running when the limit fires; and one
                # waiting for a place in the queue's limit of 3.
                others = [
                    enqueue("qa.sleep", {"seconds": 4}, queue=queue).id for _ in range(OTHERS)
                ]
                wait_until(  # both attempts end a process (a hang guard, not a bound)
                    "SELECT status FROM queue_job_state WHERE job_id = %s",
                    lambda status: status == "dead",
                    timeout=120,
                    params=[limited],
                )
                wait_until(
                    "SELECT count(*) FROM queue_job_state WHERE job_id = ANY(%s) "
                    "AND status = 'completed'",
                    lambda n: n == OTHERS,
                    timeout=120,
                    params=[others],
                )
                assert attempts_of(limited) == [("failed", "django_pgqueue.TimeLimitExceeded")] * 2
                for job in others:
                    history = attempts_of(job)
                    assert history[-1] == ("succeeded", None), history
                    assert all(
                        entry == ("interrupted", "django_pgqueue.TimeLimitExceeded")
                        for entry in history[:-1]
                    ), history
                    given_back += len(history) - 1
                    assert sql("SELECT attempts FROM queue_job_state WHERE job_id = %s", [job]) == [
                        (1,)
                    ]
                # Stopped: no process that ran it is left, and its failure was written
                # once the process was gone. Each attempt's time from its handler's
                # start (its ledger row, its first line) to then, and from its claim.
                pids = [
                    pid for (pid,) in sql("SELECT pid FROM qa_ledger WHERE job_id = %s", [limited])
                ]
                assert len(set(pids)) == 2, pids
                assert all(process_gone(pid) for pid in pids), pids
                for started, claimed in sql(
                    "SELECT extract(epoch FROM a.finished_at - l.started_at)::float8, "
                    "extract(epoch FROM a.finished_at - a.started_at)::float8 "
                    "FROM queue_attempts a JOIN qa_ledger l "
                    "ON l.job_id = a.job_id AND l.lease_version = a.lease_version "
                    "WHERE a.job_id = %s ORDER BY a.id",
                    [limited],
                ):
                    stops[type_].append(started)
                    from_claim[type_].append(claimed)
    finally:
        most = sampler.stop()
    stop(workers)
    assert most <= 3, f"{most} jobs of a queue limited to 3 ran at once"
    assert sampler.most_executing <= 3, f"{sampler.most_executing} handlers executed at once"
    bound = HARD_LIMIT + STOP_MARGIN
    report(
        size=f"{rounds} x 2 jobs of each kind (2 attempts each), 3 others per job, 1 process x 4",
        lost=0,
        completed_twice=0,
        time_to_stop=[
            {
                "handler": f"{type_} ({what})",
                "stops": len(stops[type_]),
                "min_s": round(min(stops[type_]), 2),
                "median_s": round(statistics.median(stops[type_]), 2),
                "max_s": round(max(stops[type_]), 2),
                "bound_s": bound,
                "max_from_claim_s": round(max(from_claim[type_]), 2),
            }
            for type_, what in KINDS.items()
        ],
        given_back=given_back,
        most_running=most,
        most_executing=sampler.most_executing,
        notes=f"time to stop: from the handler's start (its first line) to its failure "
        f"written by the supervisor once the process was gone; asserted <= "
        f"{HARD_LIMIT:g} s + {STOP_MARGIN:g} s at full size only (from the claim: the "
        "start's delay added). Queue limit 3.",
    )
    if FULL:
        for type_, seconds in stops.items():
            assert max(seconds) <= bound, (
                f"{type_}: stopped {max(seconds):.2f} s after its start (bound {bound} s)"
            )


def test_hard_limits_under_sigkills(supervised, report):
    """19b. Hard time limits firing while other handlers run, under SIGKILLs"""
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
            if workers.proc.poll() is not None:  # not killed by this test: say why
                code, output = workers.wait(10)
                raise AssertionError(f"the supervisor exited ({code}):\n{output[-5000:]}")
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
                # Only a child up for longer than QUICK_EXIT: a kill sooner is a quick
                # death, and five of them make the supervisor give up. Up is read from
                # its first beat, a loaded machine's slow start left out.
                settled = {
                    worker_id
                    for (worker_id,) in sql(
                        "SELECT id FROM queue_workers WHERE gone_at IS NULL "
                        "AND started_at < now() - make_interval(secs => %s)",
                        [QUICK_EXIT + 5],
                    )
                }
                candidates = [c for c in workers.children().values() if c.worker_id in settled]
                if candidates:
                    os.kill(rng.choice(candidates).pid, signal.SIGKILL)
                    child_kills += 1
            next_kill = time.monotonic() + rng.uniform(2, 4)
    finally:
        most = sampler.stop()
    drain_s = time.monotonic() - started
    stop(workers)

    assert supervisor_killed, "the queue drained before the supervisor was killed"
    assert most <= LIMIT, f"{most} jobs ran at once in a queue limited to {LIMIT}"
    # Counting the handlers still executing (by the ledger, whatever the rows say).
    executing = sampler.most_executing
    assert executing <= LIMIT, f"{executing} handlers executed at once (queue limit {LIMIT})"
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
    # The ledger (written on the handlers' own connection) agrees: no two runs of a job
    # overlapped, a run of a SIGKILLed process counted as running until its row's
    # attempt closed (its end is unknown to the ledger).
    assert overlapping_ledger_runs() == 0
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
        most_executing=executing,
        drain_s=round(drain_s, 1),
        notes=f"queue limit {LIMIT}; a random child (up for 15 s) SIGKILLed every 2-4 s, "
        "the supervisor once; each hard limit ends its process, its other jobs given back",
    )


def overlapping_ledger_runs() -> int:
    """Pairs of ledger runs of one job that overlap, a run with no end (its process was
    ended) taken as lasting until its attempt was closed (the process gone)."""
    return sql(
        """
        WITH runs AS (
            SELECT l.id, l.job_id, l.started_at,
                   coalesce(l.finished_at, a.finished_at, 'infinity') AS ended_at
            FROM qa_ledger l JOIN queue_jobs j ON j.id = l.job_id
            LEFT JOIN queue_attempts a
              ON a.job_id = l.job_id AND a.lease_version = l.lease_version
            WHERE j.queue = %s
        )
        SELECT count(*) FROM runs a JOIN runs b
          ON a.job_id = b.job_id AND a.id < b.id
         AND b.started_at < a.ended_at AND a.started_at < b.ended_at
        """,
        [QUEUE],
    )[0][0]
