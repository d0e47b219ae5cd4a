"""Scenario 6: database faults, on a throwaway PostgreSQL this module starts itself.

Nothing here touches the shared server: the `pg_server` fixture (pgserver.py) owns a
cluster in a temporary directory, and the workers are `run_queue_worker` processes
pointed at it. Handlers write the qa ledger on their own connections, so executions
are counted apart from the queue's tables.
"""

from __future__ import annotations

import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.conftest import ledger_counts, size
from tests.reliability.pgserver import MANAGE, PgServer, pg_server  # noqa: F401 (fixture)

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
RETRYING = re.compile(r"database unavailable \(.*?\); retrying in (\d+\.\d+)s")


class FaultWorker:
    """`manage.py run_queue_worker` against the throwaway server; output to a file."""

    def __init__(self, server: PgServer, *args: str) -> None:
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in stop)
            mode="w+", prefix="pgqueue-worker-", suffix=".log"
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "run_queue_worker", *args],
            env=server.env(),
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

    def start(count: int, queues: list[str], *extra: str) -> list[FaultWorker]:
        batch = [FaultWorker(pg_server, *queues, *WORKER_ARGS, *extra) for _ in range(count)]
        started.extend(batch)
        return batch

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(10)
        worker.log.close()


def enqueue(server: PgServer, queue: str, count: int, seconds: float, **options: Any) -> None:
    """Enqueue `count` qa.ledger jobs through the product's enqueue_many, in a subprocess."""
    kwargs = ", ".join(f"{name}={value!r}" for name, value in options.items())
    server.manage(
        "shell",
        "-c",
        "from django_pgqueue import enqueue_many; "
        f"enqueue_many([('qa.ledger', {{'seconds': {seconds}}})] * {count}, "
        f"queue={queue!r}{', ' + kwargs if kwargs else ''})",
    )


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
    # A handler that ran to its end twice is a job done twice, whatever the attempts say.
    assert counts["finished_runs_twice"] == 0, counts
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
        assert "Traceback" not in output or "executor thread crashed" not in output, output
        outputs.append(output)
    return outputs


