"""The worker's one invariant, hunted for (docs/reliability.md, scenario 12).

For every job a worker claimed, once its handler has ended (returned, raised anything,
hung past its timeout, or its thread died), the job ends completed, pending, dead or
cancelled with an attempt row saying why; the worker keeps all its handler threads and
keeps claiming; and a job whose handler succeeded is never dead because of a transient
database error.

The harness breaks the worker's writes for real, on a throwaway server: a trigger on
queue_job_state recognises which write a row change belongs to (claim, complete, fail,
renew, release, sweep) and, on planned hits, makes that statement fail with each class
of error PostgreSQL can return: the connection lost before the COMMIT (the backend
terminates itself) or after it (the COMMIT waits for a synchronous standby that does
not exist and the backend is terminated while it waits: durable, never acknowledged),
query cancelled, lock timeout, deadlock, serialization failure, a value out of range, a
check violation. The jobs end every way a handler can end (qa.outcome), and every way
an async handler on the worker's event loop can (qa.aoutcome). Nothing is mocked: the
errors are the server's own, raised inside the worker's statements.

Workflows ride along (chords and chains, some with a step that dies): the same errors
are raised inside the settle step those statements run (pgqueue_settle): when it counts
a finished dependency on a step row ("settle", a trigger on queue_workflow_steps) and
when it makes a waiting step pending or cancelled ("promote"). Every dependent must then
be promoted exactly once, none left waiting, none started before its dependencies
completed, and a step cancelled by a dead dependency never started.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.reliability.conftest import FULL, size
from tests.reliability.pgserver import (  # noqa: F401 (pg_server is a fixture)
    TEST_APPLICATION,
    PgServer,
    pg_server,
)
from tests.reliability.test_database_faults import Enqueuer, FaultWorker
from tests.reliability.test_workflows import PROMOTIONS_AUDIT

LEASE = 2.0
SWEEP = 1.0
TIMEOUT = 1.0
CONCURRENCY = 4
ARGS = (
    "--lease", str(LEASE), "--heartbeat-interval", "0.5", "--sweep-interval", str(SWEEP),
    "--poll-interval", "0.5", "--job-timeout", str(TIMEOUT),
    "--concurrency", str(CONCURRENCY), "--batch-size", str(CONCURRENCY),
)  # fmt: skip

TARGETS = ("claim", "complete", "fail", "renew", "sweep", "release", "settle", "promote")
# The writes of the settle step: each is part of a worker's statement ending a job.
SETTLE_TARGETS = ("settle", "promote")
FAULTS = {
    # action: what the trigger does on a planned hit
    "disconnect": "PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5);",
    "commit_unknown": "PERFORM set_config('synchronous_commit', 'on', true);",
    "query_canceled": "RAISE EXCEPTION 'qa fault' USING ERRCODE = 'query_canceled';",
    "lock_timeout": "RAISE EXCEPTION 'qa fault' USING ERRCODE = 'lock_not_available';",
    "deadlock": "RAISE EXCEPTION 'qa fault' USING ERRCODE = 'deadlock_detected';",
    "serialization": "RAISE EXCEPTION 'qa fault' USING ERRCODE = 'serialization_failure';",
    "out_of_range": "RAISE EXCEPTION 'qa fault' USING ERRCODE = 'datetime_field_overflow';",
    "check_violation": "RAISE EXCEPTION 'qa fault' USING ERRCODE = 'check_violation';",
}
# How each kind of handler ending must leave its job (max_attempts=2 unless "once").
OUTCOMES = {
    "return": "completed",
    "backslash": "completed",
    "once": "completed",  # max_attempts=1: a claim in doubt must not use up its attempt
    "raise": "dead",
    "SystemExit": "dead",
    "KeyboardInterrupt": "dead",
    "GeneratorExit": "dead",
    "base_exception": "dead",
    "recursion": "dead",
    "memory": "dead",
    "hang": "dead",
    "unstorable": "dead",
    "nul": "dead",
    "nested": "dead",  # a payload nested 12,000 deep: json.loads raises RecursionError
    "slow": "completed",  # runs past several heartbeats: renewals to break
    # Async handlers, on the worker's event loop (qa.aoutcome).
    "async_return": "completed",
    "async_slow": "completed",  # awaits past several heartbeats
    "async_raise": "dead",
    "async_permanent": "dead",
    "async_hang": "dead",  # cancelled at its timeout
    "async_swallow": "dead",  # ignores its cancellation: failed without it
    "async_block": "dead",  # blocks the loop past its timeout: the watchdog fails it
}
# Ran in a queue of their own once the rounds settled: a handler blocking the loop
# holds up every async job of the worker, which may then pass its own timeout.
BLOCKING = ("async_block",)
# The payload of each async ending.
ASYNC = {
    "async_return": {"do": "return"},
    "async_slow": {"do": "return", "seconds": TIMEOUT * 0.7},
    "async_raise": {"do": "raise"},
    "async_permanent": {"do": "permanent"},
    "async_hang": {"do": "hang", "seconds": TIMEOUT * 2.5},
    "async_swallow": {"do": "swallow", "seconds": TIMEOUT * 2.5},
    "async_block": {"do": "block", "seconds": TIMEOUT * 1.5},
}

FAULT_TRIGGER = """
CREATE TABLE IF NOT EXISTS qa_fault_plan (
    target text NOT NULL, hit bigint NOT NULL, action text NOT NULL,
    PRIMARY KEY (target, hit)
);
{sequences}
CREATE OR REPLACE FUNCTION qa_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    what text;
    n bigint;
    act text;
