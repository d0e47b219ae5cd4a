"""The worker's invariant, finding by finding (issue 12): the database side. Whatever
PostgreSQL refuses or loses (a write, a claim's answer, a renewal, a prepared
statement, a pipeline), every claimed job ends with an attempt saying why, and a
successful job is never dead because of a transient error. Handler threads and
timeouts: test_worker_threads.py."""

from __future__ import annotations

import pytest

from django_pgqueue import enqueue
from django_pgqueue.models import Attempt, JobState
from tests.conftest import sql
from tests.integration.test_worker import wait_until, write_claimed

pytestmark = pytest.mark.django_db(transaction=True)


def status(job_id: int) -> str:
    return JobState.objects.get(pk=job_id).status


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
    from django_pgqueue.outcomes import MAX_RETRY_DELAY, Retry, Success

    jobs = [enqueue("qa.outcome", {"do": "return"}, queue="far") for _ in range(3)]
    outcomes = {
        jobs[0].id: Retry("RetryLater", "in a long while", "", delay=1e13),
        jobs[1].id: Retry("ValueError", "soon", "", delay=float("inf")),
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
    job = enqueue("qa.sleep", {"seconds": 5.0}, queue="beat")
    worker = run_worker(["beat"], lease=4.5, heartbeat_interval=1.5)
    wait_until(lambda: status(job.id) == "running")
    wait_until(lambda: len(worker.worker.heartbeat_gaps) >= 1, timeout=120)
    # Only this test database's: other test processes share the server.
    sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name LIKE 'pgqueue heartbeat %%' AND datname = current_database()"
    )
    wait_until(lambda: status(job.id) == "completed", timeout=120)
    gaps = list(worker.worker.heartbeat_gaps)
    assert len(gaps) >= 2
    # One interval (1.5 s) and a reconnect, not two intervals (3 s and a reconnect):
    # 1 s is left for the reconnect and a stall of the loaded machine.
    assert max(gaps) < 2.5, gaps
    assert worker.worker.heartbeat_gaps.maxlen is not None


def test_an_idle_heartbeat_that_loses_its_connection_reconnects(run_worker, monkeypatch):
    """Idle, the heartbeat's first statement of a cycle is its look at the tables' size:
    a lost connection there must not end the thread (leases would go unrenewed)."""
    from django_pgqueue.store import session

    monkeypatch.setattr(session, "PLAN_CHECK", 0.05)  # look at every cycle
    worker = run_worker(["idlebeat"], lease=1.5, heartbeat_interval=0.2)

    def heartbeat_pids() -> list[int]:
        rows = sql(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            [f"pgqueue heartbeat {worker.worker.worker_id}"],
        )
        return [pid for (pid,) in rows]

    wait_until(lambda: len(heartbeat_pids()) == 1, timeout=120)
    [before] = heartbeat_pids()
    sql("SELECT pg_terminate_backend(%s)", [before])
    wait_until(lambda: heartbeat_pids() not in ([], [before]), timeout=120)
    # Alive and renewing: a job longer than the lease keeps it, and completes once.
    job = enqueue("qa.sleep", {"seconds": 2.5}, queue="idlebeat")
    wait_until(lambda: status(job.id) == "completed", timeout=120)
    assert Attempt.objects.filter(job_id=job.id).count() == 1
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


def test_an_application_name_in_options_does_not_hide_the_workers_sessions():
    """OPTIONS["application_name"] once replaced the worker's own connection names, so
    monitoring queries (LIKE 'pgqueue worker %') found no worker. The worker's name
    comes first now, the project's name after it."""
    from django.db import connections

    from django_pgqueue.store.worker import Store

    options = connections["default"].settings_dict["OPTIONS"]
    options["application_name"] = "shop-web"
    store = Store("default", "pgqueue worker host-1")
    try:
        (name,) = store.raw.execute("SELECT current_setting('application_name')").fetchone()
    finally:
        store.close()
        del options["application_name"]
    assert name == "pgqueue worker host-1 (shop-web)"


def test_a_long_worker_name_is_cut_to_63_bytes_on_a_character_boundary():
    from django_pgqueue.store.connection import session_name

    name = session_name("pgqueue worker " + "é" * 40, "shop")
    assert len(name.encode()) <= 63
    assert name.startswith("pgqueue worker é")
    assert session_name("pgqueue worker a", None) == "pgqueue worker a"
