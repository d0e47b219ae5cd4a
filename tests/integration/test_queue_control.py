"""Queue control at the store level: real threads, real connections, real PostgreSQL.

The controlled claim (pause, global limit, key limit, rate window), the slot rules
(a slot frees by the fenced write or the sweep, never by a stale worker), snooze and
cancelling a running job.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest

from django_pgqueue import (
    enqueue,
    enqueue_many,
    pause_queue,
    resume_queue,
    set_queue_limit,
)
from django_pgqueue.conf import get_settings
from django_pgqueue.control import api
from django_pgqueue.control.store import sync_settings, update_control
from django_pgqueue.limits import QueueLimits
from django_pgqueue.sql import QUERIES
from django_pgqueue.store.worker import Store
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


def controlled_store(alias: str, name: str) -> Store:
    """A worker Store, as a worker makes it: its claims' view is `store.claims`."""
    return Store(alias, name, view_every=get_settings().POLL_INTERVAL / 2)


@pytest.fixture
def store_class() -> object:
    return controlled_store


def running(queue: str) -> int:
    return sql(
        "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'running'", [queue]
    )[0][0]


def expire_and_sweep(store: Store, job_ids: list[int]) -> None:
    sql(
        "UPDATE queue_job_state SET locked_until = now() - interval '1 second' "
        "WHERE job_id = ANY(%s)",
        [job_ids],
    )
    store.sweep()


class Sampler:
    """Sample a query every few milliseconds from its own connection, in a thread."""

    def __init__(self, query: str, params: list) -> None:
        self.query, self.params = query, params
        self.values: list[int] = []
        self.stop = threading.Event()
        self.store = Store("default", "sampler")
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = self.store.raw
        while not self.stop.is_set():
            self.values.append(conn.execute(self.query, self.params).fetchone()[0] or 0)
            time.sleep(0.002)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.store.close()


def most_at_once(queue: str) -> int:
    """The most attempts of `queue` running at one instant, from their recorded intervals.

    started_at is taken under the queue lock after the freeing write committed, so an
    attempt that reused a slot starts strictly after the one that left it finished.
    """
    return sql(
        """
        SELECT coalesce(max(n), 0) FROM (
            SELECT (SELECT count(*) FROM queue_attempts b
                    JOIN queue_job_state t ON t.job_id = b.job_id
                    WHERE t.queue = %(queue)s
                      AND b.started_at <= a.started_at
                      AND a.started_at < coalesce(b.finished_at, 'infinity')) AS n
            FROM queue_attempts a JOIN queue_job_state s ON s.job_id = a.job_id
            WHERE s.queue = %(queue)s
        ) AS overlap
        """,
        {"queue": queue},
    )[0][0]


def drain(stores, queue: str, threads: int, hold: float, batch: int = 10) -> list[int]:
    """Race `threads` claimers on `queue`; each holds its jobs `hold` s, then completes."""
    done: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            store = stores(f"claimer-{n}")
            store.connect()
            barrier.wait()
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 1.0:
                rows = store.claim(queue, batch, f"w{n}", 30)
                if not rows:
                    time.sleep(0.002)
                    continue
                idle_since = time.monotonic()
                time.sleep(hold)
                held = [(r.job_id, r.lease_version, r.attempt_id, None) for r in rows]
                completed = store.complete(held)
                with lock:
                    done.extend(completed)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=claimer, args=(n,)) for n in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert not errors, errors
    return done


def test_global_limit_is_never_exceeded_by_racing_claimers(stores):
    set_queue_limit("limited", 3)
    jobs = enqueue_many([("qa.noop", {"n": i}) for i in range(300)], queue="limited")
    with Sampler(
        "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'running'",
        ["limited"],
    ) as sampler:
        done = drain(stores, "limited", threads=8, hold=0.002, batch=2)
    assert sorted(done) == sorted(job.id for job in jobs)  # each exactly once
    assert len(sampler.values) > 100
    assert max(sampler.values) == 3  # reached, never passed
    assert most_at_once("limited") == 3


def test_an_unlimited_queue_claims_with_the_plain_statement(stores):
    enqueue_many([("qa.noop", {}) for _ in range(5)], queue="free")
    store = stores()
    assert not store.claims.controlled("free")
    assert len(store.claim("free", 10, "w", 30)) == 5
    assert sql("SELECT count(*) FROM queue_controls")[0][0] == 0


