"""How many jobs a claim takes from a queue: the free places of the kinds of handler
(threads, the event loop) the queue's claims have brought (`Intake.free`)."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace

import pytest

from django_pgqueue.registry import Registry
from django_pgqueue.worker import WorkerConfig
from django_pgqueue.worker.aio import AsyncPool
from django_pgqueue.worker.inflight import InFlightJobs
from django_pgqueue.worker.intake import Intake


def intake(threads: int = 10, loop: int = 100) -> Intake:
    config = WorkerConfig.build(["q", "r"], concurrency=threads, async_concurrency=loop)
    pool = AsyncPool(loop, threading.Event(), config.worker_id, hooks=None)  # type: ignore[arg-type]
    parts = (None, None, InFlightJobs(), None, None)
    return Intake(config, Registry(), *parts, Counter(), threading.Event(), None, aio=pool)  # type: ignore[arg-type]


def running(intake: Intake, sync: int, on_loop: int) -> None:
    """`sync` jobs on the threads and `on_loop` on the loop, in flight."""
    ids = iter(range(1, sync + on_loop + 1))
    intake.inflight.add_all(
        [SimpleNamespace(ctx=SimpleNamespace(job_id=next(ids))) for _ in range(sync + on_loop)]
    )  # type: ignore[misc]
    intake.aio.in_flight = on_loop  # type: ignore[union-attr]


def test_a_queue_not_claimed_from_yet_is_sized_to_the_free_threads():
    i = intake()
    running(i, sync=4, on_loop=0)
    assert i.free("q") == 6
    assert i.free() == 6  # no queue brought an async handler: the loop does not count


@pytest.mark.parametrize(
    ("kinds", "sync", "on_loop", "free"),
    [
        ({"sync"}, 4, 0, 6),  # the loop has room, but no queue brought async yet
        ({"async"}, 0, 30, 70 + 1),  # the loop's room, and one to find out about sync
        ({"async"}, 10, 30, 70),  # threads full: nothing to find out with
        ({"sync", "async"}, 4, 30, 6 + 70),
        ({"sync", "async"}, 12, 30, -2 + 70),  # two sync jobs wait for a thread
    ],
)
def test_a_queue_counts_the_pools_of_the_kinds_it_brought(kinds, sync, on_loop, free):
    i = intake()
    i.kinds["q"] = set(kinds)
    running(i, sync, on_loop)
    assert i.free("q") == free


def test_a_sync_queue_looks_for_async_handlers_once_the_loop_is_in_use():
    i = intake()
    i.kinds.update({"q": {"sync"}, "r": {"async"}})
    running(i, sync=4, on_loop=30)
    assert i.free("q") == 6 + 1
    running(i, sync=11, on_loop=0)  # a thread job already waits: no more such claims
    assert i.free("q") == 0


def test_the_worker_never_holds_more_than_both_pools():
    i = intake(threads=2, loop=5)
    i.kinds.update({"q": {"sync", "async"}})
    running(i, sync=3, on_loop=4)
    assert i.free("q") == (2 + 5) - (3 + 4)
