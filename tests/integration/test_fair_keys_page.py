"""The admin's page of a fair queue's keys reads a bounded part of the tables."""

from __future__ import annotations

import json

import pytest

from django_pgqueue.admin.fair_keys import COUNT_CAP, KEYS_PER_PAGE, SAMPLE, SHARE_MINUTES
from django_pgqueue.sql import QUERIES
from django_pgqueue.store import operator
from tests.conftest import sql
from tests.integration.test_fair_claims import insert_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def load(keys: int, backlog: int, started: int) -> None:
    """`keys` keys of one pending job each, a key "a" of `backlog` jobs, and `started`
    of A's jobs running (an attempt each)."""
    insert_jobs("fq-page", keys + backlog, backlog=backlog)
    sql(
        """
        WITH taken AS (
            SELECT job_id FROM queue_job_state WHERE fair_key = 'a' ORDER BY job_id LIMIT %s
        )
        SELECT count(*) FROM pgqueue_claim(
            ARRAY(SELECT job_id FROM taken), 'fq-page', 'w', 600, NULL)
        """,
        [started],
    )
    sql("ANALYZE queue_job_state")
    sql("ANALYZE queue_attempts")


def test_the_keys_page_reads_its_page_of_keys_with_index_scans_only():
    load(keys=20_000, backlog=20_000, started=3_000)
    params = {
        "queue": "fq-page",
        "after": "t010000",
        "limit": KEYS_PER_PAGE + 1,
        "cap": COUNT_CAP,
        "sample": SAMPLE,
        "minutes": SHARE_MINUTES,
    }
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(QUERIES["stats_no_jit"])
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["fair_keys_page"], params
        )
        (plan,) = cursor.fetchone()
    plan = plan if isinstance(plan, list) else json.loads(plan)

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    every = list(nodes(plan[0]["Plan"]))
    assert not [n for n in every if n["Node Type"] == "Seq Scan"], every
    top = plan[0]["Plan"]
    # 51 probes of the fair index, 51 counts of one job, the running rows (3,000) read
    # once, the newest 2,000 attempts each joined by primary key: ~10,000 pages at most,
    # not the 40,000 jobs.
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 15_000, top
    assert top["Actual Rows"] == KEYS_PER_PAGE + 1

    first = operator.fair_keys("default", "fq-page", None, 3, COUNT_CAP, SAMPLE, SHARE_MINUTES)
    assert [k.key for k in first] == ["a", "t020001", "t020002"]
    a = first[0]
    assert (a.due, a.later, a.running) == (COUNT_CAP, 0, 3_000)  # 17,000 due, capped
    # A's starts are the sample's: the newest 2,000 attempts, all A's.
    assert (a.starts, a.all_starts) == (SAMPLE, SAMPLE)
