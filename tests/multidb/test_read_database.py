"""PGQUEUE["READ_DATABASE"]: queue_stats and the metrics read DATABASE's queues from it.

The "replica" is an alias on the primary's very database (conftest.py's
`replica_alias`): the figures are the same, and the query logs of each alias tell
where the reads went. Writes (requeue_dead) stay on the primary.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_pgqueue import enqueue
from django_pgqueue.metrics.collector import QueueCollector

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])


@pytest.fixture(autouse=True)
def read_from_replica(settings: Any, replica_alias: str) -> None:
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "QUEUE_DATABASES": {"q2.*": "queues2"},
        "READ_DATABASE": replica_alias,
        "METRICS_CACHE_SECONDS": 0,
    }


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_queue_stats_reads_the_primarys_queues_from_the_replica() -> None:
    enqueue("qa.noop", queue="mail")
    enqueue("qa.noop", queue="q2.bulk")

    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections["replica"]) as replica,
        CaptureQueriesContext(connections["queues2"]) as queues2,
    ):
        data = json.loads(run("queue_stats", "--json"))

    assert primary.captured_queries == []
    assert any("queue_job_state" in q["sql"] for q in replica.captured_queries)
    assert queues2.captured_queries  # READ_DATABASE stands for DATABASE only
    assert data["databases"]["default"]["read_from"] == "replica"
    assert data["databases"]["queues2"]["read_from"] == "queues2"
    rows = {(row["database"], row["queue"]): row["pending"] for row in data["queues"]}
    assert rows == {("default", "mail"): 1, ("queues2", "q2.bulk"): 1}


def test_the_metrics_read_from_the_replica_and_label_the_primary() -> None:
    enqueue("qa.noop", queue="mail")
    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections["replica"]) as replica,
    ):
        families = {family.name: family for family in QueueCollector().collect()}

    assert primary.captured_queries == []
    assert replica.captured_queries
    (sample,) = [s for s in families["pgqueue_jobs"].samples if s.labels["status"] == "pending"][:1]
    assert sample.labels == {"database": "default", "queue": "mail", "status": "pending"}


def test_writes_never_go_to_the_replica() -> None:
    job = enqueue("qa.noop", queue="mail", max_attempts=1)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "UPDATE queue_job_state SET status = 'dead', attempts = 1, lease_version = 1, "
            "finished_at = now() WHERE job_id = %s",
            [job.id],
        )
    with CaptureQueriesContext(connections["replica"]) as replica:
        out = run("requeue_dead", "--database", "default")
    assert out.startswith("default: 1 dead job matched.")
    assert replica.captured_queries == []
