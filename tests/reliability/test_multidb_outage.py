"""Scenario: one of two queue databases goes down; the other's queue keeps working.

Two throwaway servers (pgserver.py; the shared one is never stopped): queue `a.MODE`
lives on server 1 (`default`), queue `b.MODE` on server 2 (the alias `queues2`, routed
with PGQUEUE["QUEUE_DATABASES"]). Either one `run_queue_worker` per database, or one
given both queues (a supervisor with a worker process per database); a producer process
enqueues to both at a steady rate. Server 2 is stopped for a
few seconds and started again.

The qa.ledger handler writes its ledger on the job's own database, so each server's
ledger describes its own jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.conftest import FULL, ledger_counts, size
from tests.reliability.pgserver import MANAGE, PgServer, running_server
from tests.reliability.test_database_faults import WORKER_ARGS

ROUTES = {"b.*": "queues2"}
# The steady rate must sit well under one worker's capacity, so that a's throughput
# measures the worker, not a backlog: the FULL bound below is on a ratio of two windows.
RATE = size(40, 100)  # jobs per second per queue
BEFORE = size(2, 10)  # seconds of load before the stop
DOWN = size(3, 10)  # seconds server 2 stays down
AFTER = size(2, 10)  # seconds of load after the start
# FULL only: a's completions per second while server 2 is down, against the same span
# just before the stop. The two workers are separate processes; what they share is the
# producer (whose enqueues to b fail fast while b is down) and the machine.
MIN_THROUGHPUT_RATIO = 0.7

PRODUCER = """
import json, os, time
from django.db import Error, connections
from django_pgqueue import enqueue_many
rate, stop_file = int(os.environ["MDR_RATE"]), os.environ["MDR_STOP"]
queues = {"a": os.environ["MDR_QUEUE_A"], "b": os.environ["MDR_QUEUE_B"]}
acked = {"a": [], "b": []}
failed = {"a": 0, "b": 0}
tick, batch = 0.1, max(1, rate // 10)
start = time.monotonic()
n = 0
while not os.path.exists(stop_file):
    for key, queue in queues.items():
        try:
            jobs = enqueue_many([("qa.ledger", {"seconds": 0})] * batch, queue=queue)
            acked[key].extend(job.id for job in jobs)
        except Error:  # its server is down: count the refusal, reconnect next time
            failed[key] += 1
            for alias in ("default", "queues2"):
                connections[alias].close()
    n += 1
    time.sleep(max(0.0, start + n * tick - time.monotonic()))
print(json.dumps({"acked": acked, "failed": failed}), flush=True)
"""


class Proc:
    """A manage.py subprocess with both aliases defined; output to a file."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed by the fixture)
            mode="w+", prefix="pgqueue-multidb-", suffix=".log"
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), *args],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def output(self) -> str:
        return Path(self.log.name).read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[PgServer, PgServer]]:
    with running_server() as one, running_server() as two:
        yield one, two


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait(10)
        proc.log.close()


def count(server: PgServer, query: str, params: list[object]) -> int:
    return int(server.sql(query, params)[0][0])


def completions(server: PgServer, queue: str, since: float, until: float) -> int:
    """Attempts of `queue` that succeeded between two Unix times."""
    return count(
        server,
        "SELECT count(*) FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id "
        "WHERE j.queue = %s AND a.status = 'succeeded' "
        "AND a.finished_at >= to_timestamp(%s) AND a.finished_at < to_timestamp(%s)",
        [queue, since, until],
    )


def unfinished(server: PgServer, queue: str) -> int:
    return count(
        server,
        "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status <> 'completed'",
        [queue],
    )


