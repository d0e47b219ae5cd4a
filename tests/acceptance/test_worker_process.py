"""`manage.py run_queue_worker` as real processes: signals, crashes, exit codes."""

from __future__ import annotations

import signal
import time

import pytest

from django_pgqueue import enqueue, enqueue_many
from tests.conftest import database_url, sql

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def wait_for(query: str, predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = sql(query)[0][0]
        if predicate(value):
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting on: {query}")


def test_sigterm_mid_run_loses_nothing_and_leaves_nothing_running(worker_process):
    enqueue_many([("qa.sleep", {"seconds": 0.6}) for _ in range(20)], queue="t")
    worker = worker_process(
        "t", "--concurrency", "3", "--batch-size", "3", "--shutdown-grace", "10"
    )
    wait_for("SELECT count(*) FROM qa_ledger", lambda n: n >= 3)
    started_at_signal = sql("SELECT count(*) FROM qa_ledger")[0][0]
    worker.signal(signal.SIGTERM)
    code, output = worker.wait(30)
    assert code == 0, output
    counts = dict(sql("SELECT status, count(*) FROM queue_job_state GROUP BY status"))
    assert "running" not in counts
    assert sum(counts.values()) == 20
    # Every handler that started before the signal finished; nothing started after it.
    ledger = sql("SELECT count(*), count(finished_at), count(DISTINCT job_id) FROM qa_ledger")[0]
    assert ledger[0] == ledger[1] == ledger[2] == counts.get("completed", 0)
    assert started_at_signal <= ledger[0] <= started_at_signal + 3
    assert sql("SELECT count(*) FROM queue_attempts WHERE status = 'running'")[0][0] == 0
    # What never started went back without spending an attempt.
    assert (
        sql("SELECT count(*) FROM queue_job_state WHERE status = 'pending' AND attempts > 0")[0][0]
        == 0
    )
    assert "SIGTERM: no more claims" in output


def test_sigkill_mid_job_is_recovered_by_another_worker(worker_process):
    job = enqueue("qa.sleep", {"seconds": 2.0}, queue="k")
    victim = worker_process("k", "--lease", "2", "-v", "0")
    wait_for("SELECT count(*) FROM qa_ledger", lambda n: n == 1)
    killed_at = time.monotonic()
    victim.proc.kill()
    victim.proc.wait(10)
    rescuer = worker_process("k", "--lease", "2", "-v", "0")
    wait_for(
        f"SELECT status FROM queue_job_state WHERE job_id = {job.id}",
        lambda status: status == "completed",
        timeout=30,
    )
    recovered_in = time.monotonic() - killed_at
    # lease (2 s) + the job itself (2 s) + sweep interval (10 s default) + slack
    assert recovered_in < 2 + 2 + 10 + 3
    attempts = sql(
        "SELECT status FROM queue_attempts WHERE job_id = %s ORDER BY lease_version", [job.id]
    )
    assert [status for (status,) in attempts] == ["lost", "succeeded"]
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30)[0] == 0


def test_bad_arguments_give_a_clear_error(worker_process):
    code, output = worker_process("bad queue name").wait(30)
    assert code != 0
    assert "not a valid queue name" in output
    code, output = worker_process("a", "--weights", "a=x").wait(30)
    assert code != 0
    assert "QUEUE=WEIGHT" in output


@pytest.fixture
def unmigrated_url():
    """The URL of an empty database on the test server, dropped afterwards."""
    import os

    import psycopg

    url = database_url()
    name = f"pgqueue_unmigrated_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.parametrize("extra", [["--burst"], ["--processes", "2"]])
def test_a_database_never_migrated_is_refused_at_start(worker_process, unmigrated_url, extra):
    """Not an error every half second for ever (nor a --burst worker that never ends):
    the worker says what to run, and exits."""
    worker = worker_process("q", *extra, env={"DATABASE_URL": unmigrated_url})
    code, output = worker.wait(120)
    assert code != 0
    assert "The database 'default' has none of the queue's tables" in output
    assert "run manage.py migrate before starting a worker" in output
    assert "child" not in output  # a supervisor refuses before it starts any
