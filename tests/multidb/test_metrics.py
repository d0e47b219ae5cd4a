"""The metrics with queues on two databases: a `database` label, and one
`pgqueue_database_up` per database, a down one reading 0 while the others are reported."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgqueue import enqueue
from django_pgqueue.metrics.collector import QueueCollector

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])


@pytest.fixture(autouse=True)
def routed(settings: Any) -> None:
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "QUEUE_DATABASES": {"q2.*": "queues2"},
        "METRICS_CACHE_SECONDS": 0,
    }


def samples(name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(sample.labels.values()): sample.value
        for family in QueueCollector().collect()
        if family.name == name
        for sample in family.samples
    }


def test_every_queue_family_names_its_database() -> None:
    enqueue("qa.noop", queue="mail")
    for _ in range(2):
        enqueue("qa.noop", queue="q2.bulk")

    assert samples("pgqueue_database_up") == {("default",): 1, ("queues2",): 1}
    jobs = samples("pgqueue_jobs")
    assert jobs["default", "mail", "pending"] == 1
    assert jobs["queues2", "q2.bulk", "pending"] == 2
    assert ("default", "q2.bulk", "pending") not in jobs
    assert samples("pgqueue_jobs_due")[("queues2", "q2.bulk")] == 2
    assert set(samples("pgqueue_workers")) == {
        (alias, state) for alias in ("default", "queues2") for state in ("alive", "gone")
    }


def test_a_down_database_reads_0_and_the_others_are_still_reported(
    settings: Any, down_alias: str
) -> None:
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "QUEUE_DATABASES": {"q2.*": "queues2", "gone.*": down_alias},
    }
    enqueue("qa.noop", queue="q2.bulk")

    assert samples("pgqueue_database_up") == {("default",): 1, ("queues2",): 1, ("down",): 0}
    jobs = samples("pgqueue_jobs")
    assert jobs["queues2", "q2.bulk", "pending"] == 1
    assert not [labels for labels in jobs if labels[0] == "down"]
