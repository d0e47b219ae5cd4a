"""The children of one supervisor LISTEN one at a time: a NOTIFY wakes one of them.

Workers in real threads of this process, each with its own connections and its own
open file of the turn (a lock belongs to an open file description, so threads exclude
each other as processes do), against the real database. What is counted is the
NOTIFYs each worker's listener received, never a time.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from qa.jobs import RELEASE

from django_pgqueue import enqueue
from django_pgqueue.store.listening import ListeningStore
from django_pgqueue.worker.listen_turn import ListenTurn
from tests.conftest import WorkerThread, sql

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "turns"


def wait_until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached (hang guard)"
        time.sleep(0.02)


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The notifications of QUEUE each listener's connection received (read by the
    listener's thread or by the dispatcher's wait), by its connection's name."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    original = ListeningStore.notified

    def counting(self: ListeningStore) -> list[str]:
        names = original(self)
        if QUEUE in names:
            with lock:
                counts[self.application_name] += names.count(QUEUE)
        return names

    monkeypatch.setattr(ListeningStore, "notified", counting)
    return counts


def status(job_id: int) -> str:
    return sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])[0][0]


def holders(workers: list[WorkerThread]) -> list[int]:
    return [
        i
        for i, w in enumerate(workers)
        if w.worker._listener.turn.held and w.worker._dispatcher.claims.listening
    ]


def start(tmp_path: Path, count: int, **options: Any) -> list[WorkerThread]:
    workers = [
        WorkerThread([QUEUE], listen_turns=str(tmp_path), **options).start() for _ in range(count)
    ]
    wait_until(lambda: len(holders(workers)) == 1)
    return workers


def test_the_turn_is_held_by_one_open_file_at_a_time(tmp_path: Path) -> None:
    stop = threading.Event()
    first, second = (ListenTurn(str(tmp_path), "default", ["a", "b"]) for _ in range(2))
    other_queues = ListenTurn(str(tmp_path), "default", ["a"])
    try:
        assert first.take(lambda: True, stop)
        stop.set()  # a take that has to wait returns at once, not taken
        assert not second.take(lambda: True, stop)
        stop.clear()
        assert other_queues.take(lambda: True, stop)  # another queue set: its own turn
        first.give()
        assert second.take(lambda: True, stop)
        # No room for a job: the turn is not taken, however free it is.
        second.give()
        stop.set()
        assert not first.take(lambda: False, stop)
    finally:
        for turn in (first, second, other_queues):
            turn.close()


def test_one_notify_wakes_one_of_the_idle_workers(tmp_path: Path, heard: Counter[str]) -> None:
    workers = start(tmp_path, 3, concurrency=2)
    try:
        before = sum(heard.values())
        jobs = []
        for i in range(10):  # one at a time: every worker is idle at each NOTIFY
            jobs.append(enqueue("qa.noop", {"n": i}, queue=QUEUE).id)
            wait_until(lambda: status(jobs[-1]) == "completed")
        # Each job's NOTIFY reached exactly one listener: the others did not LISTEN.
        assert sum(heard.values()) - before == len(jobs), dict(heard)
        assert len(heard) == 1, dict(heard)
        assert len(holders(workers)) == 1
    finally:
        for worker in workers:
            worker.stop()


def test_a_worker_without_room_hands_the_turn_to_one_with_room(tmp_path: Path) -> None:
    RELEASE.clear()
    # Alone, the first worker holds the turn and takes the job that fills its one thread.
    workers = start(tmp_path, 1, concurrency=1)
    try:
        busy = enqueue("qa.sleep", {"seconds": 120}, queue=QUEUE).id
        wait_until(lambda: status(busy) == "running")
        # Without room it gives the turn up: the second worker takes it, and runs the
        # next job (the first cannot).
        workers.append(WorkerThread([QUEUE], listen_turns=str(tmp_path), concurrency=1).start())
        wait_until(lambda: holders(workers) == [1])
        second = enqueue("qa.noop", {}, queue=QUEUE).id
        wait_until(lambda: status(second) == "completed")
        # Full while it ran the job, the second gave the turn up too, and takes it back
        # with room (the first, busy, cannot).
        wait_until(lambda: holders(workers) == [1])
        claimed_by = sql("SELECT worker_id FROM queue_attempts WHERE job_id = %s", [second])
        assert claimed_by == [(workers[1].worker.config.worker_id,)]
        # Room again: the first takes the turn back only when the second gives it up.
        RELEASE.set()
        wait_until(lambda: status(busy) == "completed")
        assert holders(workers) == [1]
    finally:
        RELEASE.set()
        for worker in workers:
            worker.stop()
        RELEASE.clear()


def test_a_drained_worker_hands_the_turn_on_and_takes_it_back_when_resumed(
    tmp_path: Path,
) -> None:
    # The first to start holds the turn; the second waits for it.
    workers = start(tmp_path, 1, concurrency=2)
    try:
        workers.append(WorkerThread([QUEUE], listen_turns=str(tmp_path), concurrency=2).start())
        # Drained, the holder claims nothing: the other worker listens and runs the job.
        workers[0].worker.obey("drain")
        wait_until(lambda: holders(workers) == [1])
        job = enqueue("qa.noop", {}, queue=QUEUE).id
        wait_until(lambda: status(job) == "completed")
        claimed_by = sql("SELECT worker_id FROM queue_attempts WHERE job_id = %s", [job])
        assert claimed_by == [(workers[1].worker.config.worker_id,)]
        # Resumed, it may take the turn again once the other gives it up.
        workers[0].worker.obey("resume")
        workers.pop().stop()
        wait_until(lambda: holders(workers) == [0])
    finally:
        for worker in workers:
            worker.stop()


def test_a_stopping_worker_hands_the_turn_on_while_its_handlers_finish(tmp_path: Path) -> None:
    RELEASE.clear()
    workers = start(tmp_path, 1, concurrency=2, shutdown_grace=300)
    try:
        busy = enqueue("qa.sleep", {"seconds": 120}, queue=QUEUE).id
        # Its handler has begun (the ledger's row): a job claimed and not started yet
        # is handed back at the stop, and the worker has nothing to wait for.
        wait_until(
            lambda: sql("SELECT count(*) FROM qa_ledger WHERE job_id = %s", [busy]) == [(1,)]
        )
        workers.append(WorkerThread([QUEUE], listen_turns=str(tmp_path), concurrency=2).start())
        # Stopping, the holder waits for its handler (the grace period) and takes no
        # job: the other worker listens meanwhile and runs the next one.
        workers[0].worker.stop_gracefully()
        wait_until(lambda: holders(workers) == [1])
        job = enqueue("qa.noop", {}, queue=QUEUE).id
        wait_until(lambda: status(job) == "completed")
        assert workers[0].thread.is_alive()  # still in its grace period
    finally:
        RELEASE.set()
        for worker in workers:
            worker.stop()
        RELEASE.clear()
