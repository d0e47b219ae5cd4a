"""Scenario 17: durable runs of 5 steps under SIGKILLs, a SIGSTOP past the lease and a
database restart, on a throwaway PostgreSQL this module starts itself.

Each run (`qa.durable_five`): an atomic step, a durable sleep, a step, a wait for its
event, an atomic step. Each atomic step writes an effect unique per (run, step); each
step's function counts its call on its own autocommit statement, so re-executions are
read apart from the queue's tables. The events come from another process (a
`manage.py shell` emitter), in three groups of runs:

- *sent*: emitted at a random moment of the drain (before the run's wait, racing it,
  or while it is parked); the wait's timeout is longer than the scenario, so each of
  these events must reach its run: one missing is an event lost;
- *racing the timeout*: emitted when the emitter sees the run parked, at its wait's
  timeout give or take a little: the emit or the timeout wins, once;
- *never sent*: the wait times out.

A random worker is SIGKILLed every few seconds; once, the database is restarted
mid-run; once, a worker holding running attempts is SIGSTOPped until the sweep has
taken them all (`Freeze`, as in scenario 14), then SIGCONTed: its late checkpoints are
refused and its atomic steps' writes roll back with them.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from urllib.parse import quote

from tests.reliability.conftest import FULL, size
from tests.reliability.pgserver import (  # noqa: F401 (pg_server is a fixture)
    MANAGE,
    TEST_APPLICATION,
    PgServer,
    pg_server,
)
from tests.reliability.test_database_faults import check_counts
from tests.reliability.test_workflows import RestartThenFreeze, Slots

Q = "durable"
LEASE = 2.0
TIMEOUT = 2.0  # the wait of a run whose event races the timeout or is never sent
NEVER = 3600.0  # the wait of a run whose event is sent: it must come before this
OPTIONS = (
    "--lease", str(LEASE),
    "--heartbeat-interval", "0.5",
    "--sweep-interval", "1",
    "--concurrency", "4",
    "--batch-size", "4",
    "--poll-interval", "0.5",
)  # fmt: skip

ENQUEUE = """
import json
from django_pgqueue import enqueue_many
runs = json.load(open(PLAN))
for start in range(0, len(runs), 2000):
    enqueue_many([("qa.durable_five", run) for run in runs[start:start + 2000]], queue=QUEUE)
"""

# The emitter: another process, on its own connection, through the product's
# emit_event. It survives the database restart (an emit whose commit was not
# acknowledged is sent again: the first emit of a key wins, a repeat changes nothing).
EMITTER = """
import json, sys, time
from django.db import InterfaceError, OperationalError, connection
from django_pgqueue import emit_event
plan = json.load(open(PLAN))
at_moments = sorted((at, key) for key, kind, at in plan if kind == "at")
racing = {key: jitter for key, kind, jitter in plan if kind == "timeout"}
due = {}  # racing key -> monotonic moment of its emit (its wait's timeout + jitter)
started = time.monotonic()
last_look = 0.0
def query(sql, params):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
def emit(key):
    while True:
        try:
            emit_event(key, {"key": key})
            return
        except (OperationalError, InterfaceError):
            connection.close()
            time.sleep(0.1)
while at_moments or racing:
    try:
        now = time.monotonic()
        while at_moments and at_moments[0][0] <= now - started:
            emit(at_moments.pop(0)[1])
        if racing and now - last_look > 0.1:
            last_look = now
            waiting = [key for key in racing if key not in due]
            for key, left in query(
                "SELECT key, extract(epoch FROM timeout_at - clock_timestamp())::float8 "
                "FROM queue_event_waits WHERE key = ANY(%s)", [waiting]
            ):
                due[key] = now + left + racing[key]
            # A wait that timed out before the emitter saw it parked: its emit comes late.
            for (name,) in query(
                "SELECT name FROM queue_job_steps WHERE kind = 'event' AND name = ANY(%s)",
                [["event:" + key for key in waiting]],
            ):
                due.setdefault(name.removeprefix("event:"), now)
        for key, moment in list(due.items()):
            if moment <= now:
                emit(key)
                del due[key], racing[key]
    except (OperationalError, InterfaceError):
        connection.close()
    time.sleep(0.02)
