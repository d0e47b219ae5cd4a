"""The controlled claim's plan: the same ordered walk of the claim index, never a sort."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from django_pgqueue.sql import QUERIES
from tests.integration.test_claim_plan import load_jobs, nodes

pytestmark = pytest.mark.django_db


def controlled_plan(queue: str = "payments", limit: int = 20) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_controls (queue, concurrency_limit, key_limit, rate_count, "
            "rate_period, keyed) VALUES (%s, 50, 1, 1000, 1.0, true) ON CONFLICT DO NOTHING",
            [queue],
        )
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + QUERIES["job_claim_controlled"],
            {
                "queue": queue,
                "limit": limit,
                "scan": limit * 8,
                "read": 10_000,
                "worker_id": "x",
                "lease": 30.0,
            },
        )
        plan = cursor.fetchone()[0]
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def walk_scan(plan: dict) -> dict:
    for node in nodes(plan):
        if node.get("Subplan Name") == "CTE walk":
            scans = [n for n in nodes(node) if "Relation Name" in n]
            assert scans, node
            return scans[0]
    raise AssertionError("no walk CTE in the plan")


@pytest.mark.parametrize(
    ("finished", "waiting"),
    [(0, 0), (40_000, 0), (0, 200_000)],
    ids=["pending", "finished", "waiting"],
)
def test_controlled_claim_walks_the_claim_index_without_sorting(finished, waiting):
    """Also with 200,000 waiting workflow steps in the table (in no claim index)."""
    load_jobs(pending=50_000, finished=finished, waiting=waiting)
    plan = controlled_plan()
    scan = walk_scan(plan)
    assert (scan["Node Type"], scan["Index Name"]) == ("Index Scan", "queue_job_state_claim_idx")
    kinds = {node["Node Type"] for node in nodes(plan)}
    assert "Seq Scan" not in kinds
    # The walk of the pending jobs is never sorted: the only sorts are of the walked
    # jobs (at most `scan`, ranked by key and type, then put back in walk order) and of
    # the running jobs' keys.
    sorts = [node for node in nodes(plan) if node["Node Type"] in ("Sort", "Incremental Sort")]
    for sort in sorts:
        below = {n.get("Index Name") for n in nodes(sort)}
        assert "queue_job_state_claim_idx" not in below, sort


def test_the_plain_claim_is_unchanged_but_for_leaving_keyed_jobs():
    """Queues without controls pay nothing: job_claim has no trace of queue control but
    one test per row it walks, that the row has no concurrency key (keyed jobs are left
    to job_claim_controlled)."""
    claim = QUERIES["job_claim"].replace("AND concurrency_key IS NULL", "", 1)
    claim = "\n".join(line for line in claim.splitlines() if not line.strip().startswith("--"))
    for word in ("queue_controls", "concurrency_key", "cancel_requested"):
        assert word not in claim
