"""The fenced statements, driven directly through Store on real connections."""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import partial

import psycopg
import pytest
from django.db import connection

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.outcomes import Dead, Retry
from django_pgqueue.store.operator import retry_jobs
from django_pgqueue.worker_config import WorkerConfig
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


def state(job_id: int) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM queue_job_state WHERE job_id = %s", [job_id])
        columns = [c.name for c in cursor.description]
        return dict(zip(columns, cursor.fetchone(), strict=True))


def attempts(job_id: int) -> list[tuple]:
    return sql(
        "SELECT lease_version, attempt_index, status, worker_id, error_class FROM queue_attempts "
        "WHERE job_id = %s ORDER BY lease_version",
        [job_id],
    )


def test_eight_threads_claim_2000_jobs_each_exactly_once(stores):
    enqueue_many([("qa.noop", {"n": i}) for i in range(2_000)], queue="race")
    claimed: list[list[int]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def claimer(n: int) -> None:
        store = stores(f"claimer-{n}")
        store.connect()
        barrier.wait()
        while True:
            rows = store.claim("race", 10, f"w{n}", 30)
            if not rows:
                return
            assert len(rows) <= 10
            claimed[n].extend(row.job_id for row in rows)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [job for batch in claimed for job in batch]
    assert len(everything) == 2_000
    assert len(set(everything)) == 2_000
    assert sum(1 for batch in claimed if batch) >= 4  # the work was really shared
    assert sql("SELECT count(*) FROM queue_attempts")[0][0] == 2_000
    assert sql("SELECT count(DISTINCT locked_by) FROM queue_job_state")[0][0] >= 4


def test_claim_takes_the_highest_priority_then_the_oldest(stores):
    low = enqueue("qa.noop", queue="p", priority=-5)
    high = enqueue("qa.noop", queue="p", priority=50)
    mid_old = enqueue("qa.noop", queue="p")
    mid_new = enqueue("qa.noop", queue="p")
    later = enqueue("qa.noop", queue="p", priority=100, delay=3600)
    store = stores()
    order = [store.claim("p", 1, "w", 30)[0].job_id for _ in range(4)]
    assert order == [high.id, mid_old.id, mid_new.id, low.id]
    assert store.claim("p", 10, "w", 30) == []  # `later` is not due
    assert state(later.id)["status"] == "pending"


def test_claim_sets_lease_owner_and_opens_an_attempt(stores):
    job = enqueue("qa.noop", {"x": 1}, queue="q")
    row = stores().claim("q", 5, "worker-a", 12.5)[0]
    assert (row.job_id, row.type, row.payload, row.attempt, row.lease_version) == (
        job.id,
        "qa.noop",
        '{"x": 1}',
        1,
        1,
    )
    s = state(job.id)
    assert s["status"] == "running"
    assert s["locked_by"] == "worker-a"
    (lease_seconds,) = sql(
        "SELECT extract(epoch FROM locked_until - updated_at) FROM queue_job_state "
        "WHERE job_id = %s",
        [job.id],
    )[0]
    assert float(lease_seconds) == pytest.approx(12.5)
    assert attempts(job.id) == [(1, 1, "running", "worker-a", None)]


def test_claim_from_one_queue_never_touches_another(stores):
    enqueue_many([("qa.noop", i) for i in range(5)], queue="a")
    enqueue_many([("qa.noop", i) for i in range(5)], queue="b")
    rows = stores().claim("a", 100, "w", 30)
    assert len(rows) == 5
    assert {row.queue for row in rows} == {"a"}


def test_completion_with_an_old_lease_version_changes_nothing(stores):
    job = enqueue("qa.noop", queue="q")
    a, b = stores("a"), stores("b")
    first = a.claim("q", 1, "worker-a", 0.2)[0]
    time.sleep(0.4)  # the lease runs out on the database clock
    assert [r[0] for r in b.sweep()] == [job.id]
    second = b.claim("q", 1, "worker-b", 30)[0]
    assert second.lease_version > first.lease_version

    # The stale owner wakes up: every write it tries is rejected.
    assert a.complete([(job.id, first.lease_version, first.attempt_id, None)]) == set()
    assert a.renew([(job.id, first.lease_version)], 30) == set()
    assert (
        a.fail(
            job.id,
            first.lease_version,
            first.attempt_id,
            Dead("X", "stale", ""),
        )
        is None
    )
    assert a.release([(job.id, first.lease_version, first.attempt_id)]) == set()
    s = state(job.id)
    assert (s["status"], s["locked_by"], s["lease_version"]) == (
        "running",
        "worker-b",
        second.lease_version,
    )

    assert b.complete([(job.id, second.lease_version, second.attempt_id, '{"by": "b"}')]) == {
        job.id
    }
    assert state(job.id)["status"] == "completed"
    assert [(v, status) for v, _, status, _, _ in attempts(job.id)] == [
        (first.lease_version, "lost"),
        (second.lease_version, "succeeded"),
    ]
    assert (
        sql("SELECT result FROM queue_attempts WHERE status = 'succeeded'")[0][0] == '{"by": "b"}'
    )


def test_complete_and_claim_write_both_in_one_transaction(stores):
    first, second, third = (job.id for job in enqueue_many([("qa.noop", None)] * 3, queue="q"))
    store = stores()
    held = store.claim("q", 1, "w", 30)[0]
    assert held.job_id == first
    done = [(first, held.lease_version, held.attempt_id, '{"ok": 1}')]
    completed, claimed = store.complete_and_claim(done, "q", 5, "w", 30)
    assert completed == {first}
    assert sorted(row.job_id for row in claimed) == [second, third]
    assert state(first)["status"] == "completed"
    assert {state(second)["status"], state(third)["status"]} == {"running"}
    # A stale completion is fenced here too, and does not stop the claim.
    later = enqueue("qa.noop", queue="q").id
    completed, claimed = store.complete_and_claim(done, "q", 5, "w", 30)
    assert completed == set()
    assert [row.job_id for row in claimed] == [later]


def test_complete_and_claim_undo_both_when_one_is_refused(stores):
    first, second = (job.id for job in enqueue_many([("qa.noop", None)] * 2, queue="q"))
    store = stores()
    held = store.claim("q", 1, "w", 30)[0]
    done = [(first, held.lease_version, held.attempt_id, None)]
    with pytest.raises(psycopg.DataError):
        store.complete_and_claim(done, "q", 5, "w", float("inf"))  # no such lease
    # Neither landed: the completion is not half-written, the claim took nothing.
    assert state(first)["status"] == "running"
    assert state(second)["status"] == "pending"
    # The connection is still usable, and the writes go through apart.
    assert store.complete(done) == {first}
    assert [row.job_id for row in store.claim("q", 5, "w", 30)] == [second]


def test_sweep_never_touches_live_leases_and_marks_dead_when_attempts_are_spent(stores):
    live = enqueue("qa.noop", queue="q")
    last_try = enqueue("qa.noop", queue="q2", max_attempts=1)
    store = stores()
    store.claim("q", 1, "w", 30)
    store.claim("q2", 1, "w", 0.1)
    time.sleep(0.3)
    swept = store.sweep()
    assert [(job_id, status) for job_id, _, _, status in swept] == [(last_try.id, "dead")]
    assert state(live.id)["status"] == "running"
    dead = state(last_try.id)
    assert dead["status"] == "dead"
    assert dead["finished_at"] is not None
    assert "lease expired" in dead["last_error"]


def test_a_swept_job_keeps_its_place_in_line(stores):
    """A crashed worker's job runs again next, not after the backlog enqueued since."""
    first = enqueue("qa.noop", queue="q")
    store = stores()
    store.claim("q", 1, "crashed", 0.1)
    enqueue_many([("qa.noop", {}) for _ in range(5)], queue="q")
    run_at = state(first.id)["run_at"]
    time.sleep(0.3)
    assert [job_id for job_id, *_ in store.sweep()] == [first.id]
    assert (state(first.id)["status"], state(first.id)["run_at"]) == ("pending", run_at)
    assert [claimed.job_id for claimed in store.claim("q", 1, "rescuer", 30)] == [first.id]


def test_sweep_cannot_undo_a_completion_that_lands_after_it_looked(stores):
    """The completion holds the row lock; the sweep skips it, then re-checks status."""
    job = enqueue("qa.noop", queue="q")
    owner, sweeper = stores("owner"), stores("sweeper")
    row = owner.claim("q", 1, "owner", 0.1)[0]
    time.sleep(0.3)  # expired but not yet swept
    conn = owner.raw
    conn.autocommit = False
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                "UPDATE queue_job_state SET status = 'completed', locked_by = NULL, "
                "locked_until = NULL, finished_at = now() WHERE job_id = %s AND lease_version = %s "
                "AND status = 'running'",
                [job.id, row.lease_version],
            )
        assert sweeper.sweep() == []  # locked by the completing transaction: skipped
        conn.commit()
    finally:
        conn.autocommit = True
    assert sweeper.sweep() == []  # committed: no longer running
    assert state(job.id)["status"] == "completed"


