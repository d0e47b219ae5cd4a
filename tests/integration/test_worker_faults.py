"""The worker's invariant, finding by finding (issue 12): whatever a handler, its
thread or the database does, every claimed job ends with an attempt saying why, and the
worker keeps its handler threads."""

from __future__ import annotations

import threading
import time

import pytest

import django_pgqueue
from django_pgqueue import enqueue
from django_pgqueue.exceptions import JobTimeout
from django_pgqueue.models import Attempt, JobState
from tests.conftest import sql
from tests.integration.test_worker import wait_until, write_claimed

pytestmark = pytest.mark.django_db(transaction=True)


def status(job_id: int) -> str:
    return JobState.objects.get(pk=job_id).status


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
    wait_until(lambda: status(after.id) == "completed", timeout=10)
    assert status(nested.id) == "dead"
    attempt = Attempt.objects.get(job_id=nested.id)
    assert attempt.error_class == "RecursionError"


def test_a_handler_thread_that_dies_has_its_job_failed_and_is_replaced(run_worker, monkeypatch):
    from django_pgqueue.worker import pool

    doomed = enqueue("qa.outcome", {"do": "return"}, queue="die", max_attempts=1)
    real = pool._execute

    def dies_on_doomed(item):
        if item.ctx.job_id == doomed.id:
            raise SystemExit("the thread ends outside any handler")
        return real(item)

    monkeypatch.setattr(pool, "_execute", dies_on_doomed)
    worker = run_worker(["die"], concurrency=1, poll_interval=0.1)
    wait_until(lambda: status(doomed.id) == "dead", timeout=10)
    assert Attempt.objects.get(job_id=doomed.id).error_class == "django_pgqueue.HandlerThreadDied"
    later = enqueue("qa.outcome", {"do": "return"}, queue="die")
    wait_until(lambda: status(later.id) == "completed", timeout=10)
    assert worker.worker.stats["threads_died"] == 1


@pytest.fixture
def refuse():
    """refuse(job_id, sqlstate, times): the next `times` completions of the job raise it.

    A trigger on queue_job_state: PostgreSQL's own error, inside the worker's statement.
    """
    sql("CREATE TABLE qa_refuse (job_id bigint PRIMARY KEY, state text, times int)")
    # A sequence counts the refusals: nextval survives the rollback the refusal causes.
    sql("CREATE SEQUENCE qa_refuse_hits")
    sql(
        """
        CREATE FUNCTION qa_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE plan qa_refuse;
        BEGIN
            IF OLD.status = 'running' AND NEW.status = 'completed' THEN
                SELECT * INTO plan FROM qa_refuse WHERE job_id = NEW.job_id;
                IF FOUND AND nextval('qa_refuse_hits') <= plan.times THEN
                    RAISE EXCEPTION 'qa refusal' USING ERRCODE = plan.state;
                END IF;
            END IF;
            RETURN NEW;
        END $$
        """
    )
    sql(
        "CREATE TRIGGER qa_refuse BEFORE UPDATE ON queue_job_state "
        "FOR EACH ROW EXECUTE FUNCTION qa_refuse()"
    )

    def plan(job_id: int, state: str, times: int = 1) -> None:
        sql("INSERT INTO qa_refuse VALUES (%s, %s, %s)", [job_id, state, times])

    yield plan
    sql("DROP TRIGGER qa_refuse ON queue_job_state")
    sql("DROP FUNCTION qa_refuse()")
    sql("DROP TABLE qa_refuse")
    sql("DROP SEQUENCE qa_refuse_hits")


@pytest.mark.parametrize(
    "state",
    [
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available
        "57014",  # query_canceled
        "22008",  # datetime_field_overflow: nothing to do with the result
        "23514",  # check_violation
    ],
)
def test_a_completion_refused_for_a_passing_reason_completes(run_worker, refuse, state, caplog):
    """A refused completion is written again: never dead as "ResultNotStorable", and a
    serialization failure is no lost connection (no reconnect, no write in doubt)."""
    jobs = [enqueue("qa.outcome", {"do": "return"}, queue="refused") for _ in range(3)]
    refuse(jobs[1].id, state, times=3)  # with the claim, the batch, the job alone
    worker = run_worker(["refused"], concurrency=3, batch_size=3, burst=True)
    worker.join()
    assert [status(job.id) for job in jobs] == ["completed"] * 3
    assert "lost the database connection" not in caplog.text
    assert "in doubt" not in caplog.text
    assert worker.worker.stats["completed"] == 3
    assert "dead" not in worker.worker.stats
    assert Attempt.objects.filter(job_id__in=[j.id for j in jobs]).count() == 3


