"""Sequences under SIGKILLs (and, with fair queues, a database restart).

The jobs are `run_queue_worker` processes' (`qa.ledger_flaky`: each run written to the
qa ledger on the handler's own autocommit connection, some asking for retries), so what
ran, when and how often is counted apart from the queue's tables. The checks, per
sequence: every job completed once; no two attempts overlapped (an attempt ends when
its job completed, failed, or its lease was swept after the kill); the ledger's runs
start in enqueue order (a job's retries before the next job).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from django_pgqueue import enqueue
from tests.conftest import sql
from tests.reliability.conftest import (
    kill_not_due,
    ledger_counts,
    outcome,
    size,
    stop_and_count,
    wait_until,
)
from tests.reliability.pgserver import PgServer, pg_server  # noqa: F401 (a fixture)
from tests.reliability.test_database_faults import (  # noqa: F401 (a fixture)
    FaultWorker,
    stop_all,
    wait_for,
    workers,
)

pytestmark = pytest.mark.django_db(transaction=True)

Run = Callable[..., list[tuple[Any, ...]]]
LEASE = 2.0
OPTIONS = (
    "--lease", str(LEASE),
    "--heartbeat-interval", "0.6",
    "--sweep-interval", "1",
    "--concurrency", "2",
    "--poll-interval", "0.5",
    "-v", "0",
)  # fmt: skip
SESSIONS = ("worker", "heartbeat", "listener")  # a worker's connections, by application_name


def flaky_payloads(count: int, rng: random.Random) -> list[dict[str, Any]]:
    """Jobs of a few ms, one in four asking for one or two retries."""
    return [
        {"n": n, "seconds": 0.005, "failures": rng.choice((0, 0, 0, 0, 0, 0, 1, 2))}
        for n in range(count)
    ]


def sequence_faults(run: Run, queue: str) -> dict[str, int]:
    """Per sequence of `queue`: attempts that overlapped the one before (two at once),
    runs that started before an earlier job's (order broken), and, in the ledger, runs
    of finished executions that overlapped."""
    attempts, runs = (
        run(
            f"""
            SELECT state.sequence_key, one.job_id, one.started_at, one.finished_at
            FROM {table} AS one
            JOIN queue_job_state AS state ON state.job_id = one.job_id
            WHERE state.queue = %s AND state.sequence_key IS NOT NULL
            ORDER BY state.sequence_key, one.started_at, one.id
            """,
            [queue],
        )
        for table in ("queue_attempts", "qa_ledger")  # the queue's tables, then the ledger
    )
    faults = {"attempts_at_once": 0, "out_of_order": 0, "runs_at_once": 0}
    for earlier, later in pairwise(attempts):
        if earlier[0] == later[0] and (earlier[3] is None or later[2] < earlier[3]):
            faults["attempts_at_once"] += 1
    for earlier, later in pairwise(runs):
        if earlier[0] != later[0]:
            continue
        faults["out_of_order"] += later[1] < earlier[1]
        if earlier[3] is not None and later[2] < earlier[3]:
            faults["runs_at_once"] += 1
    return faults


def test_a_sequence_of_200_flaky_jobs_under_sigkills(worker_process, report):
    """18a. Sequence of flaky jobs under SIGKILLs"""
    jobs = size(60, 200)
    rng = random.Random()
    payloads = flaky_payloads(jobs, rng)
    payloads[0]["seconds"] = 1.5  # the head runs long enough for the first kill to land on it
    enqueued = [
        enqueue("qa.ledger_flaky", payload, queue="seq", sequence="customer-42")
        for payload in payloads
    ]
    generation = 0

    def start(slot: int) -> tuple[str, Any]:
        nonlocal generation
        generation += 1
        worker_id = f"seq-{slot}-{generation}"
        return worker_id, worker_process("seq", "--worker-id", worker_id, *OPTIONS)

    slots = [start(slot) for slot in range(3)]
    kills = held_at_kill = 0
    max_kills = size(4, 1_000)  # each kill of the head stalls its sequence for a lease
    started = time.monotonic()
    deadline = started + size(600, 1800)  # a hang guard, not a promise
    # The first kill as soon as the head runs (however long the workers took to start on
    # a loaded machine: a fast one could otherwise drain before it); a kill of the head
    # stalls its sequence for a lease and a sweep (~3 s): the next ones come every 2-4 s,
    # so that the sequence moves on between them.
    next_kill = started
    while remaining := sql("SELECT count(*) FROM queue_job_state WHERE status <> 'completed'")[0][
        0
    ]:
        if kill_not_due(remaining, deadline, next_kill) or kills >= max_kills:
            time.sleep(0.05)
            continue
        # The worker running the sequence's head, when one is: the kill lands mid-job.
        holder = sql("SELECT locked_by FROM queue_job_state WHERE status = 'running' LIMIT 1")
        if not kills and not holder:
            time.sleep(0.05)
            continue
        ids = [worker_id for worker_id, _ in slots]
        slot = ids.index(holder[0][0]) if holder and holder[0][0] in ids else rng.randrange(3)
        worker_id, victim = slots[slot]
        victim.kill()
        wait_until(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY (%s)",
            lambda n: n == 0,
            timeout=30,
            params=[[f"pgqueue {role} {worker_id}" for role in SESSIONS]],
        )
        kills += 1
        held_at_kill += bool(holder and holder[0][0] == worker_id)
        slots[slot] = start(slot)
        next_kill = time.monotonic() + rng.uniform(2.0, 4.0)
    drain_s = time.monotonic() - started
    wait_until(
        "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
        "WHERE application_name = ANY (%s)",
        lambda n: n == len(slots),
        params=[[f"pgqueue worker {worker_id}" for worker_id, _ in slots]],
    )
    counts = stop_and_count([worker for _, worker in slots], jobs)
    faults = sequence_faults(sql, "seq")
    assert faults == {"attempts_at_once": 0, "out_of_order": 0, "runs_at_once": 0}
    ran = [row[0] for row in sql("SELECT job_id FROM qa_ledger ORDER BY started_at, id")]
    assert list(dict.fromkeys(ran)) == [job.id for job in enqueued]  # each, in order
    retries = sql("SELECT count(*) FROM queue_attempts WHERE status = 'failed'")[0][0]
    assert kills >= 1
    report(
        size=f"1 sequence of {jobs} jobs, 3 processes",
        **outcome(counts),
        run_twice_at_once=faults["attempts_at_once"] + faults["runs_at_once"],
        out_of_order=faults["out_of_order"],
        kills=kills,
        kills_on_the_head=held_at_kill,
        retries=retries,
        drain_s=round(drain_s, 1),
        notes="a worker SIGKILLed every 2-4 s, the one running the head when one was "
        f"(lease {LEASE:g} s, sweep 1 s); one job in four asks for 1-2 retries",
    )


ENQUEUE_TENANTS = """
import json
from django.db import transaction
from django_pgqueue import JobSpec, enqueue, enqueue_many
from pathlib import Path
plan = json.loads(Path({path!r}).read_text("utf-8"))
with transaction.atomic():
    enqueue_many(
        [JobSpec("qa.ledger_flaky", p, fairness_key="bulk") for p in plan["bulk"]], queue="fq2"
    )
    for key, payloads in plan["sequenced"].items():
        for p in payloads:
            enqueue("qa.ledger_flaky", p, queue="fq2", sequence=key, fairness_key=key)
    for key, payloads in plan["plain"].items():
        enqueue_many([JobSpec("qa.ledger_flaky", p, fairness_key=key) for p in payloads],
                     queue="fq2")