def test_renew_extends_only_what_is_still_held(stores):
    jobs = enqueue_many([("qa.noop", i) for i in range(3)], queue="q")
    store = stores()
    rows = list(store.claim("q", 3, "w", 1))
    held = [(row.job_id, row.lease_version) for row in rows]
    store.complete([(rows[0].job_id, rows[0].lease_version, rows[0].attempt_id, None)])
    assert store.renew(held, 60) == {held[1][0], held[2][0]}
    (remaining,) = sql(
        "SELECT min(extract(epoch FROM locked_until - now())) FROM queue_job_state "
        "WHERE status = 'running'"
    )[0]
    assert float(remaining) > 55
    assert len(jobs) == 3


def test_release_hands_back_unstarted_jobs_without_spending_an_attempt(stores):
    job = enqueue("qa.noop", queue="q")
    store = stores()
    row = store.claim("q", 1, "w", 30)[0]
    assert store.release([(job.id, row.lease_version, row.attempt_id)]) == {job.id}
    s = state(job.id)
    assert (s["status"], s["attempts"], s["locked_by"], s["lease_version"]) == (
        "pending",
        0,
        None,
        1,
    )
    again = store.claim("q", 1, "w", 30)[0]
    assert (again.attempt, again.lease_version) == (1, 2)
    assert [status for _, _, status, _, _ in attempts(job.id)] == ["released", "running"]


