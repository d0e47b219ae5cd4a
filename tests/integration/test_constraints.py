"""The database holds the invariants itself: writes that break one are refused."""

from __future__ import annotations

import pytest
from django.db import DataError, IntegrityError, NotSupportedError, transaction

from django_pgqueue import JobSpec, enqueue, enqueue_many
from tests.conftest import sql

pytestmark = pytest.mark.django_db


@pytest.fixture
def job_id() -> int:
    return enqueue("qa.noop", {"x": 1}, queue="c").id


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("status = 'paused'", "unknown status 'paused'"),
        ("priority = 101", "priority 101 is outside -100..100"),
        ("attempts = -1", "attempts -1"),
        ("attempts = 6", "attempts 6 / max_attempts 5"),
        ("max_attempts = 0", "max_attempts 0"),
        ("lease_version = -1", "lease_version -1 is negative"),
        ("status = 'running'", "a running row must have locked_by and locked_until"),
        ("locked_by = 'w', locked_until = now()", "a pending row must not have locked_by"),
        ("status = 'completed'", "a completed row must have finished_at"),
        ("finished_at = now()", "a pending row must not have finished_at"),
    ],
)
def test_job_state_invariants(job_id, assignment, message):
    with pytest.raises(IntegrityError, match=message), transaction.atomic():
        sql(f"UPDATE queue_job_state SET {assignment} WHERE job_id = %s", [job_id])


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("sequence_key = 's'", "a row with sequence_key 's' must have sequence_on_failure"),
        ("sequence_on_failure = 'hold'", "a row without sequence_key must not have"),
        ("sequence_key = 's', sequence_on_failure = 'stop'", "sequence_on_failure 'stop' is"),
    ],
)
def test_job_state_sequence_rule(job_id, assignment, message):
    # Checked by the same CHECK as the rest of the state row (one per statement).
    with pytest.raises(IntegrityError, match=message), transaction.atomic():
        sql(f"UPDATE queue_job_state SET {assignment} WHERE job_id = %s", [job_id])
    sql(
        "UPDATE queue_job_state SET sequence_key = 's', sequence_on_failure = 'continue' "
        "WHERE job_id = %s",
        [job_id],
    )
    checks = sql(
        "SELECT conname FROM pg_constraint "
        "WHERE conrelid = 'queue_job_state'::regclass AND contype = 'c'"
    )
    assert checks == [("queue_job_state_valid",)]


@pytest.mark.parametrize(
    "update",
    [
        "UPDATE queue_job_state SET queue = 'elsewhere' WHERE job_id = %s",
        "UPDATE queue_job_state SET job_id = job_id + 1000 WHERE job_id = %s",
        "UPDATE queue_jobs SET queue = 'elsewhere' WHERE id = %s",
        "UPDATE queue_jobs SET id = id + 1000 WHERE id = %s",
    ],
)
def test_state_and_job_cannot_disagree_on_the_queue(job_id, update):
    with pytest.raises(IntegrityError, match="id and queue never change"), transaction.atomic():
        sql(update, [job_id])


def test_every_insert_path_writes_the_job_with_its_state_row():
    """The state row's job is held by construction (migration 0008): no orphan either way."""

    enqueue("qa.noop", queue="a")
    enqueue("qa.noop", queue="b", idempotency_key="k")
    enqueue("qa.noop", queue="b", idempotency_key="k")  # the holder: nothing written
    enqueue("qa.noop", queue="c", concurrency_key="ck", delay=60)
    enqueue_many([("qa.noop", i) for i in range(5)], queue="d")
    enqueue_many(
        [JobSpec("qa.noop", idempotency_key=f"k{i % 2}", concurrency_key="c") for i in range(4)],
        queue="e",
    )
    from django_pgqueue import Unique

    for unique in (Unique("u"), Unique("u", hold=60), Unique.debounce("d")):
        enqueue("qa.noop", queue="f", unique=unique)
        enqueue("qa.noop", queue="f", unique=unique)  # the holder (replaced): nothing new
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == 1 + 1 + 1 + 5 + 2 + 3
    orphans = sql(
        "SELECT count(*) FROM queue_job_state s FULL JOIN queue_jobs j ON j.id = s.job_id "
        "WHERE j.id IS NULL OR s.job_id IS NULL OR j.queue <> s.queue"
    )[0][0]
    assert orphans == 0


