"""The worker's invariant, finding by finding (issue 12): handler threads, timeouts,
their Django connections and an idle worker. Whatever a handler or its thread does,
every claimed job ends with an attempt saying why, and the worker keeps its threads."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

import django_pgqueue
from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.exceptions import DatabaseUnavailable, JobTimeout
from django_pgqueue.models import Attempt, JobState
from django_pgqueue.store.worker import NOTIFY_CHANNEL
from tests.conftest import sql
from tests.integration.test_worker import wait_until
from tests.integration.test_worker_faults import status

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_payload_too_deep_to_decode_fails_its_job_and_the_thread_goes_on(run_worker):
    nested = enqueue("qa.outcome", {"do": "return"}, queue="deep")
    # jsonb takes nesting that Python's json.loads cannot (RecursionError).
    sql(
        "UPDATE queue_jobs SET payload = (repeat('[', 12000) || repeat(']', 12000))::jsonb "
        "WHERE id = %s",
        [nested.id],
    )
    after = enqueue("qa.outcome", {"do": "return"}, queue="deep")
    run_worker(["deep"], concurrency=1, poll_interval=0.1)
    wait_until(lambda: status(after.id) == "completed", timeout=120)
    assert status(nested.id) == "dead"
    attempt = Attempt.objects.get(job_id=nested.id)
    assert attempt.error_class == "RecursionError"


def test_a_handler_thread_that_dies_has_its_job_failed_and_is_replaced(run_worker, monkeypatch):
    from django_pgqueue.worker import pool

    doomed = enqueue("qa.outcome", {"do": "return"}, queue="die", max_attempts=1)
    real = pool._execute

    def dies_on_doomed(item, observer):
        if item.ctx.job_id == doomed.id:
            raise SystemExit("the thread ends outside any handler")
        return real(item, observer)

    monkeypatch.setattr(pool, "_execute", dies_on_doomed)
    worker = run_worker(["die"], concurrency=1, poll_interval=0.1)
    wait_until(lambda: status(doomed.id) == "dead", timeout=120)
    assert Attempt.objects.get(job_id=doomed.id).error_class == "django_pgqueue.HandlerThreadDied"
    later = enqueue("qa.outcome", {"do": "return"}, queue="die")
    wait_until(lambda: status(later.id) == "completed", timeout=120)
    assert worker.worker.stats["threads_died"] == 1


def test_a_batch_of_blocking_handlers_runs_on_all_its_threads_at_once(run_worker):
    # A batch wakes one idle thread, and each thread that takes a job wakes the next
    # while jobs wait: handlers that block still all run at the same time.
    jobs = enqueue_many([("qa.sleep", {"seconds": 0.6})] * 4, queue="fan")
    run_worker(["fan"], concurrency=4, batch_size=4, burst=True).join()
    ids = [job.id for job in jobs]
    runs, overlapping = sql(
        "SELECT count(*), max(started_at) < min(finished_at) FROM qa_ledger WHERE job_id = ANY(%s)",
        [ids],
    )[0]
    assert runs == 4
    assert overlapping, "the four handlers did not all run at once"


RELEASE = threading.Event()


@django_pgqueue.handler("test.held_until_released")
def held_until_released(ctx):
    """Runs until the test releases it (a hang guard of 120 s)."""
    RELEASE.wait(120)


def test_a_short_jobs_outcome_is_written_while_its_batch_mate_still_runs(run_worker):
    # After a claim the dispatcher waits for the batch's last handler, but at most the
    # flush delay: a finished job's completion must not wait for a long one's end.
    RELEASE.clear()
    long_job, short_job = enqueue_many(
        [("test.held_until_released", None), ("qa.outcome", {"do": "return"})], queue="mates"
    )
    run_worker(["mates"], concurrency=2, batch_size=2, poll_interval=0.1)
    try:
        wait_until(lambda: status(short_job.id) == "completed", timeout=120)
        assert status(long_job.id) == "running"
    finally:
        RELEASE.set()
    wait_until(lambda: status(long_job.id) == "completed", timeout=120)


# -- timeouts: the handoff between a handler thread and the dispatcher ---------------

SEEN: dict[int, dict[str, object]] = {}


@django_pgqueue.handler("test.outlives_timeout", max_attempts=1)
def outlives_timeout(ctx):
    """Swallows the timeout's exception and keeps running, noting what it sees."""
    seen = SEEN.setdefault(
        ctx.job_id, {"thread": threading.current_thread().name, "start": time.monotonic()}
    )
    deadline = time.monotonic() + float(ctx.payload["seconds"])
    while time.monotonic() < deadline:
        try:
            time.sleep(0.01)
        except JobTimeout:
            seen["timeout"] = time.monotonic()
        if "timeout" in seen and ctx.lease_lost():
            seen["lease_lost"] = True
    seen["end"] = time.monotonic()
    seen["thread_after"] = threading.current_thread().name


