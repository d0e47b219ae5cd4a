"""Scenario 6: database faults, on a throwaway PostgreSQL this module starts itself.

Nothing here touches the shared server: the `pg_server` fixture (pgserver.py) owns a
cluster in a temporary directory, and the workers are `run_queue_worker` processes
pointed at it. Handlers write the qa ledger on their own connections, so executions
are counted apart from the queue's tables.
"""

from __future__ import annotations

import json
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.reliability.conftest import FULL, ledger_counts, outcome, size
from tests.reliability.pgserver import (  # noqa: F401 (pg_server is a fixture)
    MANAGE,
    TEST_APPLICATION,
    PgServer,
    pg_server,
)

LEASE = 2.0
POLL = 1.0
RECONNECT_MAX_DELAY = 2.0  # PGQUEUE's default cap of the reconnect backoff
WORKER_ARGS = (
    "--lease",
    str(LEASE),
    "--heartbeat-interval",
    "0.5",
    "--sweep-interval",
    "1",
    "--poll-interval",
    str(POLL),
)
# The error inside the parentheses may span lines ("Is the server running on ...").
RETRYING = re.compile(r"database unavailable \(.*?\); retrying in (\d+\.\d+)s", re.DOTALL)


class FaultWorker:
    """`manage.py run_queue_worker` against the throwaway server; output to a file."""

    def __init__(self, server: PgServer, *args: str, user: str = "postgres") -> None:
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in stop)
            mode="w+", prefix="pgqueue-worker-", suffix=".log"
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "run_queue_worker", *args],
            env=server.env(user),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def output(self) -> str:
        return Path(self.log.name).read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, wait; the exit code (SIGKILL and -9 if it does not stop in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def workers(pg_server: PgServer) -> Iterator[Callable[..., list[FaultWorker]]]:  # noqa: F811
    started: list[FaultWorker] = []

    def start(
        count: int, queues: list[str], *extra: str, user: str = "postgres"
    ) -> list[FaultWorker]:
        batch = [
            FaultWorker(pg_server, *queues, *WORKER_ARGS, *extra, user=user) for _ in range(count)
        ]
        started.extend(batch)
        return batch

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(10)
        worker.log.close()


ENQUEUER = """
import json, sys
from django.db import connection, OperationalError, InterfaceError
from django_pgqueue import enqueue_many
for line in sys.stdin:
    jobs, options = json.loads(line)
    for _ in range(2):  # the server may have restarted since the last call
        try:
            enqueue_many([tuple(job) for job in jobs], **options)
            break
        except (OperationalError, InterfaceError):
            connection.close()
    else:
        raise SystemExit("cannot enqueue")
    print("ok", flush=True)
"""


class Enqueuer:
    """One `manage.py shell` that enqueues through the product's enqueue_many on request.

    A process per call would pay Django's start-up every time. Its connection carries
    the test's application_name, so the helpers that kill backends leave it alone.
    """

    def __init__(self, server: PgServer) -> None:
        env = server.env()
        env["DATABASE_URL"] += "?application_name=" + quote(TEST_APPLICATION)
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "shell", "-v", "0", "-c", ENQUEUER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self, queue: str, jobs: list[tuple[str, Any]], **options: Any) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([jobs, {"queue": queue, **options}]) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer.strip() == "ok", f"the enqueuer failed: {answer!r}"

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def enqueuer(pg_server: PgServer) -> Iterator[Enqueuer]:  # noqa: F811
    enq = Enqueuer(pg_server)
    yield enq
    enq.close()


def ledger_jobs(count: int, seconds: float = 0.0, **payload: Any) -> list[tuple[str, Any]]:
    return [("qa.ledger", {"seconds": seconds, **payload})] * count


def job_ids(queue: str) -> str:
    return f"SELECT id FROM queue_jobs WHERE queue = '{queue}'"  # queue names are ours


def completed(server: PgServer, queue: str) -> int:
    return int(
        server.sql(
            "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'completed'",
            [queue],
        )[0][0]
    )