BEGIN
    IF current_setting('application_name') NOT LIKE 'pgqueue worker %'
       AND current_setting('application_name') NOT LIKE 'pgqueue heartbeat %' THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'queue_workflow_steps' THEN
        -- pgqueue_settle counting finished dependencies (its cancelled_by note is not)
        what := CASE WHEN NEW.waiting_for < OLD.waiting_for THEN 'settle' END;
    ELSE
        what := CASE
            WHEN OLD.status = 'waiting' THEN 'promote'
            WHEN OLD.status = 'pending' AND NEW.status = 'running' THEN 'claim'
            WHEN OLD.status = 'running' AND NEW.status = 'completed' THEN 'complete'
            WHEN OLD.status = 'running' AND NEW.status = 'running' THEN 'renew'
            WHEN OLD.status = 'running' AND NEW.lease_version > OLD.lease_version THEN 'sweep'
            WHEN OLD.status = 'running' AND NEW.attempts < OLD.attempts THEN 'release'
            WHEN OLD.status = 'running' THEN 'fail'
        END;
    END IF;
    IF what IS NULL THEN
        RETURN NEW;
    END IF;
    n := nextval('qa_fault_hits_' || what);
    SELECT action INTO act FROM qa_fault_plan WHERE target = what AND hit = n;
    IF act IS NOT NULL THEN
        -- A sequence: the count survives the rollback the fault causes.
        PERFORM nextval('qa_fault_fired_' || what);
    END IF;
    {cases}
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS qa_fault ON queue_job_state;
CREATE TRIGGER qa_fault BEFORE UPDATE ON queue_job_state
    FOR EACH ROW EXECUTE FUNCTION qa_fault();
DROP TRIGGER IF EXISTS qa_fault ON queue_workflow_steps;
CREATE TRIGGER qa_fault BEFORE UPDATE ON queue_workflow_steps
    FOR EACH ROW EXECUTE FUNCTION qa_fault();
