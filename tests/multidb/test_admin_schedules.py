"""The admin's Schedules pages with queues on two databases: a schedule lives on its
queue's database; the list shows one database at a time, and a schedule's page, its
edits, enable/disable and "run now" read and write that database only."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue.models import Schedule, ScheduleTick
from tests.factories import make_user
from tests.multidb.conftest import jobs

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

LIST = reverse("admin:django_pgqueue_schedule_changelist")
ADD = reverse("admin:django_pgqueue_schedule_add")
FORM = {"type": "qa.noop", "cron": "0 3 * * *", "every": "", "timezone": "UTC",
        "catch_up": "once", "payload": "{}", "priority": "0", "max_attempts": "",
        "enabled": "on"}  # fmt: skip


def page(name: str) -> str:
    return reverse("admin:django_pgqueue_schedule_change", args=[name])


def schedule(alias: str, name: str, queue: str, **fields: Any) -> Schedule:
    fields = {"cron": "0 6 * * *", "timezone": "UTC", **fields}
    return Schedule.objects.using(alias).create(name=name, type="qa.noop", queue=queue, **fields)


@pytest.fixture
def boss(client: Any) -> Any:
    user = make_user("boss", "view_schedule", "change_schedule", "add_schedule",
                     "delete_schedule", "run_schedule", "view_job")  # fmt: skip
    client.force_login(user)
    return client


def enabled(alias: str, name: str) -> bool:
    return Schedule.objects.using(alias).get(pk=name).enabled


def test_the_list_shows_one_database_and_its_actions_write_there(boss: Any) -> None:
    schedule("default", "nightly", "mail")
    schedule("queues2", "nightly", "q2.work")  # the same name on each database
    schedule("queues2", "hourly", "q2.work")

    html = boss.get(LIST).content.decode()
    assert "hourly" not in html
    assert f'href="{LIST}?database=queues2"' in html
    html = boss.get(LIST, {"database": "queues2"}).content.decode()
    assert "hourly" in html
    assert 'data-database="queues2"' in html

    # Disable, then run now, on the list of queues2: written there only.
    selected = {"_selected_action": ["nightly"]}
    boss.post(f"{LIST}?database=queues2", {"action": "disable", **selected})
    assert not enabled("queues2", "nightly")
    assert enabled("default", "nightly")
    response = boss.post(
        f"{LIST}?database=queues2", {"action": "run_now_action", **selected}, follow=True
    )
    assert jobs("queues2") == [("q2.work", "qa.noop")]
    assert jobs("default") == []
    assert "?database=queues2" in response.content.decode()  # the job, linked where it is


def test_a_schedules_page_and_its_edit_are_on_its_database(boss: Any) -> None:
    schedule("default", "nightly", "mail")
    there = schedule("queues2", "nightly", "q2.work", cron=None, every=dt.timedelta(minutes=5))
    url = f"{page('nightly')}?database=queues2"
    html = boss.get(url).content.decode()
    assert "every 5m" in html
    ScheduleTick.objects.using("queues2").create(
        schedule=there, tick_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC), job_id=12345
    )
    assert "job #12345" in boss.get(url).content.decode()

    with CaptureQueriesContext(connections["default"]) as default_queries:
        response = boss.post(url, {**FORM, "queue": "q2.work", "cron": "30 4 * * *"})
    assert response.status_code == 302
    assert Schedule.objects.using("queues2").get(pk="nightly").cron == "30 4 * * *"
    assert Schedule.objects.using("default").get(pk="nightly").cron == "0 6 * * *"
    assert not any("queue_schedules" in q["sql"] for q in default_queries.captured_queries)

    # Moving it to a queue of another database is refused: that database's workers fire it.
    response = boss.post(url, {**FORM, "queue": "mail"})
    assert response.status_code == 200
    assert "The queue &#x27;mail&#x27; lives on the database &#x27;default&#x27;" in (
        response.content.decode()
    )


def test_a_new_schedule_is_written_on_its_queues_database(boss: Any) -> None:
    schedule("default", "nightly", "mail")
    response = boss.post(ADD, {**FORM, "name": "nightly", "queue": "q2.work"})
    assert response.status_code == 302
    assert response["Location"] == f"{LIST}?database=queues2"
    assert Schedule.objects.using("queues2").get(pk="nightly").queue == "q2.work"
    assert Schedule.objects.using("default").get(pk="nightly").queue == "mail"
    # A name taken on that database is refused there.
    response = boss.post(ADD, {**FORM, "name": "nightly", "queue": "q2.other"})
    assert "A schedule named &#x27;nightly&#x27; exists already on the database" in (
        response.content.decode()
    )


def test_a_bad_database_is_refused(boss: Any) -> None:
    assert boss.get(LIST, {"database": "nope"}).status_code == 400
    assert boss.get(page("x"), {"database": "nope"}).status_code == 400


def test_a_schedule_deleted_from_its_page_opened_by_hand_is_deleted_on_its_database(
    boss: Any,
) -> None:
    schedule("default", "nightly", "mail")
    schedule("queues2", "nightly", "q2.work")  # the same name on each database
    html = boss.get(f"{page('nightly')}?database=queues2").content.decode()
    delete = reverse("admin:django_pgqueue_schedule_delete", args=["nightly"])
    # The page's links (delete, save and its redirects) keep the page's database.
    assert f'href="{delete}?_changelist_filters=database%3Dqueues2"' in html
    boss.post(f"{delete}?_changelist_filters=database%3Dqueues2", {"post": "yes"})
    assert not Schedule.objects.using("queues2").filter(pk="nightly").exists()
    assert Schedule.objects.using("default").filter(pk="nightly").exists()