def wait_for(
    server: PgServer, query: str, predicate: Callable[[Any], bool], timeout: float = 60.0
) -> Any:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = server.sql(query)[0][0]
        if predicate(value):
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting on {query!r}; last {value!r}")


def drained(server: PgServer, queue: str, total: int, timeout: float = 120.0) -> None:
    wait_for(
        server,
        f"SELECT count(*) FROM queue_job_state WHERE queue = '{queue}' AND status = 'completed'",
        lambda n: n == total,
        timeout,
    )


def first_claim_after(server: PgServer, queue: str, moment: float) -> float:
    """Unix time of the first attempt of `queue` that started after `moment` (Unix time)."""
    value = server.sql(
        "SELECT extract(epoch FROM min(a.started_at)) FROM queue_attempts a "
        "JOIN queue_jobs j ON j.id = a.job_id "
        "WHERE j.queue = %s AND a.started_at > to_timestamp(%s)",
        [queue, moment],
    )[0][0]
    assert value is not None, f"no claim from {queue} after the fault"
    return float(value)


def check_counts(server: PgServer, queue: str, total: int) -> dict[str, int]:
    """The ledger's and the queue's view of `queue`: nothing lost, nothing done twice."""
    counts = ledger_counts(job_ids(queue), run=server.sql)
    assert counts["jobs"] == total
    assert counts["lost"] == 0, counts
    assert counts["completed_twice"] == 0, counts
    assert counts["completed_without_success"] == 0, counts
    running = server.sql(
        "SELECT count(*) FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id "
        "WHERE j.queue = %s AND a.status = 'running'",
        [queue],
    )[0][0]
    assert running == 0
    return counts


def stop_all(batch: list[FaultWorker]) -> list[str]:
    outputs = []
    for worker in batch:
        code = worker.stop()
        output = worker.output()
        assert code == 0, output[-4000:]
        assert "executor thread crashed" not in output, output
        outputs.append(output)
    return outputs


def probe_handler_connections(server: PgServer, enqueue: Enqueuer, queue: str, jobs: int) -> None:
    """Jobs whose handler queries the database, with one attempt each: every one succeeds.

    A handler thread's Django connection that died with the server must be replaced
    before its next job, not handed to it broken (the job would die for nothing).
    """
    enqueue(queue, [("qa.backend_pid", {})] * jobs, max_attempts=1)
    wait_for(
        server,
        f"SELECT count(*) FROM queue_job_state WHERE queue = '{queue}' "
        "AND status IN ('completed', 'dead')",
        lambda n: n == jobs,
        30,
    )
    errors = server.sql(
        "SELECT a.error_message FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id "
        "WHERE j.queue = %s AND a.status <> 'succeeded'",
        [queue],
    )
    assert errors == [], errors


