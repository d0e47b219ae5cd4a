"""The Batches admin page through Django's test client: counts, state, callbacks."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from django_pgqueue import batch, enqueue, enqueue_many, step
from django_pgqueue.actions import cancel
from tests.conftest import sql
from tests.factories import make_user

pytestmark = pytest.mark.django_db

LIST = reverse("admin:django_pgqueue_batch_changelist")
Q = "batch-admin"


def text(response) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_the_list_shows_each_batch_with_its_counts_state_and_callbacks(client):
    with batch(name="nightly import", on_finish=step("qa.noop", queue=Q)) as running:
        enqueue_many([("qa.noop", n) for n in range(3)], queue=Q)
    with batch(
        name="one cancelled",
        on_success=step("qa.noop", queue=Q),
        on_discard=step("qa.noop", queue=Q),
    ) as discarded:
        doomed = enqueue("qa.noop", queue=Q).id
    assert cancel([doomed]).changed == [doomed]
    client.force_login(make_user("viewer", "view_batch"))
    response = client.get(LIST)
    assert response.status_code == 200
    page = text(response)
    # name, state, progress, members, callbacks (after their workflow)
    assert re.search(
        rf"nightly import #{running.id} running 0 / 3 3 unfinished workflow #\d+ : "
        r"on_finish waiting",
        page,
    )
    assert re.search(
        rf"one cancelled #{discarded.id} discarded 1 / 1 1 cancelled workflow #\d+ : "
        r"on_success cancelled on_discard pending",
        page,
    )
    html = response.content.decode()
    for job_id in (*running.callbacks.values(), *discarded.callbacks.values()):
        assert reverse("admin:django_pgqueue_job_change", args=[job_id]) in html
    assert "Add batch" not in page  # read-only


def test_the_list_needs_the_view_permission(client):
    client.force_login(make_user("nobody"))
    assert client.get(LIST).status_code == 403


def test_a_page_of_batches_costs_a_fixed_number_of_queries(client, django_assert_max_num_queries):
    for n in range(5):
        with batch(name=f"b{n}", on_finish=step("qa.noop", queue=Q)):
            enqueue("qa.noop", queue=Q)
    client.force_login(make_user("viewer", "view_batch"))
    client.get(LIST)
    with django_assert_max_num_queries(8):
        assert client.get(LIST).status_code == 200
    assert sql("SELECT count(*) FROM queue_batches")[0][0] == 5


def test_a_batchs_callbacks_link_to_their_workflow_which_links_back(client):
    with batch(name="linked", on_finish=step("qa.noop", queue=Q)) as run:
        enqueue("qa.noop", queue=Q)
    with batch(name="another one"):
        enqueue("qa.noop", queue=Q)
    workflow_id = sql("SELECT workflow_id FROM queue_batches WHERE id = %s", [run.id])[0][0]
    client.force_login(make_user("viewer", "view_job"))
    workflow_url = reverse("admin:django_pgqueue_workflow_change", args=[workflow_id])
    assert workflow_url in client.get(LIST).content.decode()
    page = client.get(workflow_url).content.decode()
    assert f'href="{LIST}?id={run.id}"' in page
    assert f"batch linked #{run.id}" in page
    listed = text(client.get(f"{LIST}?id={run.id}"))
    assert "1 batch" in listed  # the link filters the list to the batch
    assert "another one" not in listed
