"""The at-a-glance counts (`stats_by_queue`: the admin's panel, queue_stats, the metrics
view) read their partial indexes at any size: never the state table whole.

A table of 200,000 finished jobs and a few thousand pending, dead and cancelled ones,
analyzed, is enough for the planner to show its hand: a count that cannot use its
partial index reads the table with a sequential scan (at 1,000,000 jobs, 150 ms a
queue against 1.4 ms; benchmarks/admin_pages.py measures that size).
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from django_pgqueue.sql import QUERIES
from tests.integration.test_claim_plan import nodes

pytestmark = pytest.mark.django_db


def load(finished: int, failed: int, pending: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH ids AS (
                SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id, n
                FROM generate_series(1, %(total)s) AS n
            ), jobs AS (
                INSERT INTO queue_jobs (id, queue, type, payload, created_at)
                SELECT id, (ARRAY['payments', 'email', 'reports'])[1 + n %% 3], 'qa.noop',
                       '{}'::jsonb, now()
                FROM ids
            )
            INSERT INTO queue_job_state (job_id, queue, status, priority, run_at, attempts,
                                         max_attempts, lease_version, updated_at, finished_at,
                                         last_error)
            SELECT id, (ARRAY['payments', 'email', 'reports'])[1 + n %% 3],
                   CASE WHEN n <= %(finished)s THEN 'completed'
                        WHEN n <= %(finished)s + %(failed)s
                        THEN (ARRAY['dead', 'cancelled'])[1 + n %% 2]
                        ELSE 'pending' END,
                   0, now(), 1, 5, 1, now(),
                   CASE WHEN n <= %(finished)s + %(failed)s THEN now() END,
                   CASE WHEN n > %(finished)s AND n <= %(finished)s + %(failed)s
                        THEN 'E: failed' END
            FROM ids
            """,
            {"total": finished + failed + pending, "finished": finished, "failed": failed},
        )
        cursor.execute("ANALYZE queue_job_state")
        cursor.execute("ANALYZE queue_jobs")


def test_the_queue_counts_never_read_the_state_table_whole():
    load(finished=200_000, failed=4_000, pending=3_000)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + QUERIES["stats_by_queue"], {"cap": 10_000})
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    whole = [
        node
        for node in nodes(plan[0]["Plan"])
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "queue_job_state"
    ]
    assert whole == []