# -- 6a, 6b: restarts -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_database_restart(mode, pg_server, enqueuer, workers, report):  # noqa: F811
    """6a/6b. Database restart (fast / immediate) with jobs flowing"""
    report(scenario=f"6{'a' if mode == 'fast' else 'b'}. Database restart ({mode})")
    server = pg_server
    queue = f"restart-{mode}"
    total = size(300, 3000)
    down = 1.0
    enqueuer(queue, ledger_jobs(total, 0.01))
    batch = workers(2, [queue, f"{queue}-probe"], "--concurrency", "4", "--batch-size", "10")
    wait_for(
        server,
        f"SELECT count(*) FROM qa_ledger l JOIN ({job_ids(queue)}) j ON j.id = l.job_id",
        lambda n: n >= total // 3,
    )
    done_before = completed(server, queue)
    fault = time.time()
    server.stop(mode)
    time.sleep(down)  # down long enough for every worker to need the backoff
    server.start()
    back = float(server.sql("SELECT extract(epoch FROM pg_postmaster_start_time())")[0][0])
    drained(server, queue, total)
    first = first_claim_after(server, queue, back)
    assert done_before < total, "the queue drained before the fault; nothing was flowing"
    # Claiming again soon after the database is back: a wall-clock promise, asserted at
    # full size (make reliability); in CI, that a claim came after it (first_claim_after)
    # and the queue drained.
    if FULL:
        assert first - back <= 5.0, f"first claim {first - back:.2f}s after it was back"

    # The handler threads' own connections died with the server: an idle restart, then
    # jobs that query the database with a single attempt each.
    server.restart(mode)
    probe_handler_connections(server, enqueuer, f"{queue}-probe", 4 * 2 * 4)

    outputs = stop_all(batch)
    delays = [float(d) for output in outputs for d in RETRYING.findall(output)]
    assert delays, "no worker logged a reconnect attempt\n" + outputs[0][-6000:]
    assert max(delays) <= RECONNECT_MAX_DELAY
    assert len(set(delays)) > 1, f"reconnect delays are not jittered: {delays}"
    counts = check_counts(server, queue, total)
    # Re-runs: handlers in flight at the stop (their own connection died under them), or
    # whose lease ran out while their worker was still reconnecting. 2 x 4 slots.
    assert counts["re_executions"] <= 8, counts
    report(
        size=f"{total} jobs, 2 workers x 4",
        **outcome(counts, "finished_runs_twice"),
        recovery_s=round(first - fault, 2),
        back_to_first_claim_s=round(first - back, 2),
        down_s=round(back - fault, 2),
        completed_before_fault=done_before,
        reconnect_delays=len(delays),
        notes=(
            f"pg_ctl stop -m {mode}, {down:g}s down, start; workers reconnect with "
            "jittered backoff; handlers in flight at the stop fail and are retried"
        ),
    )


# -- 6c: every worker connection terminated ----------------------------------------


def is_worker_connection(name: str) -> bool:
    """Every connection of the workers: the queue's own and the handlers' (Django's)."""
    return True  # the throwaway server has no other clients than the test and the workers


def test_terminate_every_worker_connection(pg_server, enqueuer, workers, report):  # noqa: F811
    """6c. pg_terminate_backend of every worker connection (idle, mid-handler, between jobs)"""
    server = pg_server
    queue = "terminate"
    batch = workers(2, [queue], "--concurrency", "4", "--batch-size", "10")
    recovery: dict[str, float] = {}
    total = 0

    # Idle: nothing to do when the connections go; jobs enqueued after must still run.
    wait_for(
        server,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgqueue worker %'",
        lambda n: n == 2,
    )
    fault = time.time()
    assert len(server.terminate_backends(is_worker_connection)) >= 4
    enqueuer(queue, ledger_jobs(20, 0.01))
    total += 20
    drained(server, queue, total)
    created = float(
        server.sql(
            "SELECT extract(epoch FROM max(created_at)) FROM queue_jobs WHERE queue = %s",
            [queue],
        )[0][0]
    )
    recovery["idle"] = first_claim_after(server, queue, fault) - created
    if FULL:  # a wall-clock promise; in CI, a claim came after the kill and all drained
        assert recovery["idle"] <= 5.0

    # Mid-handler: every slot busy with a handler that no longer needs the database; the
    # worker reconnects, keeps the leases and writes the outcomes: nothing runs twice.
    enqueuer(queue, [("qa.offline", {"seconds": 1.5})] * 8)
    total += 8
    wait_for(
        server,
        f"SELECT count(*) FROM qa_ledger l JOIN ({job_ids(queue)}) j ON j.id = l.job_id",
        lambda n: n == total,
    )
    fault = time.time()
    killed = server.terminate_backends(is_worker_connection)
    assert len(killed) >= 6  # 2 x (dispatcher, heartbeat, listener) and the handlers'
    enqueuer(queue, ledger_jobs(20, 0.01))
    total += 20
    drained(server, queue, total)
    recovery["mid_handler"] = first_claim_after(server, queue, fault) - fault
    mid = ledger_counts(job_ids(queue), run=server.sql)
    assert mid["re_executions"] == 0, mid

    # Between jobs, under load: the connections go at random moments while jobs flow,
    # completions included; writes in doubt are read back, not guessed.
    kills = size(5, 20)
    chunk = size(150, 250)
    rng = random.Random()
    flowing: list[float] = []
    for _ in range(kills):
        enqueuer(queue, ledger_jobs(chunk, 0.05))
        total += chunk
        time.sleep(rng.uniform(0.05, 0.3))
        assert completed(server, queue) < total, "nothing was flowing at the kill"
        fault = time.time()
        server.terminate_backends(is_worker_connection)
        wait_for(
            server,
            "SELECT count(*) FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id "
            f"WHERE j.queue = '{queue}' AND a.started_at > to_timestamp({fault})",
            lambda n: n > 0,
            120,  # a hang guard, not a bound
        )
        flowing.append(first_claim_after(server, queue, fault) - fault)
    drained(server, queue, total)
    assert completed(server, queue) == total
    recovery["between_jobs"] = max(flowing)
    if FULL:  # a wall-clock promise; in CI, every kill was followed by claims (above)
        assert max(recovery.values()) <= 5.0, recovery

    outputs = stop_all(batch)
    counts = check_counts(server, queue, total)
    # Each kill can cost at most the jobs in flight: 2 workers x 4 handler slots.
    assert counts["re_executions"] <= 8 * kills, counts
    landed = sum(o.count("the write in doubt had landed") for o in outputs)
    rewritten = sum(o.count("the write in doubt had not landed") for o in outputs)
    report(
        size=f"{total} jobs, 2 workers x 4; 2 + {kills} kills",
        **outcome(counts, "finished_runs_twice"),
        recovery_s=round(max(recovery.values()), 2),
        recovery_by_moment={name: round(value, 2) for name, value in recovery.items()},
        writes_in_doubt_landed=landed,
        writes_in_doubt_rewritten=rewritten,
        notes=(
            "every backend of the workers (dispatcher, heartbeat, listener, handlers) "
            "terminated while idle, mid-handler (0 re-runs) and at random moments under load"
        ),
    )


