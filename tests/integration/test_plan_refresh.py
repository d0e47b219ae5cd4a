"""A worker's prepared statements plan again as the tables grow.

PostgreSQL keeps a prepared statement's generic plan until ANALYZE or VACUUM; one made
on nearly empty tables is a sequential scan, kept for ever with autovacuum off. A
worker's store discards its plans when the tables doubled since they were made.
"""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

from django_pgqueue import enqueue_many
from django_pgqueue.store.connection import connection_params
from django_pgqueue.store.session import PLAN_CHECK, PLAN_CHECK_REFUSED
from django_pgqueue.store.worker import Store
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


def sweep_plan(store: Store) -> set[str]:
    """The scans of the job tables in the plan the store's prepared sweep runs now."""
    return prepared_plan(store, "lease_sweep", "1000")


def prepared_plan(store: Store, statement: str, arguments: str) -> set[str]:
    """The scans of the job tables in the plan the store's prepared `statement` runs now
    with `arguments` (the text between EXECUTE's parentheses)."""
    conn = store.raw
    [(name,)] = conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
        [f"-- name: {statement}\n%"],
        prepare=False,
    ).fetchall()
    query = f'EXPLAIN (FORMAT JSON) EXECUTE "{name}"({arguments})'
    [(plan,)] = conn.execute(query, prepare=False).fetchall()
    found: set[str] = set()

    def walk(node: dict) -> None:
        if node.get("Relation Name") in ("queue_job_state", "queue_attempts"):
            found.add(f"{node['Node Type']} on {node['Relation Name']}")
        for child in node.get("Plans", []):
            walk(child)

    walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return found


def whole(plan: set[str]) -> set[str]:
    """The sequential scans of a plan: the tables it reads whole."""
    return {scan for scan in plan if scan.startswith("Seq Scan")}


def plan_choices(store: Store) -> tuple[int, int]:
    """How many times the store's prepared sweep ran on its generic plan, and how many
    times it was planned for the call (custom plans), since it was prepared."""
    [(generic, custom)] = store.raw.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '-- name: lease_sweep%%'",
        prepare=False,
    ).fetchall()
    return generic, custom


def grow(jobs: int) -> None:
    """`jobs` jobs, three in four finished with an attempt each, as after a drain."""
    for start in range(0, jobs, 20_000):
        enqueue_many([("qa.noop", None)] * min(20_000, jobs - start), queue="grown")
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now(), attempts = 1, "
        "lease_version = 1 WHERE queue = 'grown' AND job_id % 4 <> 0"
    )
    sql(
        "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status, "
        "finished_at) SELECT job_id, 1, 1, 'w', 'succeeded', now() FROM queue_job_state "
        "WHERE queue = 'grown' AND status = 'completed'"
    )


def never_analyzed() -> None:
    """Empty job tables that were never analyzed, whatever earlier tests left.

    A test that rolled back its rows leaves the files as large as it made them, and its
    ANALYZE's row count stays in pg_class (written in place, never rolled back): the
    planner would take the "empty" tables for 100,000 rows. TRUNCATE gives them new,
    empty files (no row count); pg_statistic outlives it, so its rows go too."""
    sql("TRUNCATE queue_attempts, queue_job_state, queue_jobs CASCADE")
    sql(
        "DELETE FROM pg_statistic WHERE starelid IN "
        "('queue_jobs'::regclass, 'queue_job_state'::regclass, 'queue_attempts'::regclass)"
    )


def test_plans_made_on_empty_tables_are_made_again_once_they_grew():
    never_analyzed()
    old, fresh = Store("default", "planned small"), Store("default", "planned big")
    try:
        assert old.refresh_plans(0.0) is False  # the size its plans are made at
        for _ in range(8):  # past the five custom plans: the generic plan is kept
            old.sweep()
        small = sweep_plan(old)
        grow(60_000)
        for _ in range(8):
            fresh.sweep()
        wanted = sweep_plan(fresh)
        # A fresh session finds the swept jobs' attempts by their index.
        assert "Seq Scan on queue_attempts" not in wanted
        autovacuum = sql("SELECT current_setting('autovacuum')")[0][0] == "on"
        if not autovacuum:  # nothing replaced the old plan meanwhile
            assert sweep_plan(old) == small
            assert whole(small) - whole(wanted)  # it reads tables the fresh one does not
        assert old.refresh_plans(old._plan_check_due) is True  # grew: plans discarded
        for _ in range(8):
            old.sweep()
        # Planned again: it reads no table whole that the fresh session's plan does not.
        assert not whole(sweep_plan(old)) - whole(wanted)
        # Prepared again, it chose between custom and generic plans as the fresh session
        # did: kept with its history (DISCARD PLANS), it weighed the generic plan of the
        # grown tables against custom plans of the empty ones, and was planned again at
        # every call (twice the fresh session's time). Where autovacuum runs, an ANALYZE
        # between the two sessions' sweeps gives them other statistics to choose by.
        if not autovacuum:
            assert plan_choices(old) == plan_choices(fresh)
        assert old.refresh_plans(old._plan_check_due) is False  # no growth since
    finally:
        old.close()
        fresh.close()