def wait(predicate: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def check(server: PgServer, queue: str, acked: list[int]) -> dict[str, int]:
    """Every acknowledged job exists and, with every other job of `queue`, completed once."""
    ids = {row[0] for row in server.sql("SELECT id FROM queue_jobs WHERE queue = %s", [queue])}
    assert set(acked) <= ids, f"{len(set(acked) - ids)} acknowledged jobs of {queue} missing"
    counts = ledger_counts(f"SELECT id FROM queue_jobs WHERE queue = '{queue}'", run=server.sql)
    assert counts["jobs"] == len(ids)
    assert counts["lost"] == 0, counts
    assert counts["completed_twice"] == 0, counts
    assert counts["completed_without_success"] == 0, counts
    assert counts["executions"] >= counts["jobs"], counts  # the ledger saw every job run
    return counts


# (scenario, pg_ctl stop mode, one run_queue_worker over both databases)
LAYOUTS = [("16a", "fast", False), ("16b", "immediate", False), ("16c", "fast", True)]


@pytest.mark.parametrize(("scenario", "mode", "one_process"), LAYOUTS)
def test_second_database_outage(scenario, mode, one_process, servers, procs, report):
    """16a/16b/16c. Two queue databases, the second stopped (fast / immediate; a
    run_queue_worker per database / one over both, a supervisor with a process each)"""
    layout = (
        "one run_queue_worker over both (a process per database)"
        if one_process
        else "a run_queue_worker per database"
    )
    report(
        scenario=f"{scenario}. Two queue databases, {layout}: the second server stopped "
        f"({mode}) under load, the first's queue keeps working"
    )
    one, two = servers
    queue_a, queue_b = f"a.{scenario}", f"b.{scenario}"
    stop_file = Path(tempfile.mkdtemp(prefix="pgqueue-multidb-")) / "stop"
    env = {
        **os.environ,
        "DATABASE_URL": one.url,
        "PGQUEUE_TEST_QUEUES2_URL": two.url,
        "PGQUEUE_TEST_QUEUE_DATABASES": json.dumps(ROUTES),
        "MDR_RATE": str(RATE),
        "MDR_STOP": str(stop_file),
        "MDR_QUEUE_A": queue_a,
        "MDR_QUEUE_B": queue_b,
    }
    if one_process:  # a supervisor: a child per database, 4 handler threads each
        workers = {
            "both": Proc(
                env,
                "run_queue_worker",
                queue_a,
                queue_b,
                *WORKER_ARGS,
                "--concurrency",
                "4",
                "--worker-id",
                f"multidb-{scenario}",
            )
        }
    else:
        workers = {
            queue: Proc(
                env,
                "run_queue_worker",
                queue,
                *WORKER_ARGS,
                "--concurrency",
                "4",
                "--worker-id",
                f"multidb-{queue}",
            )
            for queue in (queue_a, queue_b)
        }
    procs.extend(workers.values())
    producer = Proc(env, "shell", "-v", "0", "-c", PRODUCER)
    procs.append(producer)

    def done(server: PgServer, queue: str) -> int:
        return completions(server, queue, 0, time.time() + 3600)

    wait(lambda: done(one, queue_a) > 0 and done(two, queue_b) > 0, "both queues to flow")
    time.sleep(BEFORE)
    stop_at = time.time()
    two.stop(mode)
    down_at = time.time()
    time.sleep(DOWN)
    up_at = time.time()
    two.start()
    time.sleep(AFTER)
    stop_file.touch()
    assert producer.proc.wait(60) == 0, producer.output()[-4000:]
    sent = json.loads(producer.output().strip().splitlines()[-1])
    acked = sent["acked"]

    wait(lambda: unfinished(two, queue_b) == 0, f"{queue_b} to drain after the restart")
    wait(lambda: unfinished(one, queue_a) == 0, f"{queue_a} to drain")
    for queue, worker in workers.items():
        code = worker.stop()
        assert code == 0, f"{queue}: exit {code}\n" + worker.output()[-4000:]
        assert "executor thread crashed" not in worker.output()

    window = up_at - down_at
    a_before = completions(one, queue_a, stop_at - window, stop_at)
    a_during = completions(one, queue_a, down_at, up_at)
    b_during = completions(two, queue_b, down_at, up_at)
    b_after = completions(two, queue_b, up_at, time.time() + 3600)
    back = two.sql(
        "SELECT extract(epoch FROM min(a.finished_at)) FROM queue_attempts a "
        "JOIN queue_jobs j ON j.id = a.job_id WHERE j.queue = %s AND a.status = 'succeeded' "
        "AND a.finished_at >= to_timestamp(%s)",
        [queue_b, up_at],
    )[0][0]
    counts_a = check(one, queue_a, acked["a"])
    counts_b = check(two, queue_b, acked["b"])

    assert sent["failed"]["a"] == 0, "enqueues to a failed while only b's server was down"
    assert sent["failed"]["b"] > 0, "no enqueue to b failed: was its server down at all?"
    assert b_during == 0, "b completed jobs while its server was down"
    assert b_after > 0, "b completed nothing after its server came back"
    assert back is not None
    assert a_during > 0, "a's worker completed nothing while b's server was down"
    ratio = a_during / a_before if a_before else 0.0
    if FULL:
        assert ratio >= MIN_THROUGHPUT_RATIO, (a_before, a_during)
    report(
        size=f"{RATE} jobs/s per queue, {len(acked['a'])} + {len(acked['b'])} jobs, "
        + (
            "1 command over both, 1 process x 4 per database"
            if one_process
            else "1 worker x 4 per database"
        ),
        **{
            key: counts_a[key] + counts_b[key]
            for key in ("lost", "completed_twice", "re_executions")
        },
        recovery_s=round(float(back) - stop_at, 2),
        back_to_first_completion_s=round(float(back) - up_at, 2),
        down_s=round(window, 2),
        a_per_s_before=round(a_before / window, 1),
        a_per_s_during=round(a_during / window, 1),
        a_throughput_ratio=round(ratio, 2),
        b_enqueues_refused=sent["failed"]["b"],
        b_completed_after=b_after,
        b_re_executions=counts_b["re_executions"],
        notes=(
            f"queue a on server 1, b on server 2 (QUEUE_DATABASES), {layout}, a producer "
            f"offering {RATE} jobs/s to each (under a worker's capacity); "
            f"pg_ctl stop -m {mode} of server 2, {DOWN}s down, start. a's completions per "
            f"second while 2 is down against the same span before (FULL asserts >= "
            f"{MIN_THROUGHPUT_RATIO:.0%}); b's enqueues are refused while down, its worker "
            "reconnects and every job completes after the start; recovery: stop to b's "
            "first completion"
        ),
    )
    with contextlib.suppress(OSError):
        stop_file.unlink()