"""


def test_fair_and_sequenced_queue_under_kills_and_a_restart(
    pg_server: Any,  # noqa: F811
    workers: Any,  # noqa: F811
    report: Any,
    monkeypatch: Any,
    tmp_path: Path,
) -> None:
    """18b. Fair queue with sequences under SIGKILLs and a database restart"""
    server: PgServer = pg_server
    # The enqueuer and the workers (subprocesses) take the queue as fair.
    monkeypatch.setenv("PGQUEUE_TEST_FAIR_QUEUES", json.dumps({"fq2": {}}))
    rng = random.Random()
    bulk, tenants, sequence_jobs, plain_jobs = size(300, 2_000), size(4, 8), size(12, 40), 5
    plan = {
        "bulk": flaky_payloads(bulk, rng),
        "sequenced": {f"seq-{n}": flaky_payloads(sequence_jobs, rng) for n in range(tenants)},
        "plain": {f"plain-{n}": flaky_payloads(plain_jobs, rng) for n in range(tenants)},
    }
    total = bulk + tenants * (sequence_jobs + plain_jobs)
    # The plan as a file: at full size it is longer than a command line may be.
    planned = tmp_path / "plan.json"
    planned.write_text(json.dumps(plan), "utf-8")
    server.manage("shell", "-v", "0", "-c", ENQUEUE_TENANTS.format(path=str(planned)))
    extra = ("--concurrency", "4", "--batch-size", "4", "-v", "0")
    generation = 0

    def start() -> FaultWorker:
        """A worker, once it is up (its listener connected): a kill lands on a worker
        that works, never on one still starting on a loaded machine."""
        nonlocal generation
        generation += 1
        worker_id = f"fair-seq-{generation}"
        (worker,) = workers(1, ["fq2"], "--worker-id", worker_id, *extra)
        wait_for(
            server,
            "SELECT count(*) FROM pg_stat_activity "
            f"WHERE application_name = 'pgqueue listener {worker_id}'",
            lambda n: n == 1,
            timeout=120,
        )
        return worker

    live = [start() for _ in range(3)]
    started = time.monotonic()
    deadline = started + size(600, 1800)  # a hang guard, not a promise
    kills, max_kills, restarted = 0, size(3, 1_000), False
    next_kill = started + rng.uniform(1.5, 2.5)

    def completed() -> int:
        return server.sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0]

    while (done := completed()) < total:
        assert time.monotonic() < deadline, f"not drained in time: {total - done} left"
        if not restarted and done >= total // 2:
            server.restart("fast")  # every worker's connections die with it
            restarted = True
        if kills < max_kills and time.monotonic() >= next_kill:
            victim = live.pop(rng.randrange(len(live)))
            victim.proc.kill()
            victim.proc.wait(30)
            live.append(start())
            kills += 1
            next_kill = time.monotonic() + rng.uniform(1.5, 2.5)
        time.sleep(0.05)
    drain_s = time.monotonic() - started
    stop_all(live)

    counts = ledger_counts(run=server.sql)
    assert (counts["jobs"], counts["lost"], counts["completed_twice"]) == (total, 0, 0), counts
    assert counts["completed_without_success"] == 0, counts
    faults = sequence_faults(server.sql, "fq2")
    assert faults == {"attempts_at_once": 0, "out_of_order": 0, "runs_at_once": 0}
    # No job of any key had two attempts at once (a kill's lost attempt ends at its sweep).
    (overlaps,) = server.sql(
        """
        SELECT count(*) FROM queue_attempts a JOIN queue_attempts b
          ON a.job_id = b.job_id AND a.id < b.id
         AND b.started_at < coalesce(a.finished_at, 'infinity')
        """
    )[0]
    assert overlaps == 0
    # No key starved: the share of the bulk key's jobs started before each other key's
    # first job started (round-robin claims start every key within the first cycles).
    shares = dict(
        server.sql(
            """
            WITH first_run AS (
                SELECT state.fair_key, min(attempt.started_at) AS at
                FROM queue_attempts AS attempt
                JOIN queue_job_state AS state ON state.job_id = attempt.job_id
                GROUP BY state.fair_key
            )
            SELECT key.fair_key,
                   (SELECT count(DISTINCT attempt.job_id)
                    FROM queue_attempts AS attempt
                    JOIN queue_job_state AS bulk ON bulk.job_id = attempt.job_id
                    WHERE bulk.fair_key = 'bulk' AND attempt.started_at < key.at
                   )::float8 / %s
            FROM first_run AS key
            WHERE key.fair_key <> 'bulk'
            """,
            [bulk],
        )
    )
    assert len(shares) == 2 * tenants
    worst = max(shares.values())
    assert worst < 0.25, shares
    report(
        size=f"{total:,} jobs on a fair queue: 1 bulk key of {bulk:,}, {tenants} sequences of "
        f"{sequence_jobs}, {tenants} keys of {plain_jobs}; 3 processes",
        **outcome(counts),
        run_twice_at_once=overlaps + faults["attempts_at_once"] + faults["runs_at_once"],
        out_of_order=faults["out_of_order"],
        worst_key_start_after_bulk_share=round(worst, 3),
        kills=kills,
        database_restarts=1,
        drain_s=round(drain_s, 1),
        notes="a worker SIGKILLed ~2 s after the last replacement was up, and the server "
        "restarted (fast) half-way; "
        "one job in four asks for 1-2 retries; 'worst key start' is the share of the "
        "bulk key's jobs started before the slowest other key's first job",
    )
