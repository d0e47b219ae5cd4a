"""The statements that write a batch of jobs do work in proportion to the batch.

A step that joins the batch's rows to another step of the same statement can become a
nested loop over both, the batch size squared: the completion once closed its attempts
that way (each finished job re-read every attempt id of the batch through the primary
key), the sweep once matched its expired leases that way (1,000 leases: 999,000 rows
compared, 150 ms). Each runs here on its generic plan, the one a worker keeps, over a
batch of BATCH jobs, and what it reads and compares is counted from EXPLAIN ANALYZE.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

from django_pgqueue import enqueue_many
from django_pgqueue.sql import QUERIES
from django_pgqueue.store.connection import connection_params
from tests.conftest import sql
from tests.integration.test_plan_refresh import grow, never_analyzed
from tests.plans import execute_args, prepare

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = 300
# Rows a join may compare per job of the batch: a few, never the batch.
PER_JOB = 10


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in nodes(child))]


def explain_generic(name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of `name`'s generic plan, run by EXPLAIN ANALYZE and rolled back."""
    with psycopg.connect(**connection_params("default", "batch plans")) as conn:
        cursor = psycopg.ClientCursor(conn)  # EXECUTE's arguments bound as literals
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        names = prepare(cursor, "probe", QUERIES[name])
        cursor.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe({execute_args(names)})",
            [params[n] for n in names],
        )
        [(plan,)] = cursor.fetchall()
        conn.rollback()
    return nodes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])


def claim_batch(lease: float) -> list[tuple[Any, ...]]:
    enqueue_many([("qa.noop", None)] * BATCH, queue="batch")
    rows = sql(
        QUERIES["job_claim"], {"queue": "batch", "limit": BATCH, "worker_id": "w", "lease": lease}
    )
    assert len(rows) == BATCH
    return rows


def assert_linear(found: list[dict[str, Any]]) -> None:
    """No array of the batch read once per row, no row compared with the whole batch."""
    repeated = [
        (node["Node Type"], node.get("Index Name"), node["Actual Loops"])
        for node in found
        if "ANY" in node.get("Index Cond", "") and node["Actual Loops"] > 1
    ]
    assert not repeated, f"an index walked with the batch's array once per row: {repeated}"
    joins = [node for node in found if node.get("Rows Removed by Join Filter")]
    compared = sum(node["Rows Removed by Join Filter"] for node in joins)
    assert compared <= PER_JOB * BATCH, f"{compared} rows compared for {BATCH} jobs: {joins}"


@pytest.mark.parametrize("name", ["job_complete", "job_release", "lease_renew"])
def test_a_batch_write_reads_each_row_once(name):
    # Tables as after a drain, never analyzed (autovacuum off): the planner's guesses.
    never_analyzed()
    grow(60_000)
    rows = claim_batch(lease=60)
    params = {
        "job_ids": [row[0] for row in rows],
        "owned": json.dumps({str(row[0]): row[7] for row in rows}),
        "results": "{}",
        "attempt_ids": [row[8] for row in rows],
        "lease": 60.0,
    }
    found = explain_generic(name, params)
    written = [node for node in found if node.get("Relation Name") == "queue_job_state"]
    assert max(node["Actual Rows"] for node in written) == BATCH  # every job of the batch
    assert_linear(found)


def test_a_sweep_compares_each_expired_lease_once():
    never_analyzed()  # the planner's guesses, whatever earlier tests left
    claim_batch(lease=0.001)
    time.sleep(0.01)  # every lease has run out
    found = explain_generic("lease_sweep", {"limit": BATCH})
    requeued = [node for node in found if node.get("Relation Name") == "queue_job_state"]
    assert max(node["Actual Rows"] for node in requeued) == BATCH
    assert_linear(found)
