"""One worker process over queues on both servers (`default` and `queues2`).

`worker_for` (and run_queue_worker) runs a `Worker` per database in one process,
sharing the handler slots: each database's jobs are claimed, run and completed on that
database, at most `concurrency` handlers run at once in all, and an idle database's
slots go to the other.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

import django_pgqueue
from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.context import JobContext
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.testing import run_due_jobs
from django_pgqueue.worker import SeveralDatabases, Worker, worker_for
from django_pgqueue.worker_config import WorkerConfig

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

HANG_GUARD = 60.0  # seconds; a bound on a hang, never on speed

# Handlers that run together: every one waits at the barrier for `pair` others.
_running = 0
_most = 0
_gauge = threading.Lock()
_pair = threading.Barrier(2, timeout=HANG_GUARD)


@django_pgqueue.handler("onew.gauge")
def gauge(ctx: JobContext) -> str:
    """Count the handlers running at once in this process; wait for a partner."""
    global _running, _most
    with _gauge:
        _running += 1
        _most = max(_most, _running)
    try:
        _pair.wait()  # broken (and the job failed) unless two run at once
    finally:
        with _gauge:
            _running -= 1
    return ctx.database or "default"


def statuses(alias: str) -> list[tuple[str, str, int]]:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT queue, status, count(*) FROM queue_job_state GROUP BY 1, 2 ORDER BY 1, 2"
        )
        return list(cursor.fetchall())


def registered(alias: str) -> list[tuple[str, list[str]]]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT id, queues FROM queue_workers")
        return [(ident, json.loads(queues)) for ident, queues in cursor.fetchall()]


def test_one_worker_runs_each_database_queues_there(run_worker: Any) -> None:
    enqueue_many([("qa.echo", {"n": n}) for n in range(5)], queue="q2.work")
    last = enqueue("qa.echo", {"n": 9}, queue="plain")
    thread = run_worker(["plain", "q2.work"], burst=True, concurrency=3)
    thread.join(HANG_GUARD)
    worker = thread.worker
    assert isinstance(worker, SeveralDatabases)
    assert worker.databases == ["default", "queues2"]
    assert worker.exit_code == 0
    assert statuses("queues2") == [("q2.work", "completed", 5)]
    assert statuses("default") == [("plain", "completed", 1)]
    assert last.wait(timeout=0) == {"n": 9}
    # One worker, registered with each database it serves (its queues there), one id.
    assert registered("default") == [(worker.worker_id, ["plain"])]
    assert registered("queues2") == [(worker.worker_id, ["q2.work"])]
    assert worker.stats["claimed"] == 6


def test_the_handler_slots_are_shared_between_the_databases(run_worker: Any) -> None:
    global _most
    _most = 0
    _pair.reset()
    # Only queues2 has work: both slots go to it (the barrier needs two at once).
    enqueue_many([("onew.gauge", None)] * 4, queue="q2.work")
    run_worker(["plain", "q2.work"], burst=True, concurrency=2).join(HANG_GUARD)
    assert statuses("queues2") == [("q2.work", "completed", 4)]
    assert _most == 2
    # Both have work: never more than `concurrency` handlers at once, in all.
    _most = 0
    enqueue_many([("onew.gauge", None)] * 6, queue="plain")
    enqueue_many([("onew.gauge", None)] * 6, queue="q2.work")
    run_worker(["plain", "q2.work"], burst=True, concurrency=2).join(HANG_GUARD)
    assert statuses("default") == [("plain", "completed", 6)]
    assert statuses("queues2") == [("q2.work", "completed", 10)]
    assert _most == 2


def test_the_command_runs_one_worker_over_both(settings: Any) -> None:
    enqueue_many([("qa.noop", None)] * 3, queue="q2-exact")
    enqueue_many([("qa.noop", None)] * 2, queue="plain")
    call_command("run_queue_worker", "q2-exact", "plain", "--burst", "--poll-interval", "0.1")
    assert statuses("queues2") == [("q2-exact", "completed", 3)]
    assert statuses("default") == [("plain", "completed", 2)]


def test_a_worker_class_serves_one_database_and_says_what_serves_several() -> None:
    assert isinstance(worker_for(["q2.mail", "q2-exact"]), Worker)
    with pytest.raises(ConfigurationError) as refused:
        WorkerConfig.build(["q2.mail", "plain", "q2-exact"])
    message = str(refused.value)
    assert "'q2.mail', 'q2-exact' on 'queues2'" in message
    assert "'plain' on 'default'" in message
    assert "worker_for()" in message


def test_options_are_checked_once_for_all_the_queues() -> None:
    with pytest.raises(ConfigurationError, match="Weight given for 'other'"):
        worker_for(["plain", "q2.work"], weights={"other": 2})
    worker = worker_for(["plain", "q2.work"], weights={"q2.work": 3}, concurrency=8)
    assert isinstance(worker, SeveralDatabases)
    assert [part.config.weights for part in worker.parts] == [{}, {"q2.work": 3}]
    assert [seat.share for seat in worker.slots._seats.values()] == [2, 6]
    assert len({part.worker_id for part in worker.parts}) == 1


def test_run_due_jobs_runs_every_queue_database() -> None:
    enqueue_many([("qa.noop", None)] * 2, queue="q2.work")
    enqueue("qa.noop", queue="plain")
    counts = run_due_jobs()
    assert counts["claimed"] == 3
    assert statuses("queues2") == [("q2.work", "completed", 2)]
    assert statuses("default") == [("plain", "completed", 1)]


def test_a_supervisor_runs_children_over_both_databases(
    worker_process: Any, queues2_url: str
) -> None:
    enqueue_many([("qa.noop", None)] * 20, queue="q2.work")
    enqueue_many([("qa.noop", None)] * 20, queue="plain")
    env = {
        "PGQUEUE_TEST_QUEUES2_URL": queues2_url,
        "PGQUEUE_TEST_QUEUE_DATABASES": json.dumps({"q2.*": "queues2"}),
    }
    proc = worker_process("plain", "q2.work", "--processes", "2", "--burst", env=env)
    code, output = proc.wait(HANG_GUARD * 2)
    assert code == 0, output[-3000:]
    assert statuses("queues2") == [("q2.work", "completed", 20)]
    assert statuses("default") == [("plain", "completed", 20)]
