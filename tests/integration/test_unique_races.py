"""Unique keys under races: real connections, each enqueue in its own transaction.

64 enqueues of one key per scenario, in three waves: 32 at once while nothing holds
the key, 16 while the first job runs, 16 after it completed; half of each wave roll
back after enqueuing. The database decides every race, so the jobs that exist are
exactly what the key's hold and policy say, and no enqueue fails but a refusal.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connections, transaction

from django_pgqueue import EnqueuedJob, Unique, UniqueConflict, enqueue
from django_pgqueue.models import Job, JobState
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

HANG_GUARD = 120  # seconds a wave may take before the test calls it hung


class RolledBack(Exception):
    """Raised inside an enqueuer's transaction to roll it back."""


@dataclass
class Wave:
    """What the enqueuers of one wave got: committed results, refusals, other errors."""

    committed: list[EnqueuedJob] = field(default_factory=list)
    refused: list[UniqueConflict] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ids(self) -> set[int]:
        return {job.id for job in self.committed}


def wave(size: int, enqueue_one: Callable[[int], EnqueuedJob]) -> Wave:
    """Run `size` enqueuers at once, each on its own connection; the odd ones roll back."""
    barrier = threading.Barrier(size)
    result = Wave()

    def enqueuer(n: int) -> None:
        try:
            barrier.wait(timeout=HANG_GUARD)
            with transaction.atomic():
                job = enqueue_one(n)
                # Hold the transaction open a moment, so that others wait on it.
                time.sleep(random.uniform(0, 0.02))
                if n % 2:
                    raise RolledBack
            with result.lock:
                result.committed.append(job)
        except RolledBack:
            pass
        except UniqueConflict as exc:
            with result.lock:
                result.refused.append(exc)
        except BaseException as exc:  # every other error fails the test
            with result.lock:
                result.errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueuer, args=(n,)) for n in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD)
        assert not thread.is_alive(), "an enqueuer hung"
    assert not result.errors, result.errors
    return result


def jobs_of(queue: str) -> list[tuple[int, str, Any]]:
    """(id, status, payload) of every job of `queue`, oldest first."""
    return [
        (job.id, job.state.status, job.payload)
        for job in Job.objects.filter(queue=queue).select_related("state").order_by("id")
    ]


def run_first(stores: Any, queue: str) -> tuple[int, int, int]:
    """Claim the queue's job (it runs); return what completing it needs."""
    (row,) = stores("uniq-claimer").claim(queue, 10, "uniq-worker", 60.0)
    return row.job_id, row.lease_version, row.attempt_id


def complete(stores: Any, claimed: tuple[int, int, int]) -> None:
    job_id, lease_version, attempt_id = claimed
    assert stores("uniq-completer").complete([(job_id, lease_version, attempt_id, None)]) == {
        job_id
    }


def scenario(stores: Any, queue: str, unique: Unique) -> tuple[Wave, Wave, Wave, int]:
    """The three waves; returns them and the first job's id."""

    def enqueue_one(n: int) -> EnqueuedJob:
        return enqueue("qa.noop", {"n": n}, queue=queue, unique=unique)

    before = wave(32, enqueue_one)
    (first,) = jobs_of(queue)
    claimed = run_first(stores, queue)
    assert claimed[0] == first[0]
    running = wave(16, enqueue_one)
    complete(stores, claimed)
    completed = wave(16, enqueue_one)
    return before, running, completed, first[0]


@pytest.mark.parametrize(
    "unique",
    [
        Unique("k", hold="active"),
        Unique("k", hold="until_completed"),
        Unique("k", hold=dt.timedelta(minutes=10)),
        Unique.cancel_newest("k"),  # the same rule under Hatchet's name
    ],
    ids=["active", "until_completed", "period", "cancel_newest"],
)
def test_a_held_key_returns_its_holder_until_its_hold_ends(stores, unique):
    queue = "uq-return"
    hold = unique.hold
    before, running, completed, first = scenario(stores, queue, unique)
    # While nothing held it: one job, which every committed enqueue got.
    assert before.ids() == {first}
    assert not before.refused
    # While it runs, it holds the key under every one of these holds.
    assert running.ids() == {first}
    assert not any(job.created for job in running.committed)
    jobs = jobs_of(queue)
    if isinstance(hold, dt.timedelta):
        # A period holds past the job's completion.
        assert completed.ids() == {first}
        assert [job_id for job_id, *_ in jobs] == [first]
    else:
        # Completed, it holds the key no more: one new job.
        (second,) = completed.ids()
        assert second != first
        assert [(job_id, status) for job_id, status, _ in jobs] == [
            (first, "completed"),
            (second, "pending"),
        ]