def test_key_limit_never_runs_two_jobs_of_one_key(stores):
    specs = [("qa.noop", {"n": i}) for i in range(60)]
    for n, (type_, payload) in enumerate(specs):
        enqueue(type_, payload, queue="keyed", concurrency_key=f"customer:{n % 4}")
    enqueue_many([("qa.noop", {}) for _ in range(20)], queue="keyed")  # no key: no limit
    with Sampler(
        "SELECT max(n) FROM (SELECT count(*) AS n FROM queue_job_state WHERE queue = %s "
        "AND status = 'running' AND concurrency_key IS NOT NULL GROUP BY concurrency_key) k",
        ["keyed"],
    ) as sampler:
        done = drain(stores, "keyed", threads=6, hold=0.005)
    assert len(done) == 80
    assert max(sampler.values) == 1
    overlaps = sql(
        """
        SELECT count(*)
        FROM queue_attempts a JOIN queue_job_state s ON s.job_id = a.job_id
        JOIN queue_attempts b ON b.id <> a.id
        JOIN queue_job_state t ON t.job_id = b.job_id
        WHERE s.concurrency_key = t.concurrency_key
          AND a.started_at < b.finished_at AND b.started_at < a.finished_at
        """
    )[0][0]
    assert overlaps == 0


def test_key_limit_two_lets_two_run_and_the_walk_skips_saturated_keys(stores):
    api.set_key_limit("k2", 2)
    for _ in range(5):
        enqueue("qa.noop", queue="k2", concurrency_key="hot")
    late = enqueue("qa.noop", queue="k2", concurrency_key="cold")
    rows = stores().claim("k2", 10, "w", 30)
    keys = sorted(
        sql("SELECT concurrency_key FROM queue_job_state WHERE job_id = %s", [r.job_id])[0][0]
        for r in rows
    )
    assert keys == ["cold", "hot", "hot"]
    assert late.id in {r.job_id for r in rows}
    assert stores().claim("k2", 10, "w2", 30) == []  # both keys at their limit


def test_rate_window_is_exact(stores):
    api.set_queue_rate("rated", "20/s")
    enqueue_many([("qa.noop", {}) for _ in range(200)], queue="rated")
    store = stores()
    claimed = 0
    deadline = time.monotonic() + 120.0  # a hang guard: 50 starts take 2 s at 20/s
    while claimed < 50:
        assert time.monotonic() < deadline, f"{claimed} starts in 120 s"
        rows = store.claim("rated", 7, "w", 30)
        store.complete([(r.job_id, r.lease_version, r.attempt_id, None) for r in rows])
        claimed += len(rows)
        if not rows:
            wait = store.claims.retry_short("rated", 1.0)
            assert 0 <= wait <= 1.0
            time.sleep(max(wait, 0.001))
    starts = [
        row[0]
        for row in sql(
            "SELECT a.started_at FROM queue_attempts a JOIN queue_job_state s "
            "ON s.job_id = a.job_id WHERE s.queue = 'rated' ORDER BY a.started_at"
        )
    ]
    assert len(starts) == claimed
    second = dt.timedelta(seconds=1)
    busiest = max(sum(1 for t in starts if s <= t < s + second) for s in starts)
    assert busiest == 20  # never above the limit in any window of 1 s, and reached
    # A slot is taken again as soon as it leaves the window: the start 20 places after
    # a start is 1 s later (never less: see busiest) plus the client's wake-up, at
    # least once. And the window does not halve throughput: the 50th start comes about 2 s
    # after the first (three windows), 4 s at half the rate; 1.5 s are for stalls.
    reuse = min(starts[i + 20] - starts[i] for i in range(len(starts) - 20))
    assert reuse < dt.timedelta(seconds=1.25), reuse
    assert starts[49] - starts[0] < dt.timedelta(seconds=3.5), starts[49] - starts[0]


def test_pause_claims_nothing_and_resume_claims_again(stores):
    enqueue_many([("qa.noop", {}) for _ in range(3)], queue="mail")
    pause_queue("mail")
    store = stores()
    assert store.claim("mail", 10, "w", 30) == []
    assert store.claims.retry_short("mail", 1.0) == 1.0
    enqueue("qa.noop", queue="mail")  # enqueue still works
    resume_queue("mail")
    assert len(store.claim("mail", 10, "w", 30)) == 4


def test_a_stale_workers_rejected_write_frees_no_slot(stores):
    set_queue_limit("one", 1)
    first, second = enqueue("qa.noop", queue="one"), enqueue("qa.noop", queue="one")
    stale, fresh, other = stores("stale"), stores("fresh"), stores("other")
    [row] = stale.claim("one", 5, "stale", 30)
    assert row.job_id == first.id
    expire_and_sweep(fresh, [first.id])  # the slot comes back with the sweep
    [again] = fresh.claim("one", 5, "fresh", 30)
    assert again.job_id == first.id  # it kept its place in line
    # The stale worker's completion is rejected and frees nothing.
    assert stale.complete([(row.job_id, row.lease_version, row.attempt_id, None)]) == set()
    assert running("one") == 1
    assert other.claim("one", 5, "other", 30) == []
    assert fresh.complete([(again.job_id, again.lease_version, again.attempt_id, None)])
    [last] = other.claim("one", 5, "other", 30)
    assert last.job_id == second.id


