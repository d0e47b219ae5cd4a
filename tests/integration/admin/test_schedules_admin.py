"""The Schedules admin page through Django's test client: list, edit, actions, permissions."""

from __future__ import annotations

import datetime as dt
import json
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_pgqueue.models import Schedule
from tests.conftest import sql
from tests.factories import make_user

pytestmark = pytest.mark.django_db

LIST = reverse("admin:django_pgqueue_schedule_changelist")
ADD = reverse("admin:django_pgqueue_schedule_add")
JOBS = reverse("admin:django_pgqueue_job_changelist")


def page(name: str) -> str:
    return reverse("admin:django_pgqueue_schedule_change", args=[name])


def schedule(name: str, **fields) -> Schedule:
    fields.setdefault("type", "qa.noop")
    fields.setdefault("timezone", "UTC")
    fields.setdefault("queue", "sched")
    if "every" not in fields:
        fields.setdefault("cron", "0 6 * * *")
    return Schedule.objects.create(name=name, **fields)


@pytest.fixture
def admin_client_(client):
    user = make_user("boss", "view_schedule", "change_schedule", "add_schedule",
                     "delete_schedule", "run_schedule", "view_job")  # fmt: skip
    client.force_login(user)
    return client


def act(client, action: str, *names: str):
    return client.post(LIST, {"action": action, "_selected_action": list(names)}, follow=True)


def test_list_shows_timing_next_and_last_run_and_source(admin_client_):
    next_tick = dt.datetime(2030, 1, 2, 6, tzinfo=dt.UTC)
    schedule("daily", next_tick=next_tick, last_tick=next_tick - dt.timedelta(days=1))
    schedule("fast", cron=None, every=dt.timedelta(seconds=30), source="code")
    # The page's text: a time is put under its date in a narrow column (two spans).
    text = re.sub(r"<[^>]+>", "", admin_client_.get(LIST).content.decode())
    for expected in ("daily", "At 06:00 every day (UTC)", "0 6 * * *",
                     "2030-01-02 06:00:00 UTC", "2030-01-01 06:00:00 UTC",
                     "every 30s", "code", "database"):  # fmt: skip
        assert expected in text


def test_a_schedules_page_has_buttons_that_need_their_permissions(client):
    from tests.factories import make_user

    schedule("daily", source="code")
    page = reverse("admin:django_pgqueue_schedule_change", args=["daily"])
    viewer = make_user("viewer", "view_schedule", "view_job")
    client.force_login(viewer)
    html = client.get(page).content.decode()
    assert "pgqueue-schedule-buttons" not in html
    # A POST without the permission is refused, whatever the page shows.
    assert client.post(page.replace("/change/", "/run-now/")).status_code == 403
    assert client.post(page.replace("/change/", "/disable/")).status_code == 403
    assert client.get(page.replace("/change/", "/disable/")).status_code == 405
    planner = make_user("planner", "view_schedule", "change_schedule", "run_schedule")
    client.force_login(planner)
    html = client.get(page).content.decode()
    assert ">Run now</button>" in html
    assert ">Disable</button>" in html
    response = client.post(page.replace("/change/", "/disable/"))
    assert response.status_code == 302
    assert response["Location"] == page
    assert not Schedule.objects.get(pk="daily").enabled
    assert (
        client.post(page.replace("daily", "nothing").replace("/change/", "/enable/")).status_code
        == 404
    )


def test_a_database_schedule_is_created_and_edited_with_validation(admin_client_):
    form = {"name": "nightly", "type": "qa.noop", "queue": "sched", "cron": "0 25 * * *",
            "every": "", "timezone": "Europe/Berlin", "catch_up": "once", "payload": "{}",
            "priority": "0", "max_attempts": "", "enabled": "on"}  # fmt: skip
    response = admin_client_.post(ADD, form)
    assert response.status_code == 200
    assert "invalid cron expression &#x27;0 25 * * *&#x27;: Bad hour" in response.content.decode()
    response = admin_client_.post(ADD, {**form, "cron": "0 3 * * *", "timezone": "Nowhere/X"})
    assert "unknown time zone" in response.content.decode()
    response = admin_client_.post(ADD, {**form, "cron": "0 3 * * *", "type": "qa.nobody"})
    assert "No handler serves the job type &#x27;qa.nobody&#x27;" in response.content.decode()
    response = admin_client_.post(ADD, {**form, "cron": "0 3 * * *"})
    assert response.status_code == 302
    created = Schedule.objects.get(name="nightly")
    assert (created.source, created.cron, created.timezone, created.next_tick) == (
        "db", "0 3 * * *", "Europe/Berlin", None
    )  # fmt: skip
    response = admin_client_.post(page("nightly"), {**form, "cron": "30 4 * * *"})
    assert response.status_code == 302
    assert Schedule.objects.get(name="nightly").cron == "30 4 * * *"


