"""Queues on both servers (`default` and `queues2`): a worker process per database.

A `Worker` serves one database. `run_queue_worker` given queues on several starts a
supervisor with a worker process per database (or `--processes N` each), each with its
own `--concurrency` and `--async-concurrency`: each database's jobs are claimed, run
and completed on that database, by that database's processes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.testing import run_due_jobs
from django_pgqueue.worker import Worker
from django_pgqueue.worker_config import WorkerConfig

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

HANG_GUARD = 60.0  # seconds; a bound on a hang, never on speed

ROUTED = {"q2.*": "queues2"}


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


def most_at_once(alias: str) -> dict[int, int]:
    """Per worker process (pid): the most ledger executions that overlapped in time."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT a.pid, max(overlap) FROM ("
            "  SELECT l.pid, (SELECT count(*) FROM qa_ledger o WHERE o.pid = l.pid"
            "    AND o.started_at <= l.started_at AND o.finished_at > l.started_at) AS overlap"
            "  FROM qa_ledger l) AS a GROUP BY a.pid"
        )
        return dict(cursor.fetchall())


def environment(queues2_url: str) -> dict[str, str]:
    return {
        "PGQUEUE_TEST_QUEUES2_URL": queues2_url,
        "PGQUEUE_TEST_QUEUE_DATABASES": json.dumps(ROUTED),
    }


def test_the_command_runs_a_worker_process_per_database(
    worker_process: Any, queues2_url: str
) -> None:
    enqueue_many([("qa.echo", {"n": n}) for n in range(5)], queue="q2.work")
    last = enqueue("qa.echo", {"n": 9}, queue="plain")
    proc = worker_process("plain", "q2.work", "--burst", env=environment(queues2_url))
    code, output = proc.wait(HANG_GUARD * 2)
    assert code == 0, output[-3000:]
    assert statuses("queues2") == [("q2.work", "completed", 5)]
    assert statuses("default") == [("plain", "completed", 1)]
    assert last.wait(timeout=0) == {"n": 9}
    # A worker per database, registered there with its queues there.
    [(on_default, queues_default)] = registered("default")
    [(on_queues2, queues_queues2)] = registered("queues2")
    assert (queues_default, queues_queues2) == (["plain"], ["q2.work"])
    assert on_default != on_queues2


def test_each_database_process_keeps_its_own_async_concurrency(
    worker_process: Any, queues2_url: str
) -> None:
    enqueue_many([("qa.asleep", {"seconds": 0.2})] * 4, queue="q2.work")
    enqueue_many([("qa.asleep", {"seconds": 0.2})] * 4, queue="plain")
    proc = worker_process(
        "plain",
        "q2.work",
        "--burst",
        "--concurrency",
        "4",
        "--async-concurrency",
        "1",
        env=environment(queues2_url),
    )
    code, output = proc.wait(HANG_GUARD * 2)
    assert code == 0, output[-3000:]
    assert statuses("queues2") == [("q2.work", "completed", 4)]
    assert statuses("default") == [("plain", "completed", 4)]
    # One process per database, never two async handlers at once in either.
    for alias in ("default", "queues2"):
        per_process = most_at_once(alias)
        assert len(per_process) == 1
        assert list(per_process.values()) == [1]


def test_a_worker_class_serves_one_database_and_says_what_serves_several() -> None:
    assert Worker(["q2.mail", "q2-exact"]).config.database == "queues2"
    with pytest.raises(ConfigurationError) as refused:
        WorkerConfig.build(["q2.mail", "plain", "q2-exact"])
    message = str(refused.value)
    assert "'q2.mail', 'q2-exact' on 'queues2'" in message
    assert "'plain' on 'default'" in message
    assert "run_queue_worker" in message


def test_the_command_checks_the_options_once_for_all_the_queues() -> None:
    with pytest.raises(CommandError, match="weight given for 'other'"):
        call_command("run_queue_worker", "plain", "q2.work", "--weights", "other=2")
    with pytest.raises(CommandError, match="--concurrency"):
        call_command("run_queue_worker", "plain", "q2.work", "--concurrency", "0")
    assert registered("default") == []  # nothing started
    assert registered("queues2") == []


def test_run_due_jobs_runs_every_queue_database() -> None:
    enqueue_many([("qa.noop", None)] * 2, queue="q2.work")
    enqueue("qa.noop", queue="plain")
    counts = run_due_jobs()
    assert counts["claimed"] == 3
    assert statuses("queues2") == [("q2.work", "completed", 2)]
    assert statuses("default") == [("plain", "completed", 1)]


def test_a_supervisor_runs_processes_per_database(worker_process: Any, queues2_url: str) -> None:
    enqueue_many([("qa.ledger", None)] * 20, queue="q2.work")
    enqueue_many([("qa.ledger", None)] * 20, queue="plain")
    proc = worker_process(
        "plain", "q2.work", "--processes", "2", "--burst", env=environment(queues2_url)
    )
    code, output = proc.wait(HANG_GUARD * 2)
    assert code == 0, output[-3000:]
    assert statuses("queues2") == [("q2.work", "completed", 20)]
    assert statuses("default") == [("plain", "completed", 20)]
    # Two processes per database, none of them serving the other database's queues.
    assert sorted(queues for _, queues in registered("default")) == [["plain"], ["plain"]]
    assert sorted(queues for _, queues in registered("queues2")) == [["q2.work"], ["q2.work"]]
