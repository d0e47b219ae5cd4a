"""How many jobs a claim takes from a queue: the free slots of the kinds of handler
(threads, the event loop) the queue's claims have brought (`Capacity.claim_size`),
counted from the jobs in flight until their handlers ended."""

from __future__ import annotations

import itertools

import pytest

from django_pgqueue.claimed import ClaimedJob
from django_pgqueue.retry import FixedDelay
from django_pgqueue.store.worker import ClaimedRow
from django_pgqueue.worker.capacity import Capacity

ids = itertools.count(1)


def job(queue: str, kind: str) -> ClaimedJob:
    job_id = next(ids)
    row = ClaimedRow(job_id, queue, "t", "{}", 0, 1, 1, 1, job_id, None, None, None)
    item = ClaimedJob.claimed(row, None, FixedDelay(1), None, "w", 1e12)
    item.kind = kind
    return item


def table(threads: int = 10, loop: int = 100, *, async_handlers: bool = True) -> Capacity:
    return Capacity(threads, loop, async_handlers=async_handlers)


def running(inflight: Capacity, queue: str, sync: int, on_loop: int) -> list:
    items = [job(queue, "sync") for _ in range(sync)] + [
        job(queue, "async") for _ in range(on_loop)
    ]
    inflight.add_all(items)  # type: ignore[arg-type]
    return items


def test_a_queue_not_claimed_from_yet_without_async_handlers_takes_the_free_threads():
    inflight = table(async_handlers=False)
    running(inflight, "other", sync=4, on_loop=0)
    assert inflight.claim_size("q", 100) == 6


def test_a_queue_not_claimed_from_yet_takes_what_both_pools_have_free():
    inflight = table(threads=10, loop=3)
    assert inflight.claim_size("q", 100) == 3
    running(inflight, "other", sync=10, on_loop=0)  # threads full, the loop unused
    assert inflight.claim_size("q", 100) == 0
    inflight.drop_all(running(inflight, "r", sync=0, on_loop=1))  # the loop in use
    assert inflight.claim_size("q", 100) == 1  # one, to find out
    running(inflight, "other", sync=0, on_loop=3)  # both full
    assert inflight.claim_size("q", 100) == 0


@pytest.mark.parametrize(
    ("kinds", "sync", "on_loop", "size"),
    [
        (["sync"], 4, 0, 6),  # the loop is not in use: no async handler to look for
        (["sync"], 12, 0, 0),  # two sync jobs wait for a thread: nothing more
        (["async"], 0, 30, 70 + 1),  # the loop's room, and one to find out about sync
        (["async"], 10, 30, 70),  # threads full: nothing to find out with
        (["sync", "async"], 4, 30, 6 + 70),
        (["sync", "async"], 12, 30, 70),  # two sync jobs wait for a thread
    ],
)
def test_a_queue_counts_the_pools_of_the_kinds_it_brought(kinds, sync, on_loop, size):
    inflight = table()
    for kind in kinds:  # what earlier claims of q brought, ended since
        inflight.drop_all(running(inflight, "q", kind == "sync", kind == "async"))
    running(inflight, "other", sync, on_loop)
    assert inflight.claim_size("q", 1000) == size


def test_a_sync_queue_looks_for_async_handlers_once_the_loop_is_in_use():
    inflight = table()
    inflight.drop_all(running(inflight, "q", sync=1, on_loop=0))
    running(inflight, "r", sync=4, on_loop=30)
    assert inflight.claim_size("q", 100) == 6 + 1
    running(inflight, "r", sync=7, on_loop=0)  # a thread job already waits: no probe
    assert inflight.claim_size("q", 100) == 0


def test_a_sync_queue_never_looks_for_async_handlers_when_none_is_registered():
    inflight = table(async_handlers=False)
    inflight.drop_all(running(inflight, "q", sync=1, on_loop=0))
    assert inflight.claim_size("q", 100) == 10


def test_the_claim_is_at_most_the_batch():
    assert table().claim_size("q", 4) == 4


def test_a_job_counts_until_it_is_dropped_whatever_it_did_meanwhile():
    inflight = table(threads=2, loop=1)
    items = running(inflight, "q", sync=2, on_loop=1)
    assert (inflight.free("sync"), inflight.free("async")) == (0, 0)
    inflight.drop(items[0])
    inflight.drop(items[0])  # dropped once: counted once
    assert (inflight.free("sync"), inflight.free("async")) == (1, 0)
    assert len(inflight) == 2


def test_there_is_room_for_a_claim_while_a_thread_or_a_used_loop_has_a_slot():
    inflight = table(threads=1, loop=2)
    assert inflight.room()
    running(inflight, "q", sync=1, on_loop=0)
    assert not inflight.room()  # the loop is not in use: it gives no room yet
    running(inflight, "r", sync=0, on_loop=1)
    assert inflight.room()