def open_attempt(job_id: int) -> None:
    sql(
        "UPDATE queue_job_state SET status = 'running', attempts = 1, lease_version = 1, "
        "locked_by = 'w', locked_until = now() WHERE job_id = %s",
        [job_id],
    )
    sql(
        "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id) "
        "VALUES (%s, 1, 1, 'w')",
        [job_id],
    )


def test_deleting_jobs_deletes_their_state_and_attempts(job_id):
    other = enqueue("qa.noop", queue="c").id
    open_attempt(job_id)
    sql("DELETE FROM queue_jobs WHERE id = %s", [job_id])
    assert sql("SELECT job_id FROM queue_job_state") == [(other,)]
    assert sql("SELECT count(*) FROM queue_attempts")[0][0] == 0


@pytest.mark.django_db(transaction=True)
def test_every_claim_path_opens_attempts_only_for_its_state_rows(settings, stores):
    """An attempt's state row is held by construction (migration 0031): pgqueue_claim
    inserts the attempts of the rows its UPDATE returned, whichever claim walked them."""
    from django_pgqueue.conf import get_settings
    from django_pgqueue.store.rows import ClaimRequest
    from django_pgqueue.store.worker import Store

    settings.PGQUEUE = {**getattr(settings, "PGQUEUE", {}), "FAIR_QUEUES": {"fair": {}}}
    enqueue_many([("qa.noop", i) for i in range(4)], queue="plain")
    for n in range(4):
        enqueue("qa.noop", n, queue="keyed", concurrency_key=f"k{n % 2}")
    enqueue_many([JobSpec("qa.noop", n, fairness_key=f"f{n % 2}") for n in range(4)], queue="fair")
    plain = stores()
    controlled = Store("default", "controlled", view_every=get_settings().POLL_INTERVAL / 2)
    fair = stores("fair", fair_queues={"fair": {}})
    try:
        first = plain.claim("plain", 2, "w", 30)
        # the plain claim resumed after the last row it took (job_claim_after)
        last = max(first, key=lambda row: row.job_id)
        plain.claim("plain", 2, "w", 30, (last.priority, last.run_at, last.job_id))
        controlled.claim("keyed", 4, "w", 30)
        fair.claims.claim(None, ClaimRequest("fair", 4, "w", 30.0))
    finally:
        controlled.close()
    opened = sql(
        "SELECT s.queue, count(*) FROM queue_attempts a "
        "JOIN queue_job_state s ON s.job_id = a.job_id "
        "AND s.lease_version = a.lease_version AND s.status = 'running' GROUP BY s.queue"
    )
    assert dict(opened) == {"plain": 4, "keyed": 2, "fair": 4}
    orphans = sql(
        "SELECT count(*) FROM queue_attempts a LEFT JOIN queue_job_state s USING (job_id) "
        "WHERE s.job_id IS NULL"
    )[0][0]
    assert orphans == 0
    assert sql("SELECT count(*) FROM queue_attempts")[0][0] == 10


def test_only_the_claim_inserts_attempts():
    """What the construction of 0031 rests on: no other function of the schema, statement
    of sql/ or Python module writes an attempt (the claim's is checked above)."""
    from pathlib import Path

    import django_pgqueue

    pattern = "insert into queue_attempts"
    functions = sql(
        "SELECT p.proname FROM pg_proc AS p "
        "WHERE p.pronamespace = current_schema()::regnamespace AND p.prosrc ILIKE %s",
        [f"%{pattern}%"],
    )
    assert functions == [("pgqueue_claim",)]
    package = Path(django_pgqueue.__file__).parent
    writers = [
        path.relative_to(package).as_posix()
        for path in [*package.glob("sql/*.sql"), *package.rglob("*.py")]
        if pattern in path.read_text().lower() and "migrations" not in path.parts
    ]
    assert writers == []


def test_deleting_state_rows_deletes_their_attempts(job_id):
    other = enqueue("qa.noop", queue="c").id
    open_attempt(job_id)
    open_attempt(other)
    sql("DELETE FROM queue_job_state WHERE job_id = %s", [job_id])
    assert sql("SELECT job_id FROM queue_attempts") == [(other,)]