def probe_handler_connections(server: PgServer, queue: str, jobs: int) -> None:
    """Jobs whose handler queries the database, with one attempt each: every one succeeds.

    A handler thread's Django connection that died with the server must be replaced
    before its next job, not handed to it broken (the job would die for nothing).
    """
    server.manage(
        "shell",
        "-c",
        "from django_pgqueue import enqueue_many; "
        f"enqueue_many([('qa.backend_pid', {{}})] * {jobs}, queue={queue!r}, max_attempts=1)",
    )
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
def test_database_restart(mode, pg_server, workers, report):  # noqa: F811
    """6a/6b. Database restart (fast / immediate) with jobs flowing"""
    server = pg_server
    queue = f"restart-{mode}"
    total = size(300, 3000)
    down = 1.0
    enqueue(server, queue, total, 0.01)
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
    assert first - back <= 5.0, f"first claim {first - back:.2f}s after the database was back"

    # The handler threads' own connections died with the server: an idle restart, then
    # jobs that query the database with a single attempt each.
    server.restart(mode)
    probe_handler_connections(server, f"{queue}-probe", 4 * 2 * 4)

    outputs = stop_all(batch)
    delays = [float(d) for output in outputs for d in RETRYING.findall(output)]
    assert delays, "no worker logged a reconnect attempt"
    assert max(delays) <= RECONNECT_MAX_DELAY
    assert len(set(delays)) > 1, f"reconnect delays are not jittered: {delays}"
    counts = check_counts(server, queue, total)
    report(
        scenario=f"6{'a' if mode == 'fast' else 'b'}. Database restart ({mode})",
        size=f"{total} jobs, 2 workers x 4",
        lost=counts["lost"],
        completed_twice=counts["completed_twice"],
        re_executions=counts["re_executions"],
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


def test_outage_longer_than_the_lease(pg_server, workers, report):  # noqa: F811
    """6e. Outage longer than the lease: the worker keeps what it holds"""
    server = pg_server
    queue = "outage"
    outages = size(3, 10)
    (worker,) = workers(1, [queue], "--concurrency", "4", "--batch-size", "4")
    total = 0
    for _ in range(outages):
        # Two jobs finish while the database is down, two run across the outage.
        server.manage(
            "shell",
            "-c",
            "from django_pgqueue import enqueue_many; "
            "enqueue_many([('qa.offline', {'seconds': 0.5})] * 2 "
            "+ [('qa.offline', {'seconds': 4.5})] * 2, queue='outage')",
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
        lost=counts["lost"],
        completed_twice=counts["completed_twice"],
        re_executions=counts["re_executions"],
        notes="jobs that finished or kept running while the database was down complete "
        "once: after reconnecting, the worker writes outcomes and renews leases before "
        "it sweeps",
    )


# -- 6c: every worker connection terminated ----------------------------------------


def is_worker_connection(name: str) -> bool:
    """Every connection of the workers: the queue's own and the handlers' (Django's)."""
    return True  # the throwaway server has no other clients than the test and the workers


def test_terminate_every_worker_connection(pg_server, workers, report):  # noqa: F811
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
    enqueue(server, queue, 20, 0.01)
    total += 20
    drained(server, queue, total)
    created = float(
        server.sql(
            "SELECT extract(epoch FROM max(created_at)) FROM queue_jobs WHERE queue = %s",
            [queue],
        )[0][0]
    )
    recovery["idle"] = first_claim_after(server, queue, fault) - created
    assert recovery["idle"] <= 5.0

    # Mid-handler: every slot busy with a handler that no longer needs the database; the
    # worker reconnects, keeps the leases and writes the outcomes: nothing runs twice.
    server.manage(
        "shell",
        "-c",
        "from django_pgqueue import enqueue_many; "
        f"enqueue_many([('qa.offline', {{'seconds': 1.5}})] * 8, queue={queue!r})",
    )
    total += 8
    wait_for(
        server,
        f"SELECT count(*) FROM qa_ledger l JOIN ({job_ids(queue)}) j ON j.id = l.job_id",
        lambda n: n == total,
    )
    fault = time.time()
    killed = server.terminate_backends(is_worker_connection)
    assert len(killed) >= 6  # 2 x (dispatcher, heartbeat, listener) and the handlers'
    enqueue(server, queue, 20, 0.01)
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
        enqueue(server, queue, chunk, 0.05)
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
            10,
        )
        flowing.append(first_claim_after(server, queue, fault) - fault)
    drained(server, queue, total)
    assert completed(server, queue) == total
    recovery["between_jobs"] = max(flowing)
    assert max(recovery.values()) <= 5.0, recovery

    outputs = stop_all(batch)
    counts = check_counts(server, queue, total)
    # Each kill can cost at most the jobs in flight: 2 workers x 4 handler slots.
    assert counts["re_executions"] <= 8 * kills, counts
    landed = sum(o.count("the write in doubt had landed") for o in outputs)
    rewritten = sum(o.count("the write in doubt had not landed") for o in outputs)
    report(
        size=f"{total} jobs, 2 workers x 4; 2 + {kills} kills",
        lost=counts["lost"],
        completed_twice=counts["completed_twice"],
        re_executions=counts["re_executions"],
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


def test_listen_connection_killed(pg_server, workers, report):  # noqa: F811
    """6d. LISTEN connection killed: polling covers, the listener comes back"""
    server = pg_server
    queue = "listen"
    batch = workers(2, [queue], "--concurrency", "2", "--batch-size", "2")
    wait_for(
        server,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgqueue %' "
        "AND query = 'LISTEN pgqueue'",
        lambda n: n == 2,
    )
    others_before = {
        pid for pid, name, _, _ in server.backends() if not name.startswith("pgqueue listener")
    }
    # The listener is killed again as soon as it is back, for as long as jobs arrive.
    stop = threading.Event()
    killed: list[int] = []

    def keep_killing() -> None:
        while not stop.is_set():
            killed.extend(server.terminate_backends(lambda n: n.startswith("pgqueue listener")))
            stop.wait(0.02)

    killer = threading.Thread(target=keep_killing, daemon=True)
    killer.start()
    window = size(6, 30)
    try:
        time.sleep(0.3)
        server.manage(
            "shell",
            "-c",
            "import random, time\n"
            "from django_pgqueue import enqueue\n"
            f"for _ in range({window}):\n"
            f"    enqueue('qa.ledger', queue={queue!r})\n"
            "    time.sleep(random.uniform(0.1, 0.6))\n",
        )
    finally:
        stop.set()
        killer.join(10)
    during = window
    drained(server, queue, during, 30)
    # Only the listeners went: the dispatchers' and heartbeats' connections are the same.
    others_after = {
        pid for pid, name, _, _ in server.backends() if not name.startswith("pgqueue listener")
    }
    assert others_before <= others_after
    # The listeners are back, and NOTIFY wakes the workers again.
    wait_for(
        server,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgqueue listener %' "
        "AND query = 'LISTEN pgqueue'",
        lambda n: n == 2,
        10,
    )
    after = 5
    server.manage(
        "shell",
        "-c",
        "import time\n"
        "from django_pgqueue import enqueue\n"
        f"for _ in range({after}):\n"
        f"    enqueue('qa.ledger', queue={queue!r})\n"
        "    time.sleep(0.3)\n",
    )
    drained(server, queue, during + after, 30)
    latencies = [
        float(value)
        for (value,) in server.sql(
            "SELECT extract(epoch FROM min(l.started_at) - j.created_at) FROM queue_jobs j "
            "JOIN qa_ledger l ON l.job_id = j.id WHERE j.queue = %s GROUP BY j.id ORDER BY j.id",
            [queue],
        )
    ]
    assert len(latencies) == during + after
    while_gone, back = latencies[:during], latencies[during:]
    assert max(while_gone) <= POLL + 1.0, while_gone
    assert max(back) <= POLL + 1.0, back
    # Woken by NOTIFY, not found by the next poll.
    assert statistics.median(back) < POLL / 2, back
    stop_all(batch)
    counts = check_counts(server, queue, during + after)
    report(
        size=f"{during} jobs while the listeners were killed every 20 ms, {after} after",
        lost=counts["lost"],
        completed_twice=counts["completed_twice"],
        re_executions=counts["re_executions"],
        recovery_s=round(max(while_gone), 2),
        listener_kills=len(killed),
        start_latency_while_gone_max_s=round(max(while_gone), 3),
        start_latency_after_median_s=round(statistics.median(back), 3),
        poll_interval_s=POLL,
        notes="jobs enqueued while no listener listened start within the poll interval; "
        "only the LISTEN connections were terminated",
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


def test_completion_with_unknown_commit_outcome(pg_server, workers, report):  # noqa: F811
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
            server.manage(
                "shell",
                "-c",
                "from django_pgqueue import enqueue_many; "
                f"enqueue_many([('qa.ledger', {{'hold': {hold!r}}})] "
                f"+ [('qa.ledger', {{}})] * 3, queue={queue!r})",
            )
            total += 4
            held = wait_for(
                server,
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pgqueue worker %' "
                f"AND wait_event = '{wait_event}' UNION ALL SELECT NULL LIMIT 1",
                lambda pid: pid is not None,
                20,
            )
            server.sql("SELECT pg_terminate_backend(%s)", [held])
            drained(server, queue, total, 30)
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
        lost=counts["lost"],
        completed_twice=counts["completed_twice"],
        re_executions=counts["re_executions"],
        notes=(
            "the worker's connection is terminated while its COMMIT waits for a standby "
            "(it landed) and while its UPDATE sleeps in a trigger (it did not); the worker "
            "re-reads the attempt and logs which"
        ),
    )
