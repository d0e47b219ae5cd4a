"""The claim statement's plan: an ordered walk of the claim index, never a sort."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import connection

from django_pgqueue.sql import QUERIES
from tests.plans import execute_args, prepare

pytestmark = pytest.mark.django_db


def load_jobs(pending: int, finished: int = 0, analyze: bool = True, waiting: int = 0) -> None:
    """Insert jobs fast, spread over three queues, in the test's transaction.

    `waiting` jobs (a workflow's steps whose dependencies have not finished) come last.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH ids AS (
                SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id, n
                FROM generate_series(1, %(total)s) AS n
            ), jobs AS (
                INSERT INTO queue_jobs (id, queue, type, payload, created_at)
                SELECT id, (ARRAY['payments', 'email', 'reports'])[1 + n %% 3], 'qa.noop',
                       jsonb_build_object('n', n), now()
                FROM ids
            )
            INSERT INTO queue_job_state (job_id, queue, status, priority, run_at, attempts,
                                         max_attempts, lease_version, updated_at, finished_at)
            SELECT id, (ARRAY['payments', 'email', 'reports'])[1 + n %% 3],
                   CASE WHEN n <= %(finished)s THEN 'completed'
                        WHEN n > %(finished)s + %(pending)s THEN 'waiting'
                        ELSE 'pending' END,
                   (n %% 5) - 2, now() - make_interval(secs => n %% 1000), 0, 5, 0, now(),
                   CASE WHEN n <= %(finished)s THEN now() END
            FROM ids
            """,
            {"total": pending + finished + waiting, "finished": finished, "pending": pending},
        )
        if analyze:
            cursor.execute("ANALYZE queue_job_state")
            cursor.execute("ANALYZE queue_jobs")


def claim_plan(
    queue: str = "payments",
    limit: int = 20,
    analyze: bool = False,
    generic: bool = False,
    guarded: bool = True,
    **after: object,
) -> dict:
    """The claim's plan for these values; with `generic`, the plan the worker runs on:
    its prepared statement's generic plan (claim_plan_generic), built without them.
    With `guarded=False`, the generic plan PostgreSQL builds without that statement's
    other settings (sequential scans and sorts allowed)."""
    name = "job_claim_after" if after else "job_claim"
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    params = {"queue": queue, "limit": limit, "worker_id": "explain", "lease": 30.0, **after}
    with connection.cursor() as cursor:
        if not generic:
            cursor.execute(f"EXPLAIN ({options}) " + QUERIES[name], params)
            plan = cursor.fetchone()[0]
        else:
            names = prepare(cursor, "generic_claim", QUERIES[name])
            try:
                # Local settings last to the end of the test's transaction: set each.
                cursor.execute(QUERIES["claim_plan_generic"])
                if not guarded:
                    cursor.execute("SET LOCAL enable_seqscan = on")
                    cursor.execute("SET LOCAL enable_sort = on")
                cursor.execute(
                    f"EXPLAIN ({options}) EXECUTE generic_claim({execute_args(names)})",
                    [params[n] for n in names],
                )
                plan = cursor.fetchone()[0]
            finally:
                cursor.execute("DEALLOCATE generic_claim")
    plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    if generic:  # built without the values: the walk's bounds are parameters
        scan = candidate_scan(plan)
        assert "$1" in scan.get("Index Cond", "") + scan.get("Filter", ""), plan
    return plan


def nodes(plan: dict) -> list[dict]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child))
    return found


def candidate_scan(plan: dict) -> dict:
    """The scan of queue_job_state under the candidates CTE (the LockRows -> Limit
    subtree)."""
    for node in nodes(plan):
        if node.get("Subplan Name") == "CTE candidates":
            scans = [
                n
                for n in nodes(node)
                if "Scan" in n["Node Type"] and n.get("Relation Name") == "queue_job_state"
            ]
            assert scans, node
            return scans[0]
    raise AssertionError("no candidates CTE in the plan")


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_claim_on_50k_pending_jobs_walks_the_claim_index_without_sorting(generic):
    load_jobs(pending=50_000)
    plan = claim_plan(generic=generic)
    scan = candidate_scan(plan)
    assert scan["Node Type"] == "Index Scan"
    assert scan["Index Name"] == "queue_job_state_claim_idx"
    assert "Sort" not in {node["Node Type"] for node in nodes(plan)}
    assert "Bitmap Heap Scan" not in {node["Node Type"] for node in nodes(plan)}


@pytest.mark.parametrize("after", [False, True], ids=["job_claim", "job_claim_after"])
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_waiting_jobs_cost_the_claim_nothing(generic, after):
    """200,000 waiting jobs beside 3,000 pending, interleaved with them in claim order:
    the claim (and the resumed claim the worker sends most) walks the claim index, which
    holds no waiting row, and reads only the rows it takes."""
    load_jobs(pending=3_000, waiting=200_000)
    # The resumed walk from the start of priority 0 (the waiting rows have every priority).
    keys = {"after_priority": 0, "after_run_at": "2000-01-01", "after_job_id": 0} if after else {}
    plan = claim_plan(generic=generic, analyze=True, **keys)
    scan = candidate_scan(plan)
    assert (scan["Node Type"], scan["Index Name"]) == ("Index Scan", "queue_job_state_claim_idx")
    assert "Sort" not in {node["Node Type"] for node in nodes(plan)}
    assert scan["Actual Rows"] == 20
    assert scan.get("Rows Removed by Filter", 0) == 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM queue_job_state WHERE status = 'waiting'")
        assert cursor.fetchone()[0] == 200_000


@pytest.mark.parametrize("after", [False, True], ids=["job_claim", "job_claim_after"])
def test_a_generic_plan_built_on_an_empty_table_still_walks_the_claim_index(after):
    """A worker builds the claim's generic plan at its first claim and keeps it while the
    table grows (until ANALYZE or VACUUM). Built on an empty table, PostgreSQL's own
    choice is a Seq Scan and a Sort; claim_plan_generic leaves it only the ordered walk."""
    with connection.cursor() as cursor:  # empty, here too (undone with the test)
        cursor.execute("TRUNCATE queue_attempts, queue_job_state, queue_jobs CASCADE")
        cursor.execute("ANALYZE queue_job_state")
    keys = {"after_priority": 0, "after_run_at": "2026-01-01", "after_job_id": 0} if after else {}
    plan = claim_plan(generic=True, **keys)
    scan = candidate_scan(plan)
    assert (scan["Node Type"], scan["Index Name"]) == ("Index Scan", "queue_job_state_claim_idx")
    types = {node["Node Type"] for node in nodes(plan)}
    assert not {"Sort", "Seq Scan"} & types, types
    # What the settings rule out: the plan PostgreSQL builds without them.
    plain = claim_plan(generic=True, guarded=False, **keys)
    assert {"Sort", "Seq Scan"} <= {node["Node Type"] for node in nodes(plain)}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_a_resumed_claim_starts_its_walk_at_the_key_it_is_given(generic):
    load_jobs(pending=30_000)
    with connection.cursor() as cursor:
        # The middle of priority 0 in the payments queue, in claim order.
        cursor.execute(
            "SELECT priority, run_at, job_id FROM queue_job_state"
            " WHERE queue = 'payments' AND priority = 0 ORDER BY run_at, job_id"
            " OFFSET 1000 LIMIT 1"
        )
        priority, run_at, job_id = cursor.fetchone()
    after = {"after_priority": priority, "after_run_at": run_at, "after_job_id": job_id}
    plan = claim_plan(generic=generic, **after)
    scan = candidate_scan(plan)
    assert (scan["Node Type"], scan["Index Name"]) == ("Index Scan", "queue_job_state_claim_idx")
    assert "Sort" not in {node["Node Type"] for node in nodes(plan)}
    # The key bounds the index scan itself (not a filter after it): the rows before it
    # are never read.
    assert "ROW(run_at, job_id) >" in scan["Index Cond"], scan
    assert "run_at" not in scan.get("Filter", ""), scan["Filter"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ARRAY(SELECT job_id FROM queue_job_state WHERE queue = 'payments'"
            " AND priority = 0 AND (run_at, job_id) > (%s, %s) ORDER BY run_at, job_id"
            " LIMIT 20)",
            [run_at, job_id],
        )
        expected = cursor.fetchone()[0]
        cursor.execute(
            QUERIES["job_claim_after"],
            {"queue": "payments", "limit": 20, "worker_id": "w", "lease": 30.0, **after},
        )
        claimed = sorted(row[0] for row in cursor.fetchall())
    assert len(expected) == 20
    assert claimed == sorted(expected)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_claim_plan_holds_with_finished_rows_and_stale_statistics(generic):
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queue_job_state")  # statistics of an empty table
    load_jobs(pending=20_000, finished=40_000, analyze=False)
    for queue in ("payments", "email", "reports"):
        scan = candidate_scan(claim_plan(queue, generic=generic))
        assert (scan["Node Type"], scan["Index Name"]) == (
            "Index Scan",
            "queue_job_state_claim_idx",
        )


def test_the_any_predicate_of_the_article_loses_the_ordered_walk():
    """Why the claim takes one queue: with = ANY the plan must sort (the article's finding)."""
    load_jobs(pending=50_000)
    any_claim = QUERIES["job_claim"].replace("= %(queue)s::text", "= ANY(%(queues)s::text[])")
    assert any_claim != QUERIES["job_claim"]
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + any_claim,
            {
                "queues": ["payments", "email"],
                "queue": "payments",  # pgqueue_claim's probe of the job rows
                "limit": 20,
                "worker_id": "x",
                "lease": 30.0,
            },
        )
        plan = cursor.fetchone()[0]
    plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    assert "Sort" in {node["Node Type"] for node in nodes(plan)}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_claim_plan_holds_when_most_rows_have_a_concurrency_key(generic):
    """job_claim leaves keyed jobs (concurrency_key IS NULL): with 99% of the rows keyed
    jobs of another queue (a null fraction of 0.01), the planner expects 1% of the
    unkeyed queue's rows to pass, and must still walk the claim index in order rather
    than read them all and sort."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH ids AS (
                SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id, n,
                       CASE WHEN n %% 100 = 0 THEN 'payments' ELSE 'email' END AS queue
                FROM generate_series(1, %(rows)s) AS n
            ), jobs AS (
                INSERT INTO queue_jobs (id, queue, type, payload, created_at)
                SELECT id, queue, 'qa.noop', '{}', now() FROM ids
            )
            INSERT INTO queue_job_state (job_id, queue, status, priority, run_at, attempts,
                                         max_attempts, lease_version, updated_at,
                                         concurrency_key)
            SELECT id, queue, 'pending', 0, now() - make_interval(secs => n %% 1000), 0, 5,
                   0, now(), CASE WHEN queue = 'email' THEN 'k' || n %% 50 END
            FROM ids
            """,
            {"rows": 100_000},
        )
        cursor.execute("ANALYZE queue_job_state")
    plan = claim_plan("payments", generic=generic)
    scan = candidate_scan(plan)
    assert (scan["Node Type"], scan["Index Name"]) == ("Index Scan", "queue_job_state_claim_idx")
    assert "Sort" not in {node["Node Type"] for node in nodes(plan)}