"""


def install_faults(server: PgServer) -> None:
    sequences = "\n".join(
        f"CREATE SEQUENCE IF NOT EXISTS qa_fault_{count}_{target};"
        for target in TARGETS
        for count in ("hits", "fired")
    )
    cases = "\n    ".join(
        f"{'IF' if i == 0 else 'ELSIF'} act = '{name}' THEN {body}"
        for i, (name, body) in enumerate(FAULTS.items())
    )
    server.sql(FAULT_TRIGGER.format(sequences=sequences, cases=cases + "\n    END IF;"))
    server.sql(PROMOTIONS_AUDIT)
    # Every COMMIT is local, except one that a fault sends to a standby that never comes.
    server.sql("ALTER SYSTEM SET synchronous_standby_names = 'qa_ghost'")
    server.sql("ALTER SYSTEM SET synchronous_commit = 'local'")
    server.sql("SELECT pg_reload_conf()")


def plan(server: PgServer, rng: random.Random, spacing: int) -> dict[str, int]:
    """Plan every fault once on every target, spread over its next hits (counted from
    the hits seen so far: a round's plan lies ahead of it); how many per target."""
    server.sql("TRUNCATE qa_fault_plan")
    seen = hits(server)
    planned = {}
    for target in TARGETS:
        faults = list(FAULTS)
        rng.shuffle(faults)
        # Sweeps and releases are rare: their faults come first, on consecutive hits.
        # A settle step's faults two hits apart: the write a fault refused, written
        # again, is the next hit, never faulted twice in a row.
        step = {"sweep": 1, "release": 1, "settle": 2, "promote": 2}.get(target, spacing)
        for i, fault in enumerate(faults):
            server.sql(
                "INSERT INTO qa_fault_plan VALUES (%s, %s, %s)",
                [target, seen[target] + 2 + i * step, fault],
            )
        planned[target] = len(faults)
    return planned


def _counts(server: PgServer, count: str) -> dict[str, int]:
    return {
        target: int(
            server.sql(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END "
                f"FROM qa_fault_{count}_{target}"
            )[0][0]
        )
        for target in TARGETS
    }


def hits(server: PgServer) -> dict[str, int]:
    """How many row changes of each write the trigger saw (planned faults fired on these)."""
    return _counts(server, "hits")


def fired(server: PgServer) -> dict[str, int]:
    """How many planned faults the trigger raised on each write."""
    return _counts(server, "fired")


class Terminator:
    """Terminates every backend whose COMMIT waits for the ghost standby: a COMMIT that
    landed but whose answer never reaches the worker."""

    def __init__(self, server: PgServer) -> None:
        self.server = server
        self.stop = threading.Event()
        self.terminated = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with self.server.connect() as conn:
            while not self.stop.wait(0.02):
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE wait_event = 'SyncRep'"
                ).fetchall()
                self.terminated += len(rows)

    def __enter__(self) -> Terminator:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def fault_server(pg_server: PgServer) -> Iterator[PgServer]:  # noqa: F811
    install_faults(pg_server)
    try:
        yield pg_server
    finally:
        pg_server.sql("DROP TRIGGER IF EXISTS qa_fault ON queue_job_state")
        pg_server.sql("DROP TRIGGER IF EXISTS qa_fault ON queue_workflow_steps")
        pg_server.sql("DROP TRIGGER IF EXISTS qa_promoted ON queue_job_state")
        pg_server.sql("ALTER SYSTEM RESET synchronous_standby_names")
        pg_server.sql("ALTER SYSTEM RESET synchronous_commit")
        pg_server.sql("SELECT pg_reload_conf()")