# -- 6d: the LISTEN connection alone ---------------------------------------------------

WORKER_ROLE = "qa_worker"


def test_listen_connection_killed(pg_server, enqueuer, workers, report):  # noqa: F811
    """6d. LISTEN connection killed: polling covers, the listener comes back"""
    server = pg_server
    queue = "listen"
    # The workers log in as a role of their own, whose connection limit can keep the
    # killed listeners from coming back for a while (the limit binds no superuser).
    server.sql(
        f"DO $$ BEGIN CREATE ROLE {WORKER_ROLE} LOGIN; "
        "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    server.sql(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {WORKER_ROLE}")
    server.sql(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {WORKER_ROLE}")
    batch = workers(2, [queue], "--concurrency", "2", "--batch-size", "2", user=WORKER_ROLE)
    listening = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgqueue listener %' "
        "AND query = 'LISTEN pgqueue'"
    )
    wait_for(server, listening, lambda n: n == 2)
    # Every handler thread opens its own connection now, while it still can.
    enqueuer(queue, [("qa.sleep", {"seconds": 0.3})] * 8)
    warm = 8
    drained(server, queue, warm)
    own = f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{WORKER_ROLE}'"
    connections = server.sql(own)[0][0]
    others_before = {
        pid for pid, name, _, _ in server.backends() if not name.startswith("pgqueue listener")
    }
    server.sql(f"ALTER ROLE {WORKER_ROLE} CONNECTION LIMIT {connections - 2}")
    try:
        gone = time.time()
        killed = server.terminate_backends(lambda name: name.startswith("pgqueue listener"))
        assert len(killed) == 2
        wait_for(server, listening, lambda n: n == 0)
        during = size(6, 30)
        for _ in range(during):
            enqueuer(queue, ledger_jobs(1))
            time.sleep(random.uniform(0.05, 0.5))
        drained(server, queue, warm + during)
        assert server.sql(listening)[0][0] == 0, "a listener came back while it could not"
    finally:
        server.sql(f"ALTER ROLE {WORKER_ROLE} CONNECTION LIMIT -1")
    gone_s = time.time() - gone
    # Only the listeners went: the dispatchers', heartbeats' and handlers' connections
    # are the same ones.
    others_after = {
        pid for pid, name, _, _ in server.backends() if not name.startswith("pgqueue listener")
    }
    assert others_before <= others_after
    # The listeners come back with the jittered backoff, and NOTIFY wakes workers again.
    lifted = time.monotonic()
    wait_for(server, listening, lambda n: n == 2, 120)  # a hang guard
    if FULL:  # within the backoff's cap (and 5 s to connect): a wall-clock promise
        assert time.monotonic() - lifted <= RECONNECT_MAX_DELAY + 5
    after = 5
    for _ in range(after):
        enqueuer(queue, ledger_jobs(1))
        time.sleep(0.3)
    drained(server, queue, warm + during + after)
    latencies = [
        float(value)
        for (value,) in server.sql(
            "SELECT extract(epoch FROM min(l.started_at) - j.created_at) FROM queue_jobs j "
            "JOIN qa_ledger l ON l.job_id = j.id WHERE j.queue = %s AND j.type = 'qa.ledger' "
            "GROUP BY j.id ORDER BY j.id",
            [queue],
        )
    ]
    assert len(latencies) == during + after
    while_gone, back = latencies[:during], latencies[during:]
    # Found by the poll while gone, woken by NOTIFY again once back (sub-second, well
    # under the 1 s poll): wall-clock promises of the full size. In CI, the listeners
    # are back and listening (the wait above) and every job ran.
    if FULL:
        assert max(while_gone) <= POLL + 1.0, while_gone
        assert max(back) <= POLL + 1.0, back
        assert statistics.median(back) < POLL / 2, back
    outputs = stop_all(batch)
    refused = re.compile(
        r"listener: database unavailable \([^;]*too many connections for role[^;]*\); "
        r"retrying in (\d+\.\d+)s"
    )
    retries = [float(d) for output in outputs for d in refused.findall(output)]
    assert retries, "the listeners did not retry with backoff while refused"
    counts = check_counts(server, queue, warm + during + after)
    report(
        size=f"{during} jobs enqueued while the listeners were gone ({gone_s:.1f}s), {after} after",
        **outcome(counts),
        recovery_s=round(max(while_gone), 2),
        start_latency_while_gone_max_s=round(max(while_gone), 3),
        start_latency_while_gone_median_s=round(statistics.median(while_gone), 3),
        start_latency_after_median_s=round(statistics.median(back), 3),
        poll_interval_s=POLL,
        listener_retries=len(retries),
        notes="only the LISTEN connections terminated and kept from reconnecting; jobs "
        "enqueued meanwhile start within the poll interval, NOTIFY works again after",
    )