def test_an_attempts_job_never_changes(job_id):
    other = enqueue("qa.noop", queue="c").id
    open_attempt(job_id)
    with (
        pytest.raises(IntegrityError, match="an attempt's job never changes"),
        transaction.atomic(),
    ):
        sql("UPDATE queue_attempts SET job_id = %s WHERE job_id = %s", [other, job_id])


def test_truncating_state_rows_without_their_attempts_is_refused(job_id):
    open_attempt(job_id)
    with pytest.raises(IntegrityError, match="truncate queue_attempts"), transaction.atomic():
        sql(
            "TRUNCATE queue_jobs, queue_job_state, queue_job_deps, queue_workflow_steps, "
            "queue_batch_jobs, queue_job_steps, queue_event_waits"
        )
    sql(
        "TRUNCATE queue_jobs, queue_job_state, queue_attempts, queue_job_deps, "
        "queue_workflow_steps, queue_batch_jobs, queue_job_steps, queue_event_waits"
    )


def test_truncating_jobs_alone_is_refused(job_id):
    # The workflow, batch and durable tables' foreign keys refuse it first; without
    # them, the trigger would.
    with (
        pytest.raises(
            NotSupportedError,
            match=r"queue_job_deps|queue_batch_jobs|queue_job_steps|queue_event_waits",
        ),
        transaction.atomic(),
    ):
        sql("TRUNCATE queue_jobs")
    with pytest.raises(IntegrityError, match="truncate queue_job_state"), transaction.atomic():
        sql(
            "TRUNCATE queue_jobs, queue_job_deps, queue_workflow_steps, queue_batch_jobs, "
            "queue_job_steps, queue_event_waits"
        )


@pytest.mark.parametrize(
    ("queue", "type_", "message"),
    [
        ("bad queue", "qa.noop", "queue name 'bad queue'"),
        ("q", "9starts-with-digit", "job type '9starts-with-digit'"),
    ],
)
def test_job_shape_is_checked(queue, type_, message):
    with pytest.raises(IntegrityError, match=message), transaction.atomic():
        sql(
            "INSERT INTO queue_jobs (queue, type, payload) VALUES (%s, %s, '{}')",
            [queue, type_],
        )


def test_overlong_names_are_refused_by_the_column_type():
    with pytest.raises(DataError, match="too long"), transaction.atomic():
        sql(
            "INSERT INTO queue_jobs (queue, type, payload) VALUES (%s, 'qa.noop', '{}')", ["q" * 64]
        )


def test_attempt_invariants(job_id):
    insert = (
        "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status, "
        "finished_at) VALUES (%s, %s, %s, 'w', %s, {})"
    )
    for params, finished, message in [
        ((1, 1, "bogus"), "now()", "unknown status 'bogus'"),
        ((0, 1, "failed"), "now()", "must be >= 1"),
        ((1, 1, "running"), "now()", "a running attempt must not have finished_at"),
        ((1, 1, "failed"), "NULL", "a failed attempt must have finished_at"),
    ]:
        with pytest.raises(IntegrityError, match=message), transaction.atomic():
            sql(insert.format(finished), [job_id, *params])


def test_attempts_unique_per_lease_version(job_id):
    insert = (
        "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status) "
        "VALUES (%s, 1, 1, 'w', 'running')"
    )
    sql(insert, [job_id])
    with (
        pytest.raises(IntegrityError, match="queue_attempts_job_lease_unique"),
        transaction.atomic(),
    ):
        sql(insert, [job_id])


def test_deleting_a_job_takes_its_state_and_attempts(job_id):
    sql(
        "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status) "
        "VALUES (%s, 1, 1, 'w', 'running')",
        [job_id],
    )
    sql("DELETE FROM queue_jobs WHERE id = %s", [job_id])
    assert sql("SELECT count(*) FROM queue_job_state WHERE job_id = %s", [job_id]) == [(0,)]
    assert sql("SELECT count(*) FROM queue_attempts WHERE job_id = %s", [job_id]) == [(0,)]
