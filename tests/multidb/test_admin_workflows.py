"""The admin's Workflows and Batches pages with queues on two databases: one database
at a time (``?database=``, kept in every link between the pages), read from its
replica if it has one, and a workflow cancelled on its own database only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue import Workflow, batch, enqueue, step
from django_pgqueue.models import JobState
from django_pgqueue.models import Workflow as Workflow_

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

WORKFLOWS = reverse("admin:django_pgqueue_workflow_changelist")
BATCHES = reverse("admin:django_pgqueue_batch_changelist")


def flow(name: str, queue: str, using: str | None = None) -> Any:
    """A two-step workflow `name` on `queue`, enqueued on `using`."""
    built = Workflow(name)
    built.add("first", step("qa.noop", {"n": 1}, queue=queue))
    built.add("second", step("qa.noop", {"n": 2}, queue=queue), after=["first"])
    return built.enqueue(using=using)


def statuses(alias: str, run: Any) -> set[str]:
    ids = list(run.jobs.values())
    return set(JobState.objects.using(alias).filter(pk__in=ids).values_list("status", flat=True))


def page(client: Any, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def test_the_list_shows_one_database_at_a_time_and_links_keep_it(operator_client: Any) -> None:
    flow("home-flow", "mail")
    there = flow("away-flow", "q2.work", using="queues2")

    html = page(operator_client, WORKFLOWS)
    assert "home-flow" in html
    assert "away-flow" not in html
    assert 'id="pgqueue-database-choice" data-database="default"' in html
    assert f'href="{WORKFLOWS}?database=queues2"' in html  # the other database, offered

    html = page(operator_client, WORKFLOWS + "?database=queues2")
    assert "away-flow" in html
    assert "home-flow" not in html
    change = reverse("admin:django_pgqueue_workflow_change", args=[there.id])
    assert f'href="{change}?database=queues2"' in html
    assert 'href="?database=queues2&amp;state=running"' in html  # the state filter keeps it

    # Its page: read on queues2, each step linked to its job there.
    html = page(operator_client, f"{change}?database=queues2")
    assert "Workflow away-flow" in html
    for job_id in there.jobs.values():
        job = reverse("admin:django_pgqueue_job_change", args=[job_id])
        assert f'href="{job}?database=queues2"' in html
    # The step's job page links back to the workflow on queues2.
    first = reverse("admin:django_pgqueue_job_change", args=[there.jobs["first"]])
    assert f'href="{change}?database=queues2"' in page(operator_client, f"{first}?database=queues2")


def test_cancel_is_written_on_the_chosen_database_only(operator_client: Any) -> None:
    here = flow("home-flow", "mail")
    there = flow("away-flow", "q2.work", using="queues2")
    # Whatever the ids, the default database has no workflow of queues2's id but its own.
    cancel = reverse("admin:django_pgqueue_workflow_cancel", args=[there.id])

    with CaptureQueriesContext(connections["default"]) as default_queries:
        response = operator_client.post(f"{cancel}?database=queues2")
    change = reverse("admin:django_pgqueue_workflow_change", args=[there.id])
    assert response.status_code == 302
    assert response["Location"] == f"{change}?database=queues2"
    assert statuses("queues2", there) == {"cancelled"}
    assert statuses("default", here) == {"pending", "waiting"}
    assert not any("queue_job_state" in q["sql"] for q in default_queries.captured_queries)
    html = page(operator_client, response["Location"])
    assert "Cancelled 2 step(s)" in html

    # Without ?database= the cancel is fenced on DATABASE: an id only queues2 has is
    # not found there, and queues2's workflow stays as it was.
    other = flow("away-again", "q2.work", using="queues2")
    while Workflow_.objects.filter(pk=other.id).exists():
        other = flow("away-again", "q2.work", using="queues2")
    missing = reverse("admin:django_pgqueue_workflow_cancel", args=[other.id])
    assert operator_client.post(missing).status_code == 404
    assert statuses("queues2", other) == {"pending", "waiting"}


def test_the_batches_list_shows_one_database_and_links_there(operator_client: Any) -> None:
    with batch(name="home-batch", on_finish=step("qa.noop", queue="mail")):
        enqueue("qa.noop", queue="mail")
    with batch(
        name="away-batch", on_finish=step("qa.noop", queue="q2.work"), using="queues2"
    ) as there:
        enqueue("qa.noop", queue="q2.work")

    html = page(operator_client, BATCHES)
    assert "home-batch" in html
    assert "away-batch" not in html
    html = page(operator_client, BATCHES + "?database=queues2")
    assert "away-batch" in html
    assert "home-batch" not in html
    links = re.findall(r'class="pgqueue-batch-workflow" href="([^"]+)"', html)
    assert len(links) == 1
    assert links[0].endswith("?database=queues2")
    callback = reverse("admin:django_pgqueue_job_change", args=[there.callbacks["on_finish"]])
    assert f'href="{callback}?database=queues2"' in html

    # The callbacks' workflow page links back to its batch on queues2.
    workflow_page = page(operator_client, links[0])
    back = re.search(
        r'class="pgqueue-workflow-batch" href="([^"]*database=queues2)"', workflow_page
    )
    assert back is not None
    assert "away-batch" in page(operator_client, back.group(1).replace("&amp;", "&"))


@pytest.mark.parametrize("url", [WORKFLOWS, BATCHES])
def test_a_bad_database_is_refused_naming_the_choices(operator_client: Any, url: str) -> None:
    response = operator_client.get(url + "?database=nope")
    assert response.status_code == 400
    cancel = reverse("admin:django_pgqueue_workflow_cancel", args=[1])
    assert operator_client.post(cancel + "?database=nope").status_code == 400


def test_a_replica_is_read_and_its_lag_shown(
    operator_client: Any, settings: Any, replica_alias: str
) -> None:
    settings.PGQUEUE = {**settings.PGQUEUE, "READ_DATABASE": replica_alias}
    run = flow("home-flow", "mail")
    change = reverse("admin:django_pgqueue_workflow_change", args=[run.id])
    for url in (WORKFLOWS, change, BATCHES):
        with CaptureQueriesContext(connections[replica_alias]) as replica:
            html = page(operator_client, url)
        assert replica.captured_queries, url
    for url in (WORKFLOWS, change, BATCHES):
        html = page(operator_client, url)
        assert "read from replica" in html, url
        assert 'class="pgqueue-staleness">not a replica<' in html  # the same database here