def test_a_completion_refused_for_good_is_a_retryable_failure_naming_the_error(run_worker, refuse):
    job = enqueue("qa.outcome", {"do": "return"}, queue="refused", max_attempts=2)
    refuse(job.id, "40001", times=100)
    worker = run_worker(["refused"], burst=True)
    worker.join()
    attempts = list(Attempt.objects.filter(job_id=job.id).order_by("attempt_index"))
    assert [a.status for a in attempts] == ["failed", "failed"]
    assert {a.error_class for a in attempts} == {"psycopg.errors.SerializationFailure"}
    assert "ResultNotStorable" not in JobState.objects.get(pk=job.id).last_error


def test_a_result_postgresql_refuses_as_a_value_is_unstorable(run_worker, refuse):
    job = enqueue("qa.outcome", {"do": "return"}, queue="refused")
    refuse(job.id, "22P05", times=100)  # untranslatable_character: about the result
    run_worker(["refused"], burst=True).join()
    assert status(job.id) == "dead"
    assert "ResultNotStorable" in JobState.objects.get(pk=job.id).last_error


def test_a_failure_write_refused_never_drops_the_rest_of_its_batch():
    """A retry delay too large for now() + delay ("timestamp out of range"): the failure
    is written with a bounded delay, and the other outcomes of the batch are written."""
    from django_pgqueue.outcomes import MAX_RETRY_DELAY, Failure, Success

    jobs = [enqueue("qa.outcome", {"do": "return"}, queue="far") for _ in range(3)]
    outcomes = {
        jobs[0].id: Failure("RetryLater", "in a long while", "", permanent=False, delay=1e13),
        jobs[1].id: Failure("ValueError", "soon", "", permanent=False, delay=float("inf")),
        jobs[2].id: Success('{"ok": true}'),
    }
    worker = write_claimed("far", 3, lambda row: outcomes[row.job_id])
    states = dict(JobState.objects.filter(queue="far").values_list("job_id", "status"))
    assert states == {jobs[0].id: "pending", jobs[1].id: "pending", jobs[2].id: "completed"}
    (ahead,) = sql(
        "SELECT min(extract(epoch FROM run_at - now())) FROM queue_job_state WHERE queue = 'far' "
        "AND status = 'pending'"
    )[0]
    assert MAX_RETRY_DELAY - 60 < float(ahead) <= MAX_RETRY_DELAY
    assert worker.stats["retried"] == 2
    assert not worker._dispatcher.leases.held()


# -- timeouts: the handoff between a handler thread and the dispatcher ---------------

SEEN: dict[int, dict[str, object]] = {}


@django_pgqueue.handler("test.outlives_timeout", max_attempts=1)
def outlives_timeout(ctx):
    """Swallows the timeout's exception and keeps running, noting what it sees."""
    seen = SEEN.setdefault(ctx.job_id, {"thread": threading.current_thread().name})
    deadline = time.monotonic() + float(ctx.payload["seconds"])
    while time.monotonic() < deadline:
        try:
            time.sleep(0.01)
        except JobTimeout:
            seen["timeout"] = time.monotonic()
        if "timeout" in seen and ctx.lease_lost():
            seen["lease_lost"] = True
    seen["thread_after"] = threading.current_thread().name


def test_a_timed_out_handler_sees_its_lease_lost(run_worker):
    job = enqueue("test.outlives_timeout", {"seconds": 1.2}, queue="to")
    run_worker(["to"], job_timeout=0.3, poll_interval=0.1)
    wait_until(lambda: "thread_after" in SEEN.get(job.id, {}), timeout=10)
    assert status(job.id) == "dead"
    assert SEEN[job.id].get("lease_lost") is True


