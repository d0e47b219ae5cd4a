"""A worker and the Tasks backend on a queue of the second database (`queues2`).

Two real servers: the suite's own (`default`) and the throwaway one of conftest.py
(`queues2`). Every test commits for real (transaction=True), as the rules under test
are about which server's transaction holds a job.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connections
from qa.tasks import add

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.schedules.firing import sync_code_schedules
from django_pgqueue.store.worker import Store
from django_pgqueue.tasks.api import TaskResultStatus
from tests.multidb.conftest import jobs

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])


def test_a_task_round_trips_on_queues2(settings: Any, run_worker: Any) -> None:
    settings.PGQUEUE = {**settings.PGQUEUE, "QUEUE_DATABASES": {"qa-tasks": "queues2"}}
    result = add.enqueue(2, 3)
    assert result.id.startswith("queues2:")
    assert jobs("queues2") == [("qa-tasks", "qa.tasks.add")]
    assert jobs("default") == []
    run_worker(["qa-tasks"], burst=True).join()
    done = add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert done.id == result.id


def test_a_burst_worker_on_a_queues2_queue_completes_its_jobs_there(run_worker: Any) -> None:
    enqueue_many([("qa.echo", n) for n in range(4)], queue="q2.work")
    last = enqueue("qa.echo", {"n": 4}, queue="q2.work")
    enqueue("qa.noop", queue="q2.work", using="default")  # same name, other database
    worker = run_worker(["q2.work"], burst=True)
    worker.join()
    assert worker.worker.config.database == "queues2"
    assert last.wait(timeout=0) == {"n": 4}  # read where the job lives
    with connections["queues2"].cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM queue_job_state GROUP BY status")
        assert cursor.fetchall() == [("completed", 5)]
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM queue_job_state GROUP BY status")
        assert cursor.fetchall() == [("pending", 1)]
        cursor.execute("SELECT count(*) FROM queue_attempts")
        assert cursor.fetchone() == (0,)


def test_a_schedule_of_a_queues2_queue_fires_there(settings: Any, run_worker: Any) -> None:
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "SCHEDULES": {"q2-tick": {"type": "qa.noop", "every": "1s", "queue": "q2.ticks"}},
    }
    worker = run_worker(["q2.ticks"], poll_interval=0.2)
    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while time.monotonic() < deadline and not jobs("queues2"):
        time.sleep(0.1)
    worker.stop()
    assert set(jobs("queues2")) == {("q2.ticks", "qa.noop")}
    with connections["queues2"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM queue_schedule_ticks WHERE schedule = 'q2-tick'")
        assert cursor.fetchone()[0] >= 1
    assert jobs("default") == []


def test_code_schedules_are_synced_only_where_their_queue_lives(settings: Any) -> None:
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "SCHEDULES": {
            "q2-tick": {"type": "qa.noop", "every": "1s", "queue": "q2.ticks"},
            "plain-tick": {"type": "qa.noop", "every": "1s", "queue": "plain"},
        },
    }
    for alias, expected in (("default", ["plain-tick"]), ("queues2", ["q2-tick"])):
        store = Store(alias, "schedule sync test")
        try:
            assert sync_code_schedules(store) == expected
        finally:
            store.close()
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT name FROM queue_schedules ORDER BY name")
            assert cursor.fetchall() == [(name,) for name in expected]