def test_a_timed_out_handler_sees_its_lease_lost(run_worker):
    job = enqueue("test.outlives_timeout", {"seconds": 1.2}, queue="to")
    run_worker(["to"], job_timeout=0.3, poll_interval=0.1)
    wait_until(lambda: "thread_after" in SEEN.get(job.id, {}), timeout=120)
    # The job is failed once its handler returned (its slot held until then).
    wait_until(lambda: status(job.id) == "dead", timeout=120)
    assert SEEN[job.id].get("lease_lost") is True


def test_a_handler_past_its_timeout_keeps_its_thread_until_it_returns(run_worker):
    """A handler past its timeout holds its slot: with one thread, the next job starts
    only once it returned, on the same thread; none counts as stuck (each returns
    before it outlived its timeout by as much again), so the worker goes on."""
    jobs = [enqueue("test.outlives_timeout", {"seconds": 0.8}, queue="to") for _ in range(4)]
    worker = run_worker(["to"], concurrency=1, job_timeout=0.5, poll_interval=0.1)
    wait_until(lambda: all("thread_after" in SEEN.get(j.id, {}) for j in jobs), timeout=120)
    last = enqueue("qa.outcome", {"do": "return"}, queue="to")
    wait_until(lambda: status(last.id) == "completed", timeout=120)
    assert worker.worker.stats["timed_out"] == 4
    assert worker.worker.exit_code == 0
    spans = sorted((SEEN[j.id]["start"], SEEN[j.id]["end"]) for j in jobs)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
    assert len({SEEN[j.id]["thread"] for j in jobs}) == 1


def test_a_handler_that_returned_is_never_timed_out():
    from django_pgqueue.claimed import ClaimedJob
    from django_pgqueue.context import Lease
    from django_pgqueue.retry import FixedDelay
    from django_pgqueue.store.worker import ClaimedRow
    from django_pgqueue.worker.pool import HandlerPool

    row = ClaimedRow(1, "q", "t", "{}", 0, 1, 1, 1, 1, None, None, None)
    item = ClaimedJob.claimed(row, None, FixedDelay(1), 0.1, "w", time.monotonic() + 30)
    assert isinstance(item.lease, Lease)
    pool = HandlerPool(1, threading.Event(), "w")
    pool.submit([item])
    item.started = time.monotonic() - 1  # past its timeout, but its handler returned
    with pool._handoff:  # as its handler thread does
        item.returned = True
    assert pool.check_timeouts() is False  # nothing stuck
    assert not item.timed_out


def test_a_timeout_due_while_connections_are_reset_never_lands_after_the_handler(
    run_worker, monkeypatch, caplog
):
    """A handler that returned in time is done: its job's timeout coming due while the
    thread readies its Django connections for the next job neither fails the job nor
    interrupts the reset (where it used to land, logged as the reset's failure)."""
    from django_pgqueue.worker import pool

    real = pool.reset_django_connections

    def slow_reset():
        # Longer than the job's timeout: a timeout still armed comes due in here.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            time.sleep(0.02)
        real()

    monkeypatch.setattr(pool, "reset_django_connections", slow_reset)
    job = enqueue("qa.outcome", {"do": "return"}, queue="reset", max_attempts=1)
    worker = run_worker(["reset"], concurrency=1, job_timeout=0.3, poll_interval=0.1)
    wait_until(lambda: status(job.id) in ("completed", "dead"), timeout=120)
    assert status(job.id) == "completed"
    assert Attempt.objects.get(job_id=job.id).status == "succeeded"
    assert not [r for r in caplog.records if "resetting the Django connections" in r.message]
    assert worker.worker.stats["threads_died"] == 0


def test_all_handler_threads_stuck_ends_the_worker(run_worker):
    for _ in range(2):
        enqueue("qa.hang", queue="wedged", max_attempts=1)  # blocked in C for good
    # A job timed out keeps its thread until its handler returns: the one thread is stuck
    # once the handler outlived its timeout by as much again, and the worker exits.
    worker = run_worker(["wedged"], concurrency=1, job_timeout=0.2, poll_interval=0.1)
    worker.thread.join(15)
    assert not worker.thread.is_alive()
    assert worker.worker.exit_code == 1