def test_stuck_handlers_that_finally_return_no_longer_count_as_stuck(run_worker):
    """More timeouts over a worker's life than threads, never more stuck at once."""
    jobs = [enqueue("test.outlives_timeout", {"seconds": 0.4}, queue="to") for _ in range(4)]
    worker = run_worker(["to"], concurrency=1, job_timeout=0.3, poll_interval=0.1)
    wait_until(lambda: all("thread_after" in SEEN.get(j.id, {}) for j in jobs), timeout=20)
    last = enqueue("qa.outcome", {"do": "return"}, queue="to")
    wait_until(lambda: status(last.id) == "completed", timeout=10)
    assert worker.worker.stats["timed_out"] == 4
    assert worker.worker.exit_code == 0
    # A thread whose job timed out never took another job.
    threads = [SEEN[j.id]["thread"] for j in jobs]
    assert len(set(threads)) == 4


def test_a_handler_that_returned_is_never_timed_out():
    from django_pgqueue.context import Lease
    from django_pgqueue.retry import FixedDelay
    from django_pgqueue.store.worker import ClaimedRow
    from django_pgqueue.worker.inflight import InFlight
    from django_pgqueue.worker.pool import HandlerPool

    row = ClaimedRow(1, "q", "t", "{}", 0, 1, 1, 1, 1, None, None, None)
    item = InFlight.claimed(row, None, FixedDelay(1), 0.1, "w", time.monotonic() + 30)
    assert isinstance(item.lease, Lease)
    pool = HandlerPool(1, threading.Event(), "w")
    pool.submit([item])
    item.started = time.monotonic() - 1  # past its timeout, but its handler returned
    with item.lock:
        item.returned = True
    assert pool.check_timeouts().failed == []
    assert not item.timed_out


# -- claims whose answer was lost; the heartbeat after a failed renewal ---------------


def test_jobs_claimed_by_a_claim_whose_answer_was_lost_are_handed_back(run_worker):
    """The database says the worker holds a job it never heard of: after (re)connecting
    it hands the job back with its attempt, and the job runs (even a last attempt)."""
    from django_pgqueue.store.worker import Store

    job = enqueue("qa.outcome", {"do": "return"}, queue="lost", max_attempts=1)
    claimer = Store("default", "a claim whose answer was lost")
    try:
        assert [row.job_id for row in claimer.claim("lost", 1, "worker-x", 60)] == [job.id]
    finally:
        claimer.close()
    worker = run_worker(["lost"], worker_id="worker-x", burst=True)
    worker.join()
    assert status(job.id) == "completed"
    attempts = list(Attempt.objects.filter(job_id=job.id).order_by("lease_version"))
    assert [a.status for a in attempts] == ["released", "succeeded"]
    assert worker.worker.stats["released"] == 1


def test_the_heartbeat_renews_again_at_once_after_losing_its_connection(run_worker):
    job = enqueue("qa.sleep", {"seconds": 4.0}, queue="beat")
    worker = run_worker(["beat"], lease=3.0, heartbeat_interval=1.0)
    wait_until(lambda: status(job.id) == "running")
    wait_until(lambda: len(worker.worker.heartbeat_gaps) >= 1, timeout=5)
    sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name LIKE 'pgqueue heartbeat %%'"
    )
    wait_until(lambda: status(job.id) == "completed", timeout=10)
    gaps = list(worker.worker.heartbeat_gaps)
    assert len(gaps) >= 2
    # One interval (1 s) and a reconnect, not two intervals.
    assert max(gaps) < 1.6, gaps
    assert worker.worker.heartbeat_gaps.maxlen is not None


def test_more_handlers_stuck_at_once_than_threads_ends_the_worker(run_worker):
    for _ in range(2):
        enqueue("qa.hang", queue="wedged", max_attempts=1)  # blocked in C for good
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


# -- the worker's sessions -------------------------------------------------------------


@pytest.fixture
def serializable_by_default():
    """The test database's default isolation is SERIALIZABLE for new sessions."""
    from django.db import connection

    name = connection.settings_dict["NAME"]
    sql(f'ALTER DATABASE "{name}" SET default_transaction_isolation = serializable')
    yield
    sql(f'ALTER DATABASE "{name}" RESET default_transaction_isolation')


def test_worker_sessions_pin_read_committed_and_assume_the_configured_role(
    serializable_by_default,
):
    from django.db import connections

    from django_pgqueue.store.worker import Store

    role = "pgqueue_fixes_qa_role"
    sql(f"DROP ROLE IF EXISTS {role}")
    sql(f"CREATE ROLE {role}")
    sql(f"GRANT {role} TO CURRENT_USER")
    options = connections["default"].settings_dict["OPTIONS"]
    options["assume_role"] = role
    store = Store("default", "session check")
    try:
        row = store.raw.execute(
            "SELECT current_setting('transaction_isolation'), current_user"
        ).fetchone()
    finally:
        store.close()
        del options["assume_role"]
        sql(f"DROP ROLE {role}")
    assert row == ("read committed", role)


