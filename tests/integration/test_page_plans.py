"""Every statement behind the admin's jobs list, its dead-jobs list (each with the
at-a-glance panel) and the metrics view reads the state table through an index.

The pages run as a user sees them, through the test client; each statement they send
that reads a queue table is explained against a table the planner knows as large
(200,000 finished jobs and a few thousand pending, dead and cancelled ones, analyzed,
as in test_stats_plans), then with the planner's statistics saying five times as
many rows in the same pages (1,035,000 jobs, the size benchmarks/admin_pages.py times
the pages at): a statement that cannot use its partial index shows a sequential scan
of queue_job_state there.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_pgqueue.metrics import collector
from tests.integration.test_stats_plans import load
from tests.plans import statements

pytestmark = pytest.mark.django_db

PAGES = ("/admin/django_pgqueue/job/", "/admin/django_pgqueue/deadjob/", "/internal/metrics")


def test_the_statement_splitter_keeps_each_read_of_a_round_trip():
    text = (
        "-- name: a\nSELECT set_config('jit', 'off', true);\n"
        "-- name: b\nWITH x AS (SELECT 1)\nSELECT * FROM x"
    )
    assert statements(text) == [
        "SELECT set_config('jit', 'off', true)",
        "WITH x AS (SELECT 1)\nSELECT * FROM x",
    ]


@pytest.fixture
def staff_client(client):
    client.force_login(User.objects.create_superuser("ops", password=None))
    collector._readings.clear()  # the metrics view reads the database, not a cached reading
    yield client
    collector._readings.clear()


def scale_statistics(factor: int) -> None:
    """Make the planner count `factor` times the rows the queue tables and their indexes
    hold, in the same pages (the test's transaction undoes it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE pg_class SET reltuples = reltuples * %(factor)s
            WHERE oid IN ('queue_job_state'::regclass, 'queue_jobs'::regclass)
               OR oid IN (SELECT indexrelid FROM pg_index
                          WHERE indrelid IN ('queue_job_state'::regclass,
                                             'queue_jobs'::regclass))
            """,
            {"factor": factor},
        )


def whole_state_reads(client) -> tuple[list[str], list[str]]:
    """(every statement the pages sent that reads a queue table, those whose plan reads
    queue_job_state by a sequential scan, with the plan)."""
    explained = []
    whole = []
    for page in PAGES:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(page)
        assert response.status_code == 200, page
        for query in captured.captured_queries:
            for statement in statements(query["sql"]):
                if "queue_job" not in statement:
                    continue
                with connection.cursor() as cursor:
                    cursor.execute("EXPLAIN " + statement)
                    plan = "\n".join(row[0] for row in cursor.fetchall())
                explained.append(statement)
                if "Seq Scan on queue_job_state" in plan:
                    whole.append(f"{page}: {statement[:200]}\n{plan}")
    return explained, whole


def test_the_lists_the_panel_and_the_metrics_never_read_the_state_table_whole(staff_client):
    load(finished=200_000, failed=4_000, pending=3_000)
    explained, whole = whole_state_reads(staff_client)
    # The pages' own reads were seen: the panel's counts, the lists' rows and the metrics'.
    assert sum("queue_job_state" in text for text in explained) >= 5
    assert whole == []
    scale_statistics(5)
    collector._readings.clear()
    assert whole_state_reads(staff_client)[1] == []