@pytest.mark.parametrize("guarded", [True, False], ids=["as-is", "sequential-scans-on"])
def test_pgqueue_claim_keeps_a_plan_of_key_probes_made_on_empty_tables(guarded):
    """The function that takes every claim's jobs plans its statement once per session
    (also without claim_plan_generic: a worker behind a pooler) and keeps the plan while
    the tables grow. Built on empty tables, the plan PostgreSQL would keep reads
    queue_job_state whole; the function runs with sequential scans off, so the kept
    plan probes the rows by primary key."""
    plans: list[str] = []
    with connection.cursor() as cursor:
        if not guarded:  # what the function's own setting rules out (undone with the test)
            cursor.execute(
                "ALTER FUNCTION pgqueue_claim(bigint[], text, text, float8, timestamptz) "
                "RESET enable_seqscan"
            )
        cursor.execute("TRUNCATE queue_attempts, queue_job_state, queue_jobs CASCADE")
        cursor.execute("ANALYZE queue_job_state")
        cursor.execute("ANALYZE queue_jobs")
        claim = {"queue": "payments", "limit": 20, "worker_id": "w", "lease": 30.0}
        cursor.execute(QUERIES["job_claim"], claim)  # planned here, on empty tables
        assert cursor.fetchall() == []
        load_jobs(pending=30_000, analyze=False)
        cursor.execute("LOAD 'auto_explain'")
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
            cursor.execute(f"SET LOCAL auto_explain.{setting}")

        def note(diagnostic: psycopg.errors.Diagnostic) -> None:
            plans.append(diagnostic.message_primary or "")

        connection.connection.add_notice_handler(note)
        try:
            cursor.execute(QUERIES["job_claim"], claim)
            assert len(cursor.fetchall()) == 20
        finally:
            connection.connection.remove_notice_handler(note)
    [taken] = [plan for plan in plans if "WITH claimed AS (" in plan]
    update = taken[taken.index("Update on queue_job_state") :].splitlines()[1]
    if guarded:
        assert "Index Scan using queue_job_state_pkey" in update, taken
        assert "Seq Scan" not in taken, taken
    else:
        assert "Seq Scan on queue_job_state" in update, taken