def test_fail_retries_with_a_delay_then_dies_when_attempts_run_out(stores):
    job = enqueue("qa.noop", queue="q", max_attempts=2)
    store = stores()

    def fail(row, permanent=False):
        return store.fail(
            row.job_id,
            row.lease_version,
            row.attempt_id,
            (Dead if permanent else partial(Retry, delay=30))(
                "ValueError", f"attempt {row.attempt}", "Traceback ..."
            ),
        )

    row = store.claim("q", 1, "w", 30)[0]
    status, _ = fail(row)
    assert status == "pending"
    (delay,) = sql(
        "SELECT extract(epoch FROM s.run_at - a.finished_at) FROM queue_job_state s "
        "JOIN queue_attempts a ON a.job_id = s.job_id WHERE s.job_id = %s",
        [job.id],
    )[0]
    assert float(delay) == pytest.approx(30)
    sql("UPDATE queue_job_state SET run_at = now() WHERE job_id = %s", [job.id])
    row = store.claim("q", 1, "w", 30)[0]
    assert fail(row)[0] == "dead"
    assert [(status, err) for _, _, status, _, err in attempts(job.id)] == [
        ("failed", "ValueError"),
        ("failed", "ValueError"),
    ]


def test_permanent_failure_goes_straight_to_dead(stores):
    job = enqueue("qa.noop", queue="q", max_attempts=5)
    store = stores()
    row = store.claim("q", 1, "w", 30)[0]
    result = store.fail(
        job.id,
        row.lease_version,
        row.attempt_id,
        Dead("PermanentFailure", "no", ""),
    )
    assert result[0] == "dead"
    assert state(job.id)["attempts"] == 1


def test_several_sweepers_requeue_each_expired_job_exactly_once(stores):
    enqueue_many([("qa.noop", i) for i in range(300)], queue="q")
    store = stores()
    while store.claim("q", 100, "dead-worker", 0.1):
        pass
    time.sleep(0.3)
    swept: Counter[int] = Counter()
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def sweeper(n: int) -> None:
        try:
            mine = stores(f"sweeper-{n}")
            mine.connect()
            barrier.wait()
            while True:
                rows = mine.sweep(limit=25)
                if not rows:
                    return
                swept.update(row[0] for row in rows)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sweeper, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(swept) == 300
    assert set(swept.values()) == {1}
    assert sql("SELECT count(*) FROM queue_attempts WHERE status = 'lost'")[0][0] == 300
    assert sql("SELECT count(*) FROM queue_job_state WHERE status = 'pending'")[0][0] == 300


def test_lease_version_never_decreases_across_claim_sweep_release_and_operator_retry(stores):
    job = enqueue("qa.noop", queue="q", max_attempts=1)
    store = stores()
    versions = [state(job.id)["lease_version"]]
    row = store.claim("q", 1, "w", 0.1)[0]
    versions.append(state(job.id)["lease_version"])
    time.sleep(0.3)
    store.sweep()  # attempts spent: dead
    versions.append(state(job.id)["lease_version"])
    assert state(job.id)["status"] == "dead"
    assert retry_jobs("default", [job.id]) == {job.id}
    versions.append(state(job.id)["lease_version"])
    row = store.claim("q", 1, "w", 30)[0]
    versions.append(row.lease_version)
    store.release([(job.id, row.lease_version, row.attempt_id)])
    versions.append(state(job.id)["lease_version"])
    assert versions == sorted(versions)
    assert len(set(versions[:5])) == 5  # every change of ownership was a new generation