def test_prepared_statements_lost_behind_a_pooler_turn_preparation_off(caplog):
    """A transaction-mode pooler hands the next statement to a server connection that
    never prepared it (SQLSTATE 26000): one clear error naming the setting, then the
    statement runs unprepared."""
    from django_pgqueue.store.worker import Store

    jobs = [enqueue("qa.outcome", {"do": "return"}, queue="pooled") for _ in range(2)]
    store = Store("default", "behind a pooler")
    try:
        assert len(store.claim("pooled", 1, "w", 30)) == 1
        # What another server connection looks like: nothing prepared. Through libpq
        # directly, so psycopg does not notice and still believes its statements exist.
        store.raw.pgconn.exec_(b"DEALLOCATE ALL")
        assert [row.job_id for row in store.claim("pooled", 1, "w", 30)] == [jobs[1].id]
        assert store.raw.prepare_threshold is None
    finally:
        store.close()
    assert 'PGQUEUE["WORKER_PREPARED_STATEMENTS"] = False' in caplog.text


# -- an idle worker ----------------------------------------------------------------------


def test_an_idle_listening_worker_polls_rarely_yet_runs_a_scheduled_job_when_due(run_worker):
    due = enqueue("qa.outcome", {"do": "return"}, queue="idle", delay=3.0)
    enqueued = time.monotonic()
    worker = run_worker(["idle"], poll_interval=0.2, sweep_interval=60)
    dispatcher = worker.worker._dispatcher
    claims = []
    claim = dispatcher.store.claim
    dispatcher.store.claim = lambda *args, **kwargs: (claims.append(1), claim(*args, **kwargs))[1]
    wait_until(lambda: status(due.id) == "completed", timeout=15)
    assert 3.0 <= time.monotonic() - enqueued < 3.0 + 1.0
    # Polling every POLL_INTERVAL (0.2 s) would have claimed about 15 times meanwhile;
    # an idle worker that hears NOTIFYs looks when the scheduled job is due.
    assert len(claims) <= 4, len(claims)
    looked = len(claims)
    time.sleep(2.0)
    assert len(claims) - looked <= 1


def test_a_refused_listen_does_not_end_the_listener(run_worker, monkeypatch):
    from psycopg import errors as pg

    from django_pgqueue.store.worker import Store

    listen = Store.listen
    calls = []

    def refused_once(store):
        calls.append(1)
        if len(calls) == 1:
            raise pg.QueryCanceled("canceling statement due to statement timeout")
        listen(store)

    monkeypatch.setattr(Store, "listen", refused_once)
    worker = run_worker(["lq"], poll_interval=0.1)
    wait_until(lambda: worker.worker._dispatcher.claims.listening, timeout=10)
    assert len(calls) == 2


def test_an_exception_out_of_the_pipeline_is_a_write_in_doubt(monkeypatch):
    """psycopg's pipeline exit once raised IndexError: not a crash, a write in doubt (the
    COMMIT may have happened), on a fresh connection."""
    import contextlib

    from django_pgqueue.exceptions import DatabaseUnavailable
    from django_pgqueue.store.worker import Store

    job = enqueue("qa.outcome", {"do": "return"}, queue="pipe")
    store = Store("default", "broken pipeline")
    try:
        (row,) = store.claim("pipe", 1, "w", 30)
        conn = store.raw
        pipeline = conn.pipeline

        @contextlib.contextmanager
        def breaks_on_exit():
            with pipeline() as pipe:
                yield pipe
            raise IndexError("pop from an empty deque")

        monkeypatch.setattr(conn, "pipeline", breaks_on_exit)
        done = [(job.id, row.lease_version, row.attempt_id, None)]
        with pytest.raises(DatabaseUnavailable, match="pipeline"):
            store.complete_and_claim(done, "pipe", 1, "w", 30)
        assert not store.connected
        # It did land: the read-back of writes in doubt finds it.
        assert store.attempt_statuses([row.attempt_id]) == {row.attempt_id: "succeeded"}
    finally:
        store.close()