def test_the_sweep_frees_the_slots_of_an_expired_lease(stores):
    set_queue_limit("two", 2)
    enqueue_many([("qa.noop", {}) for _ in range(4)], queue="two")
    crashed, alive = stores("crashed"), stores("alive")
    rows = crashed.claim("two", 10, "crashed", 30)
    assert len(rows) == 2
    assert alive.claim("two", 10, "alive", 30) == []
    assert alive.claims.retry_short("two", 1.0) < 0.1  # full: try again soon
    expire_and_sweep(alive, [r.job_id for r in rows])
    assert len(alive.claim("two", 10, "alive", 30)) == 2


def test_limit_lowered_at_run_time_holds_for_new_claims(stores):
    enqueue_many([("qa.noop", {}) for _ in range(10)], queue="low")
    set_queue_limit("low", 5)
    store = stores()
    assert len(store.claim("low", 10, "w", 30)) == 5
    set_queue_limit("low", 2)
    assert store.claim("low", 10, "w", 30) == []  # 5 running > 2: nothing more
    set_queue_limit("low", None)
    assert len(store.claim("low", 10, "w", 30)) == 5


def test_settings_are_written_once_and_run_time_edits_stand(stores):
    configured = {"reports": QueueLimits(limit=3, key_limit=2, rate_count=100, rate_period=1.0)}
    assert sync_settings("default", configured) == ["reports"]
    update_control("default", "reports", concurrency_limit=7)
    assert sync_settings("default", configured) == []  # same settings: the edit stands
    row = api.queue_controls()[0]
    assert (row["concurrency_limit"], row["key_limit"], row["rate_count"]) == (7, 2, 100)
    changed = {"reports": QueueLimits(limit=4)}
    assert sync_settings("default", changed) == ["reports"]  # a new setting wins
    row = api.queue_controls()[0]
    assert (row["concurrency_limit"], row["key_limit"], row["rate_count"]) == (4, 1, None)


def test_enqueue_refuses_a_bad_concurrency_key():
    from django_pgqueue.exceptions import EnqueueError

    for bad in ["", "x" * 256, "a\x00b", 42]:
        with pytest.raises(EnqueueError, match="concurrency_key"):
            enqueue("qa.noop", queue="keyed", concurrency_key=bad)
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == 0


def test_claimers_of_a_controlled_queue_take_turns(stores):
    """The claim waits for the queue's lock, and counts after it with a fresh snapshot."""
    set_queue_limit("turns", 3)
    enqueue_many([("qa.noop", {}) for _ in range(10)], queue="turns")
    holder = stores("holder").raw
    holder.execute("BEGIN")
    holder.execute("SELECT FROM queue_controls WHERE queue = 'turns' FOR UPDATE")
    # Meanwhile the holder claims 2 of the 3 slots, from jobs enqueued after the
    # other claimer could have taken its snapshot.
    holder.execute(
        "UPDATE queue_job_state SET status = 'running', locked_by = 'holder', attempts = 1, "
        "lease_version = 1, locked_until = now() + interval '30 seconds' WHERE job_id IN "
        "(SELECT job_id FROM queue_job_state WHERE queue = 'turns' ORDER BY job_id DESC LIMIT 2)"
    )
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(len(stores().claim("turns", 10, "w", 30))))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # waiting for the queue's lock
    holder.execute("COMMIT")
    waiter.join(10)
    assert got == [1]  # saw the holder's 2 running jobs: one slot left
    assert running("turns") == 3


def test_a_frozen_claimer_holds_the_queue_lock_one_second_at_most(stores):
    """A client that stops between the lock and the end of its transaction is cut off."""
    set_queue_limit("frozen", 3)
    enqueue("qa.noop", queue="frozen")
    frozen = stores("frozen").raw
    frozen.execute("BEGIN")
    frozen.execute(QUERIES["transaction_guard"], {"idle_ms": 500})
    # From before the lock: the frozen session's idle timer starts once it holds it.
    started = time.monotonic()
    frozen.execute(QUERIES["queue_control_lock"], {"queue": "frozen"})
    rows = stores("other").claim("frozen", 10, "other", 30)  # waits, then claims
    assert len(rows) == 1
    # It waited out the 500 ms idle timeout; the upper bound only tells a cut-off from a
    # lock held for ever (how promptly is not a promise a loaded machine keeps).
    assert 0.5 <= time.monotonic() - started < 60
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
        frozen.execute("SELECT 1")