print("done", flush=True)
"""


def shell(server: PgServer, code: str, plan: object, **params: str) -> subprocess.Popen[str]:
    """`manage.py shell -c CODE` against the server, PLAN the path of `plan` as JSON; its
    connection carries the test's application_name (the freeze's helpers ignore it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        json.dump(plan, out)
    lines = [f"PLAN = {out.name!r}", *(f"{name} = {value!r}" for name, value in params.items())]
    env = server.env()
    env["DATABASE_URL"] += "?application_name=" + quote(TEST_APPLICATION)
    return subprocess.Popen(
        [sys.executable, str(MANAGE), "shell", "-v", "0", "-c", "\n".join([*lines, code])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def claiming_for(server: PgServer, worker_id: str) -> float:
    """Seconds since the worker's first claim (0 before it claimed)."""
    return float(
        server.sql(
            "SELECT coalesce(extract(epoch FROM now() - min(started_at)), 0)::float8 "
            "FROM queue_attempts WHERE worker_id = %s",
            [worker_id],
        )[0][0]
    )


def completed(server: PgServer) -> int:
    return int(
        server.sql(
            "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'completed'", [Q]
        )[0][0]
    )


def test_durable_runs_under_sigkills_a_sigstop_and_a_restart(pg_server, report):  # noqa: F811
    """17. Durable runs of 5 steps under SIGKILL, a SIGSTOP past the lease and a database restart"""
    server = pg_server
    rng = random.Random()
    # Enough runs in CI that workers still hold running attempts after the restart,
    # when a worker is frozen (most of a run's time is spent parked).
    runs = size(240, 10_000)
    workers_count = 3
    # The sent events are spread over about the drain, so some come before their run's
    # wait, some race it, some find the run parked.
    spread = size(30, 600)
    groups = {"sent": [], "racing": [], "never": []}
    plan = []
    emits = []
    for i in range(runs):
        key = f"run-{i}"
        group = rng.choice(("sent", "sent", "racing", "never"))
        groups[group].append(key)
        # Its plain step works a little: running attempts for the freeze to catch, on a
        # machine fast enough to finish the runs' other steps in no time.
        plan.append({"key": key, "timeout": NEVER if group == "sent" else TIMEOUT, "work": 0.2})
        if group == "sent":
            emits.append((key, "at", rng.uniform(0.0, spread)))
        elif group == "racing":
            emits.append((key, "timeout", rng.uniform(-0.3, 0.3)))
    enqueuer = shell(server, ENQUEUE, plan, QUEUE=Q)
    out, _ = enqueuer.communicate(timeout=600)
    assert enqueuer.returncode == 0, out
    jobs = dict(server.sql("SELECT payload ->> 'key', id FROM queue_jobs WHERE queue = %s", [Q]))
    assert len(jobs) == runs

    workers = Slots(server, Q, OPTIONS, workers_count)
    emitter = shell(server, EMITTER, emits)
    faults = RestartThenFreeze(server, workers, rng, restart_at=runs // 20)
    kills = 0
    try:
        started = time.monotonic()
        deadline = started + size(300, 3600)
        next_kill = started + rng.uniform(0.5, 1.5)
        while True:
            done = completed(server)
            if done == runs and faults.over:
                break
            assert time.monotonic() < deadline, f"not drained in time ({done}/{runs})"
            assert done < runs or faults.frozen is not None, "the runs finished before the SIGSTOP"
            faults.turn(done, lambda: completed(server))
            if time.monotonic() >= next_kill and done < runs:
                # A worker that has been claiming for a while: on a loaded machine a
                # fresh one may take longer to boot than the kills' interval.
                busy = [
                    slot
                    for slot in range(workers_count)
                    if slot != faults.spared and claiming_for(server, workers.slots[slot][0]) >= 4.0
                ]
                if busy:
                    workers.kill(rng.choice(busy))
                    kills += 1
                    next_kill = time.monotonic() + rng.uniform(2.0, 5.0)
            time.sleep(0.1)
        drain_s = time.monotonic() - started
        frozen, restart = faults.frozen, faults.restart
        assert frozen is not None
        emitted, _ = emitter.communicate(timeout=120)
        assert emitter.returncode == 0, emitted
        workers.stop()
        _, late = frozen.refusals()
    finally:
        if emitter.poll() is None:
            emitter.kill()
        workers.close()

    # 0 runs lost, none completed twice.
    counts = check_counts(server, Q, runs)
    assert kills >= 1
    assert restart["done_before"] < runs
    assert frozen.held
    one = server.sql  # every check below is one statement on the scenario's server

    # Each atomic effect exactly once: the unique (run, step) key makes a second one an
    # IntegrityError, which no attempt met; none is missing; each committed with its
    # checkpoint, under the same lease.
    [(effects, effect_runs)] = one("SELECT count(*), count(DISTINCT job_id) FROM qa_durable_effect")
    assert (effects, effect_runs) == (2 * runs, runs)
    duplicates = one(
        "SELECT count(*) FROM queue_attempts WHERE error_class LIKE '%%IntegrityError%%'"
    )[0][0]
    assert duplicates == 0
    unfenced = one(
        "SELECT count(*) FROM qa_durable_effect AS e LEFT JOIN queue_job_steps AS s "
        "ON s.job_id = e.job_id AND s.name = e.step AND s.kind = 'atomic' "
        "WHERE s.lease_version IS DISTINCT FROM e.lease_version"
    )[0][0]
    assert unfenced == 0
    # No sleep woken early: every call of the step after the sleep came at or after
    # its wake-up, on the database's clock.
    early = one(
        "SELECT count(*) FROM qa_durable_call AS c JOIN queue_job_steps AS s "
        "ON s.job_id = c.job_id AND s.name = 'nap' "
        "WHERE c.step = 'after-nap' AND c.called_at < (s.result ->> 'wake_at')::timestamptz"
    )[0][0]
    assert early == 0
    # Each wait decided once (its checkpoint, keyed by (run, step)), as the handler saw
    # it (jsonb comes back decoded on this connection).
    decided = {
        key: (stored, version, result)
        for key, stored, version, result in one(
            "SELECT j.payload ->> 'key', s.result, s.lease_version, a.result "
            "FROM queue_jobs AS j "
            "JOIN queue_job_steps AS s ON s.job_id = j.id AND s.kind = 'event' "
            "JOIN queue_attempts AS a ON a.job_id = j.id AND a.status = 'succeeded' "
            "WHERE j.queue = %s",
            [Q],
        )
    }
    assert len(decided) == runs
    outcomes = {"delivered before the park": 0, "delivered to a parked run": 0, "timed out": 0}
    racing_won = {"emit": 0, "timeout": 0}
    for group, keys in groups.items():
        for key in keys:
            stored, version, result = decided[key]
            if stored == {"timed_out": True}:
                # A sent event never loses to a timeout it could not reach.
                assert group != "sent", key
                assert result == "timed out"
                outcomes["timed out"] += 1
            else:
                assert group != "never", key
                assert stored == {"payload": {"key": key}}, key
                assert result == {"key": key}, key
                outcomes[
                    "delivered to a parked run" if version is None else "delivered before the park"
                ] += 1
            if group == "racing":
                racing_won["timeout" if stored == {"timed_out": True} else "emit"] += 1
    events = one("SELECT count(*) FROM queue_events")[0][0]
    assert events == len(groups["sent"]) + len(groups["racing"])
    assert one("SELECT count(*) FROM queue_event_waits") == [(0,)]
    # Re-executions of the non-atomic step (at-least-once): counted, reported.
    re_executions = one("SELECT count(*) - count(DISTINCT (job_id, step)) FROM qa_durable_call")[0][
        0
    ]
    report(
        size=f"{runs:,} runs of 5 steps, {workers_count} processes x 4 threads",
        lost=counts["lost"],
        completed_twice=counts["completed_twice"],
        re_executions=re_executions,
        recovery_s=round(
            float(
                one(
                    "SELECT extract(epoch FROM min(finished_at)) FROM queue_attempts "
                    "WHERE status = 'succeeded' AND finished_at > to_timestamp(%s)",
                    [restart["back"]],
                )[0][0]
            )
            - restart["at"],
            2,
        ),
        atomic_effects=effects,
        atomic_effects_twice_or_missing=abs(effects - 2 * runs) + duplicates,
        sleeps_woken_early=early,
        events_sent=events,
        events_lost=0,
        events_delivered_twice=0,
        waits=outcomes,
        racing_the_timeout_won_by=racing_won,
        kills=kills,
        completed_before_restart=restart["done_before"],
        frozen_attempts_swept=len(frozen.held),
        frozen_for_s=round(frozen.resumed - frozen.at, 1),
        frozen_late_writes_refused=len(late),
        freezes_given_up=faults.retried,
        drain_s=round(drain_s, 1),
        notes="a random worker (one claiming for 4 s or more) SIGKILLed every 2-5 s (lease "
        f"{LEASE:g} s, sweep 1 s); one "
        "database restart (pg_ctl stop -m fast, start) mid-run; one worker SIGSTOPped "
        "until the sweep took every attempt it held, then SIGCONTed; events emitted by "
        "another process: half the runs' at random moments of about the drain (their wait's "
        f"timeout {NEVER:g} s: each must arrive), a quarter at their wait's {TIMEOUT:g} s "
        "timeout +-0.3 s (the emit or the timeout wins, once), a quarter never (timed "
        "out). 0 atomic effects twice or missing (a unique (run, step) key; each effect "
        "with its checkpoint's lease), 0 sleeps woken early, each wait decided once as "
        "the handler saw it; re-executions are of the non-atomic step; recovery: restart "
        "to the first completion after it" + ("" if FULL else " (reduced size)"),
    )
