"""With one queue database the pages that can show several offer no database choice,
and their links carry no ``database`` parameter: nothing visible changes."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_pgqueue import Workflow, batch, enqueue, step
from django_pgqueue.models import Schedule
from tests.factories import OPERATOR_PERMISSIONS, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def test_no_database_choice_and_no_database_in_links(client) -> None:
    client.force_login(make_user("boss", *OPERATOR_PERMISSIONS, "view_schedule"))
    flow = Workflow("solo")
    flow.add("a", step("qa.noop", queue="solo"))
    run = flow.enqueue()
    with batch(name="solo-batch", on_finish=step("qa.noop", queue="solo")):
        enqueue("qa.noop", queue="solo")
    Schedule.objects.create(name="solo", type="qa.noop", queue="solo", cron="0 6 * * *",
                            timezone="UTC")  # fmt: skip
    pages = [
        reverse("admin:django_pgqueue_workflow_changelist"),
        reverse("admin:django_pgqueue_workflow_change", args=[run.id]),
        reverse("admin:django_pgqueue_batch_changelist"),
        reverse("admin:django_pgqueue_schedule_changelist"),
        reverse("admin:django_pgqueue_schedule_change", args=["solo"]),
        reverse("admin:django_pgqueue_minutestats_changelist"),
        reverse("admin:django_pgqueue_job_change", args=[run.jobs["a"]]),
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert "pgqueue-database-choice" not in html, url
        assert "database=" not in html, url
        assert "By database" not in html, url