def test_a_handler_connection_the_server_dropped_between_jobs_costs_no_attempt(run_worker):
    first = enqueue("qa.backend_pid", queue="pid")
    worker = run_worker(["pid"], concurrency=1, batch_size=1, poll_interval=0.05)
    wait_until(lambda: status(first.id) == "completed")
    pid = Attempt.objects.get(job_id=first.id).result
    sql("SELECT pg_terminate_backend(%s)", [pid])  # the handler thread's, not the worker's
    time.sleep(0.2)
    job = enqueue("qa.backend_pid", queue="pid", max_attempts=1)
    wait_until(lambda: status(job.id) != "pending" and status(job.id) != "running")
    assert status(job.id) == "completed", JobState.objects.get(pk=job.id).last_error
    assert Attempt.objects.get(job_id=job.id).result != pid
    assert "leases_lost" not in worker.worker.stats


# -- an idle worker ----------------------------------------------------------------------


def test_an_idle_listening_worker_polls_rarely_yet_runs_a_scheduled_job_when_due(run_worker):
    due = enqueue("qa.outcome", {"do": "return"}, queue="idle", delay=3.0)
    # The database's clock, not the test's: a loaded machine can delay either side.
    [(run_at, enqueued_at)] = sql(
        "SELECT s.run_at, j.created_at FROM queue_job_state s JOIN queue_jobs j ON j.id = s.job_id "
        "WHERE s.job_id = %s",
        [due.id],
    )
    worker = run_worker(["idle"], poll_interval=0.2, sweep_interval=60)
    dispatcher = worker.worker._dispatcher
    claims = []
    claim = dispatcher.store.claim
    dispatcher.store.claim = lambda *args, **kwargs: (claims.append(1), claim(*args, **kwargs))[1]
    wait_until(lambda: status(due.id) == "completed", timeout=120)
    # Not before it is due: the claim honours run_at (the upper bound is a promise of
    # `make reliability`, not of a test on a shared machine).
    assert (run_at - enqueued_at).total_seconds() >= 3.0
    assert Attempt.objects.get(job_id=due.id).started_at >= run_at
    # Polling every POLL_INTERVAL (0.2 s) would have claimed about 15 times meanwhile;
    # an idle worker that hears NOTIFYs looks when the scheduled job is due.
    assert len(claims) <= 4, len(claims)
    looked = len(claims)
    time.sleep(2.0)
    assert len(claims) - looked <= 1


def test_a_refused_listen_does_not_end_the_listener(run_worker, monkeypatch):
    from psycopg import errors as pg

    from django_pgqueue.store.listening import ListeningStore

    listen = ListeningStore.listen
    calls = []

    def refused_once(store):
        calls.append(1)
        if len(calls) == 1:
            raise pg.QueryCanceled("canceling statement due to statement timeout")
        listen(store)

    monkeypatch.setattr(ListeningStore, "listen", refused_once)
    worker = run_worker(["lq"], poll_interval=0.1)
    wait_until(lambda: worker.worker._dispatcher.claims.listening, timeout=120)
    assert len(calls) == 2


def _claims_of_16_held_jobs(run_worker, queue: str):
    """Run 16 held jobs of `queue` on a burst worker of 16 threads; return the worker
    and how many transactions opened their attempts (one per claim statement).

    Read while every handler is held: a completion rewrites its attempt's row (a new
    xmin), and completions flushed together would read as one claim.
    """
    of_queue = "FROM queue_attempts a JOIN queue_job_state s USING (job_id) WHERE s.queue = %s"
    RELEASE.clear()
    enqueue_many([("test.held_until_released", None)] * 16, queue=queue)
    worker = run_worker([queue], concurrency=16, burst=True)
    try:
        wait_until(lambda: sql(f"SELECT count(*) {of_queue}", [queue])[0][0] == 16, timeout=120)
        claims = sql(f"SELECT count(DISTINCT a.xmin::text) {of_queue}", [queue])[0][0]
    finally:
        RELEASE.set()
    worker.join()
    assert JobState.objects.filter(queue=queue, status="completed").count() == 16
    return worker, claims


def test_without_a_batch_size_one_claim_fills_every_free_thread(run_worker):
    assert _claims_of_16_held_jobs(run_worker, "fill")[1] == 1


def test_a_batch_size_set_in_the_settings_still_caps_the_claim(run_worker, settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "BATCH_SIZE": 10}
    worker, claims = _claims_of_16_held_jobs(run_worker, "capped")
    assert worker.worker.config.batch_size == 10
    assert claims == 2