def enqueue_outcomes(server: PgServer, enqueue: Enqueuer, queue: str, each: int) -> None:
    for kind in OUTCOMES:
        if kind == "nested":
            continue
        if kind in BLOCKING:
            continue
        if kind in ASYNC:
            enqueue(queue, [("qa.aoutcome", {**ASYNC[kind], "kind": kind})] * each)
            continue
        payload: dict[str, Any] = {"do": "return" if kind == "once" else kind}
        if kind == "hang":
            # Past its timeout, not by as much again: a worker whose every thread is
            # stuck that long exits for its supervisor to restart (this one has none),
            # and at full size four hang jobs fill its four threads.
            payload["seconds"] = TIMEOUT * 1.5
        if kind == "slow":
            payload = {"do": "hang", "seconds": TIMEOUT * 0.7}
        options = {"max_attempts": 1} if kind == "once" else {}
        # The kind rides in the idempotency key, so the check can tell the jobs apart.
        jobs = [("qa.outcome", {**payload, "kind": kind})] * each
        enqueue(queue, jobs, **options)
    # jsonb takes nesting that Python's json.loads cannot: written past enqueue's checks.
    enqueue(queue, [("qa.outcome", {"do": "nested", "kind": "nested"})] * each, delay=3600)
    server.sql(
        "UPDATE queue_jobs SET payload = (repeat('[', 12000) || repeat(']', 12000))::jsonb "
        "WHERE queue = %s AND payload ->> 'kind' = 'nested'",
        [queue],
    )
    server.sql(
        "UPDATE queue_job_state SET run_at = now() WHERE queue = %s AND run_at > now()", [queue]
    )
    server.sql("SELECT pg_notify('pgqueue', %s)", [queue])


def settled(server: PgServer, queue: str) -> bool:
    (busy,) = server.sql(
        "SELECT count(*) FROM queue_job_state WHERE queue = %s "
        "AND (status = 'running' OR (status = 'pending' AND run_at <= now() + interval '5 s'))",
        [queue],
    )[0]
    return busy == 0


class NotSettled(AssertionError):
    """Jobs still running or due long after their handlers could have ended."""