def test_a_code_schedule_is_read_only_and_cannot_be_deleted(admin_client_):
    schedule("from-code", source="code")
    response = admin_client_.get(page("from-code"))
    assert response.status_code == 200
    assert response.context["has_change_permission"] is False
    assert 'name="cron"' not in response.content.decode()
    posted = admin_client_.post(page("from-code"), {"cron": "* * * * *"})
    assert posted.status_code == 403
    delete = reverse("admin:django_pgqueue_schedule_delete", args=["from-code"])
    assert admin_client_.post(delete, {"post": "yes"}).status_code == 403
    assert Schedule.objects.get(name="from-code").cron == "0 6 * * *"


def test_disable_then_enable_restarts_at_the_next_tick(admin_client_):
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    schedule("daily", next_tick=old)
    act(admin_client_, "disable", "daily")
    assert Schedule.objects.get(name="daily").enabled is False
    act(admin_client_, "enable", "daily")
    enabled = Schedule.objects.get(name="daily")
    assert (enabled.enabled, enabled.next_tick) == (True, None)  # no catch-up for the time off


def test_run_now_enqueues_one_job_and_a_double_click_does_not_double_it(admin_client_):
    schedule("daily", payload={"report": "sales"})
    first = act(admin_client_, "run_now_action", "daily")
    second = act(admin_client_, "run_now_action", "daily")
    jobs = sql("SELECT type, queue, payload::text, idempotency_key FROM queue_jobs")
    assert jobs == [("qa.noop", "sched", '{"report": "sales"}', "schedule:daily@run-now")]
    assert "enqueued job" in first.content.decode()
    assert "still waiting or running" in second.content.decode()


def test_actions_need_their_permissions(client):
    schedule("daily")
    client.force_login(make_user("viewer", "view_schedule"))
    response = client.get(LIST)
    assert response.status_code == 200
    assert response.context["action_form"] is None or not [
        name for name, _ in response.context["action_form"].fields["action"].choices if name
    ]
    act(client, "run_now_action", "daily")
    act(client, "disable", "daily")
    assert sql("SELECT count(*) FROM queue_jobs") == [(0,)]
    assert Schedule.objects.get(name="daily").enabled is True
    client.force_login(make_user("changer", "view_schedule", "change_schedule"))
    names = [name for name, _ in client.get(LIST).context["action_form"].fields["action"].choices]
    assert "disable" in names
    assert "run_now_action" not in names


def test_late_schedules_show_in_queue_stats_json_the_glance_panel_and_the_list(admin_client_):
    schedule("stuck", next_tick=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    schedule("fine", next_tick=dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
    schedule("off", next_tick=dt.datetime(2020, 1, 1, tzinfo=dt.UTC), enabled=False)
    out = StringIO()
    call_command("queue_stats", "--json", stdout=out)
    late = json.loads(out.getvalue())["late_schedules"]
    assert [(row["name"], row["queue"], row["due_at"]) for row in late] == [
        ("stuck", "sched", "2020-01-01T00:00:00+00:00")
    ]
    assert late[0]["late_seconds"] > 3600
    text = StringIO()
    call_command("queue_stats", stdout=text)
    assert "late schedule stuck (queue sched)" in text.getvalue()
    glance = admin_client_.get(JOBS).content.decode()
    assert "Late schedules" in glance
    assert page("stuck") in glance
    assert page("fine") not in glance
    assert '<span class="pgqueue-late">' in admin_client_.get(LIST).content.decode()