def test_plans_are_made_again_once_one_table_grew_beside_a_large_other():
    """A queue filled before its workers start: a large queue_job_state beside an empty
    queue_attempts. The completion's plan made then reads queue_attempts whole, and did at
    every claim cycle while the attempts grew: the two tables' sum was far from doubled."""
    never_analyzed()
    for _ in range(3):
        enqueue_many([("qa.noop", None)] * 20_000, queue="filled")
    store = Store("default", "planned on a filled queue")
    # No job has these ids: the completion writes nothing, its plan is what is looked at.
    nothing = [(0, 1, 0, None)]
    completion = "'{0}', '{\"0\": 1}', '{}', '{0}'"
    try:
        assert store.refresh_plans(0.0) is False  # the sizes its plans are made at
        for _ in range(8):  # past the five custom plans: the generic plan is kept
            store.complete(nothing)
        assert "Seq Scan on queue_attempts" in prepared_plan(store, "job_complete", completion)
        both = "SELECT pg_relation_size('queue_job_state') + pg_relation_size('queue_attempts')"
        before = sql(both)[0][0]
        sql(
            "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status) "
            "SELECT job_id, 1, 1, 'w', 'running' FROM queue_job_state WHERE job_id % 3 = 0"
        )
        assert sql(both)[0][0] < 2 * before  # the sum did not double; queue_attempts did
        assert store.refresh_plans(store._plan_check_due) is True
        for _ in range(8):
            store.complete(nothing)
        assert "Seq Scan on queue_attempts" not in prepared_plan(store, "job_complete", completion)
    finally:
        store.close()


def test_a_running_worker_plans_again_soon_after_a_burst_grew_the_tables(run_worker, monkeypatch):
    """A worker that made its plans on empty tables discards them a few looks after a
    burst grew the tables, without waiting for a sweep or a heartbeat (an hour and five
    minutes away here): a plan of empty tables reads them whole at every claim.
    """
    never_analyzed()
    discarded = threading.Event()
    refresh = Store.refresh_plans

    def spied(self: Store, now: float) -> bool:
        done = refresh(self, now)
        if done and self.application_name.startswith("pgqueue worker"):
            discarded.set()
        return done

    monkeypatch.setattr(Store, "refresh_plans", spied)
    # It serves another queue than the one the tables grow by: the same tables.
    worker = run_worker(["burst"], sweep_interval=3600, lease=900)
    enqueue_many([("qa.noop", None)] * 20, queue="burst")
    deadline = time.monotonic() + 120  # a hang guard
    while sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0] < 20:
        assert time.monotonic() < deadline, "the worker did not run the first jobs"
        time.sleep(0.05)
    assert not discarded.is_set()  # its plans were made on the empty tables
    grow(60_000)
    assert discarded.wait(120), "the worker kept the plans it made on empty tables"
    worker.stop()


def test_a_refused_look_at_the_tables_size_is_tried_again_after_a_pause():
    """A look PostgreSQL refuses (here: a table locked by a long ALTER or VACUUM FULL)
    is not tried again, and logged again, at every PLAN_CHECK while the cause lasts."""
    store = Store("default", "probe refused")
    locker = psycopg.connect(**connection_params("default", "table locker"), autocommit=True)
    try:
        assert store.refresh_plans(0.0) is False  # the size its plans are made at
        store.raw.execute("SET lock_timeout = '100ms'", prepare=False)
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE queue_attempts IN ACCESS EXCLUSIVE MODE")
        now = store._plan_check_due
        with pytest.raises(psycopg.errors.LockNotAvailable):
            store.refresh_plans(now)
        # Still locked: the looks due at the usual pace send nothing.
        for later in (PLAN_CHECK, 10 * PLAN_CHECK, PLAN_CHECK_REFUSED - PLAN_CHECK):
            assert store.refresh_plans(now + later) is False
        locker.execute("ROLLBACK")
        # The pause over, it looks again, and then at the usual pace.
        assert store.refresh_plans(now + PLAN_CHECK_REFUSED) is False
        assert store._plan_check_due == now + PLAN_CHECK_REFUSED + PLAN_CHECK
    finally:
        locker.close()
        store.close()