def wait_settled(server: PgServer, queue: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if settled(server, queue):
            return time.monotonic() - started
        time.sleep(0.2)
    rows = server.sql(
        "SELECT s.job_id, j.payload ->> 'kind', s.status, s.attempts, s.locked_until, s.last_error "
        "FROM queue_job_state s JOIN queue_jobs j ON j.id = s.job_id "
        "WHERE s.queue = %s AND s.status IN ('running', 'pending') ORDER BY s.job_id LIMIT 20",
        [queue],
    )
    raise NotSettled(f"jobs not settled after {timeout}s: {rows}")


def invariant_breaks(server: PgServer, queue: str) -> list[str]:
    """Every way the jobs of `queue` break the invariant, as readable lines."""
    breaks = []
    rows = server.sql(
        """
        SELECT s.job_id, CASE WHEN j.payload ? 'kind' THEN j.payload ->> 'kind'
                              ELSE 'nested' END, s.status, s.last_error,
               (SELECT count(*) FROM queue_attempts a WHERE a.job_id = s.job_id),
               (SELECT count(*) FROM queue_attempts a WHERE a.job_id = s.job_id
                  AND (a.status = 'running' OR a.finished_at IS NULL)),
               (SELECT count(*) FROM queue_attempts a WHERE a.job_id = s.job_id
                  AND a.status IN ('failed', 'lost') AND a.error_class IS NULL)
        FROM queue_job_state s JOIN queue_jobs j ON j.id = s.job_id
        WHERE s.queue = %s
        """,
        [queue],
    )
    for job_id, kind, status, last_error, attempts, open_attempts, unexplained in rows:
        expected = OUTCOMES[kind]
        if status != expected:
            breaks.append(f"job {job_id} ({kind}): {status}, expected {expected}: {last_error}")
        if attempts == 0:
            breaks.append(f"job {job_id} ({kind}): no attempt row")
        if open_attempts:
            breaks.append(f"job {job_id} ({kind}): {open_attempts} attempt(s) never closed")
        if unexplained:
            breaks.append(f"job {job_id} ({kind}): a failed attempt without an error class")
    return breaks


# -- workflows: the settle step under the same faults -----------------------------------

FLOWS = """
import json
from django_pgqueue import chain, chord, group, step
def s(payload):
    return step("qa.outcome", payload, queue=QUEUE)
for shape, *parts in json.loads(SPEC):
    if shape == "chord":
        members, callback = parts
        chord(group(*(s(p) for p in members)), s(callback)).enqueue()
    else:
        chain(*(s(p) for p in parts[0])).enqueue()
"""


def flow_step(do: str, expect: str) -> dict[str, Any]:
    """A qa.outcome payload for a workflow step, carrying the status it must end with."""
    payload: dict[str, Any] = {"do": do, "kind": "flow", "expect": expect}
    if do == "slow":  # runs past several heartbeats: renewals to break
        payload.update(do="hang", seconds=TIMEOUT * 0.7)
    return payload


def enqueue_workflows(
    server: PgServer, rng: random.Random, queue: str, chords: int, members: int, chains: int
) -> int:
    """Chords and chains of 5 in `queue`, some with a step that dies; how many jobs."""
    spec: list[list[Any]] = []
    for i in range(chords):
        dies = i == 0  # one chord whose member dies: its callback is cancelled
        group = [flow_step("slow" if m == 0 else "return", "completed") for m in range(members)]
        if dies:
            group[-1] = flow_step("raise", "dead")
        spec.append(["chord", group, flow_step("return", "cancelled" if dies else "completed")])
    for i in range(chains):
        dies_at = rng.randrange(4) if i % 2 else 5  # every other chain dies at a step
        steps = [
            flow_step(
                "return" if k < dies_at else "raise" if k == dies_at else "return",
                "completed" if k < dies_at else "dead" if k == dies_at else "cancelled",
            )
            for k in range(5)
        ]
        spec.append(["chain", steps])
    code = f"QUEUE = {queue!r}\nSPEC = {json.dumps(spec)!r}\n{FLOWS}"
    server.manage("shell", "-v", "0", "-c", code)
    return chords * (members + 1) + chains * 5


def workflow_breaks(server: PgServer, queue: str) -> list[str]:
    """Every way the workflow jobs of `queue` break the invariant, as readable lines."""
    breaks = []
    rows = server.sql(
        """
        SELECT s.job_id, j.payload ->> 'expect', s.status, s.last_error,
               (SELECT count(*) FROM queue_attempts a WHERE a.job_id = s.job_id),
               (SELECT count(*) FROM queue_attempts a WHERE a.job_id = s.job_id
                  AND a.status = 'succeeded'),
               (SELECT count(*) FROM queue_attempts a WHERE a.job_id = s.job_id
                  AND (a.status = 'running' OR a.finished_at IS NULL)),
               (SELECT count(*) FROM qa_promotions p WHERE p.job_id = s.job_id),
               (SELECT count(*) FROM queue_job_deps d WHERE d.job_id = s.job_id),
               (SELECT count(*) FROM queue_job_deps d
                  JOIN queue_job_state ps ON ps.job_id = d.depends_on
                  WHERE d.job_id = s.job_id AND ps.status IN ('dead', 'cancelled')),
               step.waiting_for, step.failed,
               -- dependencies this step started (claimed, or its handler ran) before
               (SELECT count(*) FROM queue_job_deps d
                  JOIN queue_attempts pa ON pa.job_id = d.depends_on AND pa.status = 'succeeded'
                  WHERE d.job_id = s.job_id AND (
                      EXISTS (SELECT FROM queue_attempts ca WHERE ca.job_id = d.job_id
                                AND ca.started_at < pa.finished_at)
                      OR EXISTS (SELECT FROM qa_ledger l WHERE l.job_id = d.job_id
                                   AND l.started_at < pa.finished_at)))
        FROM queue_job_state s JOIN queue_jobs j ON j.id = s.job_id
        LEFT JOIN queue_workflow_steps step ON step.job_id = s.job_id
        WHERE s.queue = %s
        """,
        [queue],
    )
    for row in rows:
        job_id, expected, status, last_error, attempts, succeeded, open_attempts = row[:7]
        promotions, deps, deps_failed, waiting_for, failed, early = row[7:]
        what = f"step {job_id} ({deps} dependencies)"
        if status != expected:
            breaks.append(f"{what}: {status}, expected {expected}: {last_error}")
        if status == "waiting":
            breaks.append(f"{what}: left waiting, its dependencies all ended")
        if status == "completed" and succeeded != 1:
            breaks.append(f"{what}: {succeeded} succeeded attempts (fired twice or never)")
        if status == "cancelled" and attempts:
            breaks.append(f"{what}: cancelled by a dead dependency, yet started {attempts}x")
        if status != "cancelled" and attempts == 0:
            breaks.append(f"{what}: no attempt row")
        if open_attempts:
            breaks.append(f"{what}: {open_attempts} attempt(s) never closed")
        if promotions != (1 if deps else 0):
            breaks.append(f"{what}: moved out of waiting {promotions} times")
        if (waiting_for, failed) != (0, deps_failed):
            breaks.append(
                f"{what}: counters waiting_for={waiting_for} failed={failed}, "
                f"expected 0 and {deps_failed}: a dependency counted twice or never"
            )
        if early:
            breaks.append(f"{what}: started before {early} of its dependencies completed")
    return breaks


# The probe's jobs run under the job timeout (a probe job that times out proves
# nothing), long enough that one missing thread would delay a start by PROBE_SECONDS.
PROBE_SECONDS = TIMEOUT * 0.8


def probe_concurrency(server: PgServer, enqueue: Enqueuer, queue: str) -> tuple[float, float]:
    """CONCURRENCY jobs of PROBE_SECONDS: all must run at once on live threads. Their
    start spread, and how long they all ran together (the earliest end minus the latest
    start; not above zero when one ran only after another ended: a thread was missing)."""
    enqueue(queue, [("qa.ledger", {"seconds": PROBE_SECONDS})] * CONCURRENCY)
    deadline = time.monotonic() + 120  # a hang guard: a loaded machine is slow, not stuck
    while time.monotonic() < deadline:
        (done,) = server.sql(
            "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'completed'",
            [queue],
        )[0]
        if done == CONCURRENCY:
            break
        time.sleep(0.1)
    (spread, together) = server.sql(
        "SELECT extract(epoch FROM max(l.started_at) - min(l.started_at)), "
        "extract(epoch FROM min(l.finished_at) - max(l.started_at)) FROM qa_ledger l "
        "JOIN queue_jobs j ON j.id = l.job_id WHERE j.queue = %s",
        [queue],
    )[0]
    assert done == CONCURRENCY, f"the probe jobs did not all complete ({done}/{CONCURRENCY})"
    return float(spread), float(together)


def expire_leases(server: PgServer, queue: str, jobs: int) -> None:
    """Claim `jobs` jobs for a worker that never finishes them: the sweep's work."""
    enqueue_sql = (
        "WITH j AS (INSERT INTO queue_jobs (queue, type, payload, created_at) "
        'SELECT %(queue)s, \'qa.outcome\', \'{"do": "return", "kind": "return"}\', now() '
        "FROM generate_series(1, %(n)s) RETURNING id, queue) "
        "INSERT INTO queue_job_state (job_id, queue, status, priority, run_at, attempts, "
        "max_attempts, lease_version, locked_by, locked_until, updated_at) "
        "SELECT id, queue, 'running', 0, now(), 1, 2, 1, 'ghost', now() - interval '1 s', now() "
        "FROM j"
    )
    server.sql(enqueue_sql, {"queue": queue, "n": jobs})
    server.sql(
        "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status, "
        "started_at) SELECT job_id, 1, 1, 'ghost', 'running', now() FROM queue_job_state "
        "WHERE queue = %s",
        [queue],
    )


def test_invariant_under_injected_faults(fault_server, report):
    """12. The invariant under injected faults"""
    server = fault_server
    rng = random.Random(20261130)
    rounds = size(1, 3)
    each = size(3, 8)
    enqueue = Enqueuer(server)
    chords, members, chains = size(2, 4), size(5, 8), size(8, 14)
    summary: dict[str, Any] = {"faults": 0, "jobs": 0, "workflow_jobs": 0}
    planned_total = dict.fromkeys(TARGETS, 0)
    queues = [f"inv{r}" for r in range(rounds)]
    flows = [f"flow{r}" for r in range(rounds)]
    worker = FaultWorker(server, *queues, *flows, "blocked", "probe", "swept", *ARGS)
    try:
        with Terminator(server) as terminator:
            expire_leases(server, "swept", 12)
            for r in range(rounds):
                queue = f"inv{r}"
                planned = plan(server, rng, spacing=3 if not FULL else rng.randint(2, 5))
                before = fired(server)
                summary["faults"] += sum(planned.values())
                for target, count in planned.items():
                    planned_total[target] += count
                enqueue_outcomes(server, enqueue, queue, each)
                summary["workflow_jobs"] += enqueue_workflows(
                    server, rng, flows[r], chords, members, chains
                )
                summary["jobs"] += each * len(OUTCOMES)
                summary[f"round {r} settled_s"] = round(wait_settled(server, queue, 120), 1)
                wait_settled(server, flows[r], 120)
                # Every settle fault of this round's plan fired within the round.
                now_fired = fired(server)
                summary[f"round {r} settle faults"] = {
                    target: now_fired[target] - before[target] for target in SETTLE_TARGETS
                }
            wait_settled(server, "swept", 120)
            for kind in BLOCKING:
                enqueue("blocked", [("qa.aoutcome", {**ASYNC[kind], "kind": kind})] * each)
            summary["blocked settled_s"] = round(wait_settled(server, "blocked", 120), 1)
            spread, together = probe_concurrency(server, enqueue, "probe")
        summary["in_doubt_commits"] = terminator.terminated
        summary["hits"] = hits(server)
        summary["fired"] = fired(server)
        assert worker.proc.poll() is None, worker.output()[-4000:]
        breaks = [line for q in [*queues, "blocked"] for line in invariant_breaks(server, q)]
        breaks += [line for q in flows for line in workflow_breaks(server, q)]
        promotions = server.sql("SELECT count(*) FROM qa_promotions")[0][0]
        stuck = server.sql(
            "SELECT count(*) FROM queue_job_state WHERE queue = 'swept' AND status = 'running'"
        )[0][0]
        code = worker.stop()
        output = worker.output()
    except NotSettled as exc:
        raise AssertionError(f"{exc}\n--- worker output ---\n{worker.output()[-6000:]}") from None
    finally:
        enqueue.close()
        if worker.proc.poll() is None:
            worker.proc.kill()
        worker.log.close()
    report(
        size=f"{summary['jobs']} jobs ({len(OUTCOMES)} endings) + {summary['workflow_jobs']} "
        f"workflow steps x {summary['faults']} faults "
        f"({len(FAULTS)} classes on {len(TARGETS)} writes)",
        invariant_breaks=len(breaks),
        faults_fired=sum(summary["fired"].values()),
        settle_faults_fired=sum(summary["fired"][target] for target in SETTLE_TARGETS),
        promotions=promotions,
        notes=f"{summary}; probe start spread {spread:.2f}s, ran together {together:.2f}s",
    )
    assert breaks == [], "\n".join(breaks[:40])
    # The settle step's faults were raised, every one planned: none was a plan that
    # never met its hit.
    for target in SETTLE_TARGETS:
        assert summary["fired"][target] == planned_total[target], summary
    assert promotions > 0
    assert stuck == 0
    # All CONCURRENCY probe jobs ran at once: every handler thread is alive. With one
    # missing, a probe job starts only once another ended.
    assert together > 0, (spread, together)
    if FULL:  # and promptly, a promise of the full size (a loaded CI machine can lag)
        assert spread < PROBE_SECONDS / 2, spread
    assert code == 0, output[-4000:]
    tail = output.split("stopped:")[-1]
    at = tail.find("Traceback")  # the message shows the traceback, not the log's end
    assert at == -1, tail[max(0, at - 2000) : at + 4000]