@pytest.fixture
def reads(monkeypatch):
    """The threads that read each NOTIFY of a worker's queue, in order."""
    from django_pgqueue.store.listening import ListeningStore

    threads = []
    notified = ListeningStore.notified

    def recording(store):
        names = notified(store)
        threads.extend(threading.current_thread() for name in names if name == "lend")
        return names

    monkeypatch.setattr(ListeningStore, "notified", recording)
    return threads


def test_an_idle_worker_reads_a_notify_and_claims_on_its_dispatcher_thread(run_worker, reads):
    worker = run_worker(["lend"])
    listener = worker.worker._listener
    wait_until(lambda: worker.worker._dispatcher.claims.listening and listener._lendable)
    jobs = []
    for i in range(5):  # one at a time: the worker is idle at each NOTIFY
        jobs.append(enqueue("qa.noop", {"n": i}, queue="lend").id)
        wait_until(lambda: status(jobs[-1]) == "completed", timeout=120)
    # The dispatcher waits on the listener's socket and reads the NOTIFYs itself (the
    # listener's thread reads only those that come while it does not wait).
    assert worker.thread in reads, [thread.name for thread in reads]


def test_a_listener_connection_lost_while_lent_is_recovered(run_worker, reads):
    worker = run_worker(["lend"])
    listener = worker.worker._listener
    wait_until(lambda: worker.worker._dispatcher.claims.listening and listener._lendable)
    name = f"pgqueue listener {worker.worker.worker_id}"
    [(lost,)] = sql("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [name])
    assert sql("SELECT pg_terminate_backend(%s)", [lost]) == [(True,)]
    # Recovered: another backend of the listener's has run its LISTEN, and the
    # connection is lent again. (The lost backend leaves pg_stat_activity some time
    # after the call, and the listener notices the loss some time after that: until
    # then the old backend and the old connection's flag still read as recovered.)
    wait_until(
        lambda: (
            sql(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND pid <> %s AND state = 'idle' AND query = %s",
                [name, lost, f"LISTEN {NOTIFY_CHANNEL}"],
            )
            == [(1,)]
            and listener._lendable
        ),
        timeout=120,
    )
    # A job's NOTIFY, sent after that LISTEN, is heard on the new connection.
    before = len(reads)
    job = enqueue("qa.noop", queue="lend").id
    wait_until(lambda: status(job) == "completed", timeout=120)
    wait_until(lambda: len(reads) > before, timeout=120)
    assert worker.thread.is_alive()
    assert worker.error is None


def test_a_read_lost_on_the_dispatcher_is_recovered_once_its_wait_is_off(run_worker, monkeypatch):
    """The dispatcher's read that lost the connection records its failure after the
    connection is closed: the listener's thread recovers the connection only once that
    read is over, so the failure is taken for the lost connection, never the next."""
    from django_pgqueue.store.listening import ListeningStore

    worker = run_worker(["lend"])
    listener = worker.worker._listener
    wait_until(lambda: worker.worker._dispatcher.claims.listening and listener._lendable)
    failed = threading.Event()  # the dispatcher's read has failed
    notified = ListeningStore.notified

    def dispatcher_fails_slowly(store):
        if threading.current_thread() is not worker.thread:
            # The listener's own reads leave the loss to the dispatcher's.
            return notified(store) if failed.is_set() else []
        try:
            return notified(store)
        except DatabaseUnavailable:
            # The failure comes back only once the listener's thread has reconnected
            # or asks for the connection back (it ends this wait through the Wake).
            wait_until(lambda: store.connected or worker.worker._wake.is_set(), timeout=120)
            failed.set()
            raise

    monkeypatch.setattr(ListeningStore, "notified", dispatcher_fails_slowly)
    name = f"pgqueue listener {worker.worker.worker_id}"
    [(lost,)] = sql("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [name])
    assert sql("SELECT pg_terminate_backend(%s)", [lost]) == [(True,)]
    wait_until(failed.is_set, timeout=120)
    # A new connection LISTENs, is lent, and the worker counts on its NOTIFYs (no poll).
    wait_until(
        lambda: (
            listener._failed is None
            and worker.worker._dispatcher.claims.listening
            and listener._lendable
            and sql(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND pid <> %s AND state = 'idle' AND query = %s",
                [name, lost, f"LISTEN {NOTIFY_CHANNEL}"],
            )
            == [(1,)]
        ),
        timeout=120,
    )