# -- 6e: an outage longer than the lease -----------------------------------------------


def test_outage_longer_than_the_lease(pg_server, enqueuer, workers, report):  # noqa: F811
    """6e. Outage longer than the lease: the worker keeps what it holds"""
    server = pg_server
    queue = "outage"
    outages = size(2, 10)
    (worker,) = workers(1, [queue], "--concurrency", "4", "--batch-size", "4")
    total = 0
    for _ in range(outages):
        # Two jobs finish while the database is down, two run across the outage.
        enqueuer(
            queue, [("qa.offline", {"seconds": 0.5})] * 2 + [("qa.offline", {"seconds": 3.5})] * 2
        )
        total += 4
        wait_for(
            server,
            f"SELECT count(*) FROM qa_ledger l JOIN ({job_ids(queue)}) j ON j.id = l.job_id",
            lambda n, total=total: n >= total,
        )
        server.stop("fast")
        time.sleep(LEASE + 1.0)  # every lease it holds runs out meanwhile
        server.start()
        drained(server, queue, total, 60)
    (output,) = stop_all([worker])
    counts = check_counts(server, queue, total)
    # One worker: nobody else sweeps. Whatever it held across the outage is its own to
    # finish; its own sweep must not requeue a job it finished or is still running.
    assert counts["re_executions"] == 0, (counts, output[-4000:])
    report(
        size=f"{outages} outages of {LEASE + 1:g}s (lease {LEASE:g}s), 4 jobs in flight each",
        **outcome(counts),
        notes="jobs that finished or kept running while the database was down complete "
        "once: after reconnecting, the worker writes outcomes and renews leases before "
        "it sweeps",
    )


