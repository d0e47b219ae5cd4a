"""The extension seam with a real worker: the core runs without any feature, and a
feature of the user's own is called at each point of a job's life."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.extensions import Extension, WorkerHooks
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: Counter[str] = Counter()
LOCK = threading.Lock()


def seen(point: str, n: int = 1) -> None:
    with LOCK:
        SEEN[point] += n


class Points(WorkerHooks):
    def __init__(self) -> None:
        self.passes = 0

    def starting(self):
        seen("starting")

    def claimed(self, items):
        seen("claimed", len(items))

    def completed(self, done):
        seen("completed", len(done))

    def failed(self, item, failure, status, run_at):
        seen(f"failed:{status}")

    def run_attempt(self, item, run):
        seen("run_attempt")
        return run(item.ctx, item.handler, item.policy)

    def executed(self, items):
        seen("executed", len(items))

    def stopped(self, store):
        seen("stopped")

    def next_pass(self):
        return 0.0 if self.passes == 0 else float("inf")

    def periodic(self, now):
        self.passes += 1
        seen("periodic")


class Counting(Extension):
    def worker_hooks(self, config, store):
        return Points()


def test_a_worker_runs_the_core_with_no_feature_installed(run_worker, settings):
    settings.PGQUEUE = {"EXTENSIONS": []}
    enqueue_many([("qa.noop", i) for i in range(50)], queue="bare")
    worker = run_worker(["bare"], concurrency=4, burst=True)
    worker.join()
    assert worker.worker.hooks.parts == ()
    assert sql("SELECT status, count(*) FROM queue_job_state GROUP BY status") == [
        ("completed", 50)
    ]
    # Observability is a feature: without it, no worker registry row is written.
    assert sql("SELECT count(*) FROM queue_workers")[0][0] == 0


def test_an_extension_of_ones_own_is_called_at_each_point(run_worker, settings):
    SEEN.clear()
    settings.PGQUEUE = {"EXTENSIONS": ["tests.integration.test_extensions.Counting"]}
    enqueue_many([("qa.noop", i) for i in range(5)], queue="seam")
    enqueue("qa.fail", queue="seam", max_attempts=1)
    worker = run_worker(["seam"], concurrency=2, burst=True)
    worker.join()
    assert SEEN["starting"] == 1
    assert SEEN["periodic"] == 1
    assert SEEN["claimed"] == SEEN["run_attempt"] == SEEN["executed"] == 6
    assert SEEN["completed"] == 5
    assert SEEN["failed:dead"] == 1
    assert SEEN["stopped"] == 1  # the heartbeat's last word
