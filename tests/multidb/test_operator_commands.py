"""queue_stats, requeue_dead and prune_queue_jobs over every queue database (two servers).

`default` is the suite's server, `queues2` the throwaway one of conftest.py; each test
puts jobs on both and checks what each command reads or changes on each.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from django_pgqueue import enqueue

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

ROUTED = {"q2.*": "queues2"}


@pytest.fixture(autouse=True)
def routed(settings: Any) -> None:
    settings.PGQUEUE = {**settings.PGQUEUE, "QUEUE_DATABASES": ROUTED}


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def job(queue: str, status: str = "pending", finished_ago: str = "10 days") -> int:
    """Enqueue a job (on its queue's database) and put it in `status`."""
    enqueued = enqueue("qa.noop", {"n": 1}, queue=queue, max_attempts=1)
    if status != "pending":
        alias = "queues2" if queue.startswith("q2.") else "default"
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "UPDATE queue_job_state SET status = %s, attempts = 1, lease_version = 1, "
                "finished_at = now() - %s::interval WHERE job_id = %s",
                [status, finished_ago, enqueued.id],
            )
    return enqueued.id


def statuses(alias: str) -> list[tuple[str, str]]:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT j.queue, s.status FROM queue_jobs j JOIN queue_job_state s "
            "ON s.job_id = j.id ORDER BY j.id"
        )
        return list(cursor.fetchall())


def test_queue_stats_reads_every_queue_database() -> None:
    for _ in range(2):
        job("mail")
    for _ in range(3):
        job("q2.bulk")
    job("q2.bulk", "dead")

    data = json.loads(run("queue_stats", "--json", "--exact"))

    rows = {(row["database"], row["queue"]): row for row in data["queues"]}
    assert set(rows) == {("default", "mail"), ("queues2", "q2.bulk")}
    assert rows["default", "mail"]["pending"] == 2
    assert rows["queues2", "q2.bulk"]["pending"] == 3
    assert rows["queues2", "q2.bulk"]["dead"] == 1
    assert data["totals"]["pending"] == 5
    assert data["jobs"] == 6
    sections = data["databases"]
    assert list(sections) == ["default", "queues2"]
    assert sections["queues2"]["up"] is True
    assert sections["queues2"]["totals"]["pending"] == 3
    assert sections["default"]["jobs"] == 2

    table = run("queue_stats").splitlines()
    assert table[0].split()[:3] == ["database", "queue", "pending"]
    assert any(line.split()[:3] == ["queues2", "q2.bulk", "3"] for line in table)
    assert any(line.split()[:3] == ["default", "mail", "2"] for line in table)

    only = json.loads(run("queue_stats", "--json", "--database", "queues2"))
    assert [row["queue"] for row in only["queues"]] == ["q2.bulk"]
    assert list(only["databases"]) == ["queues2"]
    with pytest.raises(CommandError, match="'elsewhere' holds no queues"):
        run("queue_stats", "--database", "elsewhere")


def test_requeue_dead_retries_on_each_database_or_the_one_named() -> None:
    job("mail", "dead")
    job("q2.bulk", "dead")
    job("q2.bulk", "dead")

    out = run("requeue_dead", "--database", "queues2")
    assert out.startswith("queues2: 2 dead jobs matched.")
    assert statuses("queues2") == [("q2.bulk", "pending")] * 2
    assert statuses("default") == [("mail", "dead")]  # not the database named

    job("q2.bulk", "dead")
    out = run("requeue_dead")
    lines = out.splitlines()
    assert lines[0].startswith("default: 1 dead job matched.")
    assert lines[1].startswith("queues2: 1 dead job matched.")
    assert statuses("default") == [("mail", "pending")]
    assert [status for _, status in statuses("queues2")] == ["pending"] * 3


def test_prune_queue_jobs_prunes_each_database_or_the_one_named() -> None:
    job("mail", "completed")
    job("q2.bulk", "completed")
    job("q2.bulk", "completed", finished_ago="1 hour")  # too recent
    job("q2.bulk")

    dry = run("prune_queue_jobs", "--older-than", "7d", "--dry-run")
    assert "default: Dry run: would delete 1 job" in dry
    assert "queues2: Dry run: would delete 1 job" in dry
    assert len(statuses("queues2")) == 3

    out = run("prune_queue_jobs", "--older-than", "7d", "--database", "queues2")
    assert out.startswith("queues2: Deleted 1 job")
    assert statuses("queues2") == [("q2.bulk", "completed"), ("q2.bulk", "pending")]
    assert statuses("default") == [("mail", "completed")]  # not the database named

    run("prune_queue_jobs", "--older-than", "7d")
    assert statuses("default") == []


def test_queue_stats_reports_a_down_database_and_shows_the_others(
    settings: Any, down_alias: str
) -> None:
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "QUEUE_DATABASES": {**ROUTED, "gone.*": down_alias},
    }
    job("q2.bulk")

    data = json.loads(run("queue_stats", "--json"))
    assert data["databases"]["down"]["up"] is False
    assert data["databases"]["down"]["error"]
    assert data["databases"]["queues2"]["up"] is True
    assert [(row["database"], row["queue"]) for row in data["queues"]] == [("queues2", "q2.bulk")]

    err = io.StringIO()
    call_command("queue_stats", stdout=io.StringIO(), stderr=err)
    assert err.getvalue().startswith("database down: not read:")
