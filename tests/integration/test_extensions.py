"""The seams with a real worker: the core runs with any feature left out, and a
feature of the user's own is told of each job's life, wraps its runs, and has its
periodic service run."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from django_pgqueue import enqueue, enqueue_many, signals
from django_pgqueue.control.api import pause_queue
from django_pgqueue.extensions import (
    Extension,
    JobObserver,
    PeriodicService,
    RunMiddleware,
    WorkerParts,
)
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: Counter[str] = Counter()
LOCK = threading.Lock()

FEATURES = {
    "control": "django_pgqueue.control.extension.QueueControl",
    "schedules": "django_pgqueue.schedules.extension.Schedules",
    "observability": "django_pgqueue.observability.extension.Observability",
}


def seen(point: str, n: int = 1) -> None:
    with LOCK:
        SEEN[point] += n


class Points(JobObserver, RunMiddleware):
    def jobs_claimed(self, items):
        seen("claimed", len(items))

    def jobs_executed(self, items):
        seen("executed", len(items))

    def jobs_ended(self, ends):
        for ended in ends:
            seen(f"ended:{ended.end}")

    def run(self, item, run):
        seen("run")
        return run(item.ctx, item.handler, item.policy)


class Pass(PeriodicService):
    name = "counting pass"

    def __init__(self) -> None:
        self.due = 0.0

    def start(self, session):
        seen("start")

    def next_due(self):
        return self.due

    def run(self, session, now):
        self.due = float("inf")
        seen("pass", session.run("-- name: one\nSELECT 1", {})[0][0])

    def stop(self, session):
        seen("stop")


class Counting(Extension):
    def worker_parts(self, config, view):
        points = Points()
        return WorkerParts(observers=(points,), middleware=(points,), services=(Pass(),))


@pytest.mark.parametrize("left_out", [*FEATURES, "all"])
def test_a_worker_runs_jobs_with_a_feature_left_out(run_worker, settings, left_out):
    kept = [path for name, path in FEATURES.items() if left_out not in (name, "all")]
    settings.PGQUEUE = {**settings.PGQUEUE, "EXTENSIONS": kept}
    started = []
    signals.job_succeeded.connect(lambda **event: started.append(event["job_id"]), weak=False)
    try:
        enqueue_many([("qa.noop", i) for i in range(20)], queue="bare")
        # A keyed job and a paused queue need no extension: the claim is the store's.
        keyed = enqueue("qa.noop", queue="bare", concurrency_key="k")
        pause_queue("held")
        paused = enqueue("qa.noop", queue="held")
        worker = run_worker(["bare", "held"], concurrency=4, burst=True)
        worker.join()
    finally:
        signals.job_succeeded.receivers.clear()
        signals.job_succeeded.sender_receivers_cache.clear()
    assert (
        sql("SELECT count(*) FROM queue_job_state WHERE queue = 'bare' AND status = 'completed'")[
            0
        ][0]
        == 21
    )
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [paused.id]) == [
        ("pending",)
    ]
    assert keyed.id in started  # the core sends the signals, observability or not
    registered = sql("SELECT count(*) FROM queue_workers")[0][0]
    assert registered == (0 if left_out in ("observability", "all") else 1)


def test_an_extension_of_ones_own_is_told_of_each_point(run_worker, settings):
    SEEN.clear()
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "EXTENSIONS": ["tests.integration.test_extensions.Counting"],
    }
    enqueue_many([("qa.noop", i) for i in range(5)], queue="seam")
    enqueue("qa.fail", queue="seam", max_attempts=1)
    worker = run_worker(["seam"], concurrency=2, burst=True)
    worker.join()
    assert SEEN["start"] == 1
    assert SEEN["claimed"] == SEEN["run"] == SEEN["executed"] == 6
    assert SEEN["ended:completed"] == 5
    assert SEEN["ended:dead"] == 1
    assert SEEN["stop"] == 1  # the services' last word