# -- 6f: a completion whose COMMIT outcome is unknown ------------------------------------

HOLD_TRIGGER = """
CREATE SEQUENCE IF NOT EXISTS qa_fault_once;
CREATE OR REPLACE FUNCTION qa_fault_hold() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    hold text;
BEGIN
    IF NEW.status = 'completed' AND OLD.status = 'running' THEN
        SELECT payload ->> 'hold' INTO hold FROM queue_jobs WHERE id = NEW.job_id;
        IF hold IS NOT NULL THEN
            IF nextval('qa_fault_once') = 1 THEN
                IF hold = 'commit' THEN
                    -- The COMMIT waits for a synchronous standby that never comes: the
                    -- transaction is durable here, the client never hears of it.
                    PERFORM set_config('synchronous_commit', 'on', true);
                ELSE
                    PERFORM pg_sleep(60);  -- killed here, the statement never commits
                END IF;
            END IF;
        END IF;
    END IF;
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS qa_fault_hold ON queue_job_state;
CREATE TRIGGER qa_fault_hold BEFORE UPDATE ON queue_job_state
    FOR EACH ROW EXECUTE FUNCTION qa_fault_hold();
"""


def test_completion_with_unknown_commit_outcome(pg_server, enqueuer, workers, report):  # noqa: F811
    """6f. A completion whose COMMIT outcome is unknown is read back"""
    server = pg_server
    queue = "doubt"
    server.sql(HOLD_TRIGGER)
    # Synchronous replication to a standby that does not exist; every transaction but
    # the held completion commits locally as usual.
    server.sql("ALTER SYSTEM SET synchronous_standby_names = 'qa_ghost'")
    server.sql("ALTER SYSTEM SET synchronous_commit = 'local'")
    server.sql("SELECT pg_reload_conf()")
    try:
        (worker,) = workers(1, [queue], "--concurrency", "1", "--batch-size", "1")
        total = 0
        waits = {"commit": "SyncRep", "abort": "PgSleep"}
        for hold, wait_event in waits.items():
            server.sql("SELECT setval('qa_fault_once', 1, false)")
            enqueuer(queue, ledger_jobs(1, hold=hold) + ledger_jobs(3))
            total += 4
            held = wait_for(
                server,
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pgqueue worker %' "
                f"AND wait_event = '{wait_event}' UNION ALL SELECT NULL LIMIT 1",
                lambda pid: pid is not None,
                20,
            )
            server.sql("SELECT pg_terminate_backend(%s)", [held])
            drained(server, queue, total)
        (output,) = stop_all([worker])
    finally:
        server.sql("ALTER SYSTEM RESET synchronous_standby_names")
        server.sql("ALTER SYSTEM RESET synchronous_commit")
        server.sql("SELECT pg_reload_conf()")
        server.sql("DROP TRIGGER IF EXISTS qa_fault_hold ON queue_job_state")
    assert re.search(r"job \d+: the write in doubt had landed \(succeeded\)", output), output
    assert re.search(r"job \d+: the write in doubt had not landed; writing it again", output)
    counts = check_counts(server, queue, total)
    # Read back, not guessed: neither the landed completion nor the lost one ran again.
    assert counts["re_executions"] == 0, counts
    assert counts["executions"] == total
    report(
        size="2 completions in doubt (one committed, one not) among 8 jobs",
        **outcome(counts),
        notes=(
            "the worker's connection is terminated while its COMMIT waits for a standby "
            "(it landed) and while its UPDATE sleeps in a trigger (it did not); the worker "
            "re-reads the attempt and logs which"
        ),
    )