def test_a_pending_hold_lets_a_new_job_in_once_the_holder_runs(stores):
    queue = "uq-pending"
    before, running, completed, first = scenario(stores, queue, Unique("k", hold="pending"))
    assert before.ids() == {first}
    # Running, the first job holds nothing: one new job, which the later wave returns.
    (second,) = running.ids()
    assert second != first
    assert completed.ids() == {second}
    assert [(job_id, status) for job_id, status, _ in jobs_of(queue)] == [
        (first, "completed"),
        (second, "pending"),
    ]


@pytest.mark.parametrize("hold", ["pending", "active"])
def test_refuse_writes_one_job_and_refuses_the_rest_by_name(stores, hold):
    queue = f"uq-refuse-{hold}"
    unique = Unique("k", hold=hold, on_conflict="refuse")
    before, running, completed, first = scenario(stores, queue, unique)
    # One committed enqueue wrote the job; no committed one returned a holder.
    assert [job.id for job in before.committed] == [first]
    assert before.refused
    assert {exc.job_id for exc in before.refused} == {first}
    assert all(exc.key == "k" and exc.queue == queue for exc in before.refused)
    jobs = jobs_of(queue)
    if hold == "pending":
        # The running job holds nothing: one new job, the later wave refused by it.
        (second,) = running.ids()
        assert {exc.job_id for exc in completed.refused} == {second}
        assert not completed.committed
        assert len(jobs) == 2
    else:
        assert not running.committed
        assert {exc.job_id for exc in running.refused} == {first}
        (second,) = completed.ids()
        assert len(jobs) == 2
    assert second != first


def test_replace_takes_the_newest_payload_of_the_pending_job(stores):
    queue = "uq-replace"
    before, running, completed, first = scenario(stores, queue, Unique.debounce("k"))
    assert before.ids() == {first}
    assert not before.refused
    # The running job is never replaced: one new job, which the later wave replaces.
    (second,) = running.ids()
    assert second != first
    assert completed.ids() == {second}
    assert all(job.replaced for job in completed.committed)
    (first_row, second_row) = jobs_of(queue)
    assert first_row[1] == "completed"
    assert first_row[2]["n"] % 2 == 0  # a committed enqueue's
    assert second_row[1] == "pending"
    # Rolled-back enqueues (odd n) left nothing: the payload is a committed one's.
    assert second_row[2]["n"] % 2 == 0


def test_a_debounce_of_a_thousand_enqueues_leaves_one_job_with_the_last_payload():
    """1,000 enqueues over ~2 s from 4 connections, then one last: one job, due the
    window after the last enqueue, with the last payload."""
    queue = "uq-debounce"
    window = 60.0
    ids: set[int] = set()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def enqueuer(start: int) -> None:
        try:
            for n in range(start, 999, 4):
                job = enqueue(
                    "qa.noop", {"n": n}, queue=queue, delay=window, unique=Unique.debounce("digest")
                )
                with lock:
                    ids.add(job.id)
                time.sleep(0.008)  # 4 connections, ~250 enqueues each over ~2 s
        except BaseException as exc:  # any error fails the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueuer, args=(start,)) for start in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD)
        assert not thread.is_alive(), "an enqueuer hung"
    assert not errors, errors
    last = enqueue(
        "qa.noop", {"n": "last"}, queue=queue, delay=window, unique=Unique.debounce("digest")
    )
    assert last.replaced
    assert ids == {last.id}
    (job,) = Job.objects.filter(queue=queue)
    assert job.payload == {"n": "last"}
    (due_in,) = sql(
        "SELECT extract(epoch FROM run_at - now()) FROM queue_job_state WHERE job_id = %s",
        [job.id],
    )[0]
    assert window - 30 < due_in <= window  # due the window after the last enqueue
    assert JobState.objects.filter(queue=queue).count() == 1