def test_operator_retry_of_two_dead_jobs_sharing_a_key_retries_the_newest(stores):
    first = enqueue("qa.noop", queue="k", idempotency_key="order-1")
    sql(
        "UPDATE queue_job_state SET status = 'dead', finished_at = now() WHERE job_id = %s",
        [first.id],
    )
    second = enqueue("qa.noop", queue="k", idempotency_key="order-1")
    sql(
        "UPDATE queue_job_state SET status = 'dead', finished_at = now() WHERE job_id = %s",
        [second.id],
    )
    assert retry_jobs("default", [first.id, second.id]) == {second.id}
    assert state(second.id)["status"] == "pending"
    assert state(first.id)["status"] == "dead"
    # And while the newest is live, the older cannot be retried past it.
    assert retry_jobs("default", [first.id]) == set()


def test_loader_refuses_text_after_a_statement():
    from django_pgqueue.sql import load

    with pytest.raises(ValueError, match="must end with"):
        load("-- name: a\nSELECT 1;\nSELECT 2\n-- name: b\nSELECT 3;")
    assert load("-- name: a\nSELECT 1;\n-- a section comment\n\n-- name: b\nSELECT 3;") == {
        "a": "-- name: a\nSELECT 1",
        "b": "-- name: b\nSELECT 3",
    }


@pytest.mark.parametrize("prepared", [True, False])
def test_worker_statements_are_prepared_unless_turned_off(stores, settings, prepared):
    settings.PGQUEUE = {"WORKER_PREPARED_STATEMENTS": prepared}
    enqueue_many([("qa.noop", None)] * 4, queue="prep")
    # The setting reaches a worker's stores through its config.
    store = stores(prepared=WorkerConfig.build(["prep"]).prepared_statements)
    claimed = store.claim("prep", 2, "w", 30) + store.claim("prep", 2, "w", 30)
    done = store.complete([(r.job_id, r.lease_version, r.attempt_id, None) for r in claimed])
    assert len(done) == 4
    with store.raw.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [text for (text,) in cursor.fetchall()]
    claim_text = "WITH candidates AS MATERIALIZED"
    if prepared:
        assert sum(claim_text in text for text in statements) == 1  # once, reused
        assert any("queue_attempts" in text and "completed" in text for text in statements)
    else:
        assert statements == []


def test_the_worker_claims_on_a_generic_plan_planned_once(stores):
    """Left to plan_cache_mode = auto, PostgreSQL planned the prepared claim again at
    every execution (about 0.25 ms of server time per claim): each of the worker's
    claims, alone or after completions, runs on the session's generic plan, and the
    setting ends with the claim's transaction."""
    enqueue_many([("qa.noop", None)] * 24, queue="plan")
    store = stores()
    held = [row for _ in range(8) for row in store.claim("plan", 1, "w", 30)]
    for _ in range(8):
        last = max(held, key=lambda row: row.order())
        done = [(last.job_id, last.lease_version, last.attempt_id, None)]
        after = (last.priority, last.run_at, last.job_id)
        _, claimed = store.complete_and_claim(done, "plan", 2, "w", 30, after=after)
        held += claimed
    assert len({row.job_id for row in held}) == 24
    with store.raw.cursor() as cursor:
        cursor.execute(
            "SELECT split_part(statement, E'\\n', 1), generic_plans, custom_plans "
            "FROM pg_prepared_statements"
        )
        plans = {name: (generic, custom) for name, generic, custom in cursor.fetchall()}
        cursor.execute("SELECT current_setting('plan_cache_mode')")
        assert cursor.fetchone() == ("auto",)
    assert plans["-- name: job_claim"] == (8, 0)
    assert plans["-- name: job_claim_after"] == (8, 0)


@pytest.mark.parametrize("prepared", [True, False])
def test_the_claims_take_their_jobs_on_a_plan_kept_for_the_session(stores, prepared):
    """pgqueue_claim, which every claim calls, plans its statement once per session and
    keeps the plan, with prepared statements and without (behind a pooler): a kept
    plan stays in the session's memory between claims, where a plan made for one call
    is freed after it."""
    enqueue_many([("qa.noop", None)] * 12, queue="kept")
    store = stores(prepared=prepared)

    def kept_plans() -> list[tuple[str, int]]:
        with store.raw.cursor() as cursor:
            cursor.execute(
                "SELECT name, count(*)::int FROM pg_backend_memory_contexts"
                " WHERE name IN ('CachedPlan', 'CachedPlanSource')"
                " AND ident LIKE 'WITH claimed AS (%%UPDATE queue_job_state AS state%%'"
                " GROUP BY name ORDER BY name"
            )
            return cursor.fetchall()

    claimed = store.claim("kept", 2, "w", 30)
    assert kept_plans() == [("CachedPlan", 1), ("CachedPlanSource", 1)]
    for _ in range(4):
        last = max(claimed, key=lambda row: row.order())
        claimed += store.claim("kept", 2, "w", 30, after=(last.priority, last.run_at, last.job_id))
    assert len({row.job_id for row in claimed}) == 10
    assert kept_plans() == [("CachedPlan", 1), ("CachedPlanSource", 1)]
