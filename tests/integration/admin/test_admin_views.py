"""The admin pages through Django's test client: what they show, who may act, and cost."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue_many
from django_pgqueue.admin import lists as admin_lists
from django_pgqueue.admin import operations as admin_operations
from django_pgqueue.models import Job
from tests.conftest import sql
from tests.factories import make_job, state

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_pgqueue_job_changelist")
DEAD = reverse("admin:django_pgqueue_deadjob_changelist")


def job_page(job_id: int) -> str:
    return reverse("admin:django_pgqueue_job_change", args=[job_id])


def dead_page(job_id: int) -> str:
    return reverse("admin:django_pgqueue_deadjob_change", args=[job_id])


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def listed_ids(response) -> list[int]:
    return [obj.pk for obj in response.context["cl"].result_list]


# -- what the pages show -------------------------------------------------------------------


def test_jobs_list_shows_state_columns_newest_first(operator_client):
    first = make_job("pending", queue="mail", type="qa.echo")
    second = make_job("dead", queue="mail", error="ValueError: the SMTP server said no")
    response = operator_client.get(JOBS)
    assert response.status_code == 200
    assert listed_ids(response) == [second, first]
    html = response.content.decode()
    assert "3/3" in html  # attempts/max of the dead job
    assert "ValueError: the SMTP server said no" in html
    assert 'class="pgqueue-status pgqueue-dead"' in html


def test_at_a_glance_figures_per_queue(operator_client):
    for _ in range(3):
        make_job("pending", queue="mail")
    make_job("running", queue="mail")
    make_job("dead", queue="mail")
    make_job("dead", queue="billing")
    make_job("cancelled", queue="billing")
    # A running job whose lease ran out and that no sweep has requeued yet.
    expired = make_job("running", queue="billing")
    sql(
        "UPDATE queue_job_state SET locked_until = now() - interval '1 minute' WHERE job_id = %s",
        [expired],
    )
    response = operator_client.get(JOBS)
    figures = {q.queue: q for q in response.context["pgqueue_snapshot"].queues}
    mail, billing = figures["mail"], figures["billing"]
    assert (mail.pending, mail.due, mail.running, mail.dead, mail.cancelled) == (3, 3, 1, 1, 0)
    assert (billing.pending, billing.running, billing.expired_leases) == (0, 1, 1)
    assert (billing.dead, billing.cancelled) == (1, 1)
    html = response.content.decode()
    assert "At a glance" in html
    assert 'class="pgqueue-alert"' in html  # the expired lease and the dead jobs stand out


def test_dead_jobs_page_lists_only_dead_jobs_newest_death_first(operator_client):
    old = make_job("dead", finished_ago="3 days", error="KeyError: 'sku'")
    new = make_job("dead", finished_ago="5 minutes", error="TimeoutError: gateway")
    make_job("pending")
    make_job("completed")
    make_job("cancelled")
    response = operator_client.get(DEAD)
    assert response.status_code == 200
    assert listed_ids(response) == [new, old]
    html = response.content.decode()
    assert "TimeoutError: gateway" in html
    assert "KeyError: &#x27;sku&#x27;" in html


def test_dead_jobs_page_gives_the_exact_number_without_counting_the_list(operator_client):
    for _ in range(3):
        make_job("dead")
    make_job("pending")
    with CaptureQueriesContext(connection) as queries:
        response = operator_client.get(DEAD)
    assert re.search(r"\b3 dead jobs\b", response.content.decode())
    assert not [q for q in queries.captured_queries if "SELECT COUNT(*) FROM" in q["sql"].upper()]


def test_job_page_shows_payload_state_and_every_attempt(operator_client):
    job = make_job("dead", payload={"order": 42, "items": ["a", "b"]}, max_attempts=3)
    response = operator_client.get(job_page(job))
    assert response.status_code == 200
    html = response.content.decode()
    payload = re.search(r'<pre class="pgqueue-payload">(.*?)</pre>', html, re.S).group(1)
    assert payload.startswith("{\n  &quot;")  # pretty-printed, indented
    assert "&quot;order&quot;: 42" in payload
    assert "&quot;items&quot;: [\n" in payload
    assert "ValueError: boom" in html
    attempts = response.context["inline_admin_formsets"][0]
    assert len(list(attempts)) == 3
    assert html.count("Traceback (most recent call last)") == 3
    assert "worker-a" in html


def test_filters_and_search(operator_client):
    mail = make_job("pending", queue="mail", type="qa.echo", key="welcome-9")
    dead = make_job("dead", queue="billing", type="qa.fail")
    old = make_job("completed", queue="billing")
    sql("UPDATE queue_jobs SET created_at = now() - interval '10 days' WHERE id = %s", [old])

    def ids(query: str) -> list[int]:
        response = operator_client.get(JOBS + query)
        assert response.status_code == 200, query
        return listed_ids(response)

    assert ids("?queue=mail") == [mail]
    assert ids("?state__status__exact=dead") == [dead]
    assert ids("?type=qa.fail") == [dead]
    assert ids(f"?q={dead}") == [dead]
    assert ids("?q=qa.echo") == [mail]
    assert ids("?q=welcome-9") == [mail]
    since = (timezone.now() - dt.timedelta(days=2)).strftime("%Y-%m-%d")
    assert set(ids(f"?created_at__range__gte_0={since}&created_at__range__gte_1=00:00:00")) == {
        mail,
        dead,
    }
    until = (timezone.now() + dt.timedelta(days=1)).strftime("%Y-%m-%d")
    assert ids(
        f"?state__run_at__range__gte_0={since}&state__run_at__range__gte_1=00:00:00"
        f"&state__run_at__range__lte_0={until}&state__run_at__range__lte_1=00:00:00"
        "&state__status__exact=pending"
    ) == [mail]
    # Filter choices are read without a DISTINCT over the table.
    response = operator_client.get(JOBS)
    html = response.content.decode()
    assert "?queue=billing" in html
    assert "?type=qa.fail" in html


def test_filter_choices_never_scan_the_jobs_table(operator_client):
    make_job("pending", queue="mail")
    with CaptureQueriesContext(connection) as queries:
        operator_client.get(JOBS)
    # The page's last attempts are read with DISTINCT ON for the page's ids only.
    assert not [
        q
        for q in queries.captured_queries
        if "DISTINCT" in q["sql"].upper() and "queue_attempts" not in q["sql"]
    ]


def queue_choices(response) -> list[str]:
    [spec] = [spec for spec in response.context["cl"].filter_specs if spec.title == "queue"]
    return [value for value, _label in spec.lookup_choices]


def test_the_queue_filter_offers_only_queues_that_have_jobs(operator_client):
    make_job("pending", queue="mail")
    make_job("dead", queue="billing")
    assert queue_choices(operator_client.get(JOBS)) == ["billing", "mail"]
    assert queue_choices(operator_client.get(DEAD)) == ["billing", "mail"]
    # A queue asked for in the URL stays offered, so the page shows what it filters by.
    assert queue_choices(operator_client.get(JOBS + "?queue=gone")) == ["billing", "gone", "mail"]


def test_the_list_shows_a_priority_only_where_it_is_not_zero(operator_client):
    from django_pgqueue import enqueue

    enqueue("qa.noop", {}, queue="ops", priority=10)
    enqueue("qa.noop", {}, queue="ops")
    html = operator_client.get(JOBS).content.decode()
    assert html.count('class="pgqueue-priority"') == 1
    assert "priority 10" in html


# -- query counts: small and the same whatever the number of rows --------------------------


@pytest.mark.parametrize("url", [JOBS, DEAD])
def test_list_pages_run_a_constant_number_of_queries(superuser_client, url):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert superuser_client.get(url).status_code == 200
        return len(queries)

    make_job("dead")
    few = count()
    for _ in range(30):
        make_job("dead", queue="mail")
        make_job("pending", queue="billing")
    assert count() == few
    # incl. the filters' known types and queues (names_known), and on the jobs list the
    # page's last attempts
    assert few <= 9


def test_job_page_runs_a_constant_number_of_queries(superuser_client):
    one = make_job("dead", max_attempts=1)
    many = make_job("dead", max_attempts=8)

    def count(job_id: int) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert superuser_client.get(job_page(job_id)).status_code == 200
        return len(queries)

    # incl. whether the job has durable steps (one query)
    assert count(one) == count(many) <= 7


def test_a_large_table_is_estimated_not_counted(monkeypatch):
    for _ in range(12):
        make_job("pending")
    queryset = Job.objects.order_by("-id")
    paginator = admin_lists.EstimatedCountPaginator
    estimated = paginator(queryset, 100, total=lambda: (1_000_000, False))
    with CaptureQueriesContext(connection) as queries:
        assert estimated.count == 1_000_000
    assert len(queries) == 0
    assert estimated.approximate == "about"
    exact = paginator(queryset, 100, total=lambda: (12, True))
    assert exact.count == 12
    assert exact.approximate == ""
    # Filtered, rows are counted only up to the limit.
    monkeypatch.setattr(admin_lists, "EXACT_COUNT_LIMIT", 10)
    capped = paginator(queryset.filter(queue="ops"), 100)
    assert capped.count == 10
    assert capped.approximate == "more than"
    small = paginator(queryset.filter(type="nothing.here"), 100)
    assert small.count == 0
    assert small.approximate == ""


def test_list_page_says_the_total_is_approximate(superuser_client, monkeypatch):
    for _ in range(12):
        make_job("pending")
    monkeypatch.setattr(admin_lists, "EXACT_COUNT_LIMIT", 10)
    response = superuser_client.get(JOBS + "?queue=ops")
    assert re.search(r"more than\s+10 jobs", response.content.decode())


# -- nothing can be edited -----------------------------------------------------------------


def test_payload_and_state_cannot_be_edited(operator_client):
    job = make_job("dead", payload={"amount": 10})
    before = state(job)
    response = operator_client.get(job_page(job))
    html = response.content.decode()
    # Read-only: no form field for the payload or any state column, no save button.
    for name in ("payload", "status", "attempts", "run_at", "max_attempts", "queue", "type"):
        assert not re.search(rf'<(input|textarea|select)[^>]*name="{name}"', html), name
    assert 'name="_save"' not in html
    # A forged save is refused and changes nothing.
    forged = {"payload": '{"amount": 1000000}', "status": "pending", "_save": "Save"}
    assert operator_client.post(job_page(job), forged).status_code == 403
    payload = sql("SELECT payload::text FROM queue_jobs WHERE id = %s", [job])[0][0]
    assert json.loads(payload) == {"amount": 10}
    assert state(job) == before


def test_nobody_can_add_or_delete_jobs_in_the_admin(superuser_client):
    job = make_job("completed")
    assert superuser_client.get(reverse("admin:django_pgqueue_job_add")).status_code == 403
    delete = reverse("admin:django_pgqueue_job_delete", args=[job])
    assert superuser_client.post(delete, {"post": "yes"}).status_code == 403
    response = superuser_client.get(JOBS)
    assert "delete_selected" not in response.content.decode()
    assert sql("SELECT count(*) FROM queue_jobs WHERE id = %s", [job])[0][0] == 1


# -- actions and their permission ----------------------------------------------------------


def test_operator_retries_from_the_list_after_a_confirmation(operator_client):
    dead = make_job("dead")
    running = make_job("running")
    completed = make_job("completed")
    running_before = state(running)
    selection = {"action": "retry_now", "_selected_action": [dead, running, completed]}

    confirm = operator_client.post(JOBS, {**selection, "index": "0"})
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Retry now: are you sure?" in html
    assert "with a fresh attempt budget\n(attempts back to 0)" in html  # explain_retry_now.html
    assert "1 will change, 2 will be skipped" in html
    assert "a running job is never touched" in html
    assert state(dead)["status"] == "dead"  # nothing happens before the confirmation

    done = operator_client.post(JOBS, {**selection, "post": "yes"}, follow=True)
    assert messages_of(done) == [
        "Retry now: 1 changed, 2 skipped: 1 running, 1 not in an allowed state (1 completed)."
    ]
    assert state(dead)["status"] == "pending"
    assert state(running) == running_before
    assert state(completed)["status"] == "completed"


def confirmation_fields(html: str) -> list[tuple[str, str]]:
    """The hidden fields the confirmation page's form posts, as a browser would send them."""
    form = html[html.index('<form method="post">') :]
    form = form[: form.index("</form>")]
    return re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)


def test_a_confirmed_action_on_thousands_of_jobs_is_not_refused(operator_client, settings):
    # Django refuses a POST of more than DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000) fields
    # with TooManyFieldsSent (HTTP 400); an action takes up to ACTION_LIMIT jobs.
    ids = [
        job.id for job in enqueue_many([("qa.noop", {"n": n}) for n in range(1_500)], queue="bulk")
    ]
    assert settings.DATA_UPLOAD_MAX_NUMBER_FIELDS == 1_000
    url = JOBS + "?queue=bulk"
    confirm = operator_client.post(
        url, {"action": "cancel", "select_across": "1", "_selected_action": ids[:1], "index": "0"}
    )
    html = confirm.content.decode()
    assert "1500 jobs selected" in html
    fields = confirmation_fields(html)
    data: dict[str, list[str]] = {}
    for name, value in fields:
        data.setdefault(name, []).append(value)
    done = operator_client.post(url, data, follow=True)
    assert done.status_code == 200
    assert messages_of(done) == ["Cancel: 1500 changed, 0 skipped."]
    statuses = sql("SELECT status, count(*) FROM queue_job_state WHERE queue = 'bulk' GROUP BY 1")
    assert statuses == [("cancelled", 1_500)]


@pytest.mark.parametrize(
    "ids", ["1,x", "", ",", "1,,2", "-1", "1;2", "1 2", "99999999999999999999"]
)
def test_a_malformed_id_list_is_refused_and_nothing_changes(operator_client, ids):
    pending = make_job("pending")
    response = operator_client.post(JOBS, {"action": "cancel", "pgqueue_ids": ids, "post": "yes"})
    assert response.status_code == 400
    assert state(pending)["status"] == "pending"


def test_an_id_list_longer_than_the_limit_is_refused(operator_client, monkeypatch):
    monkeypatch.setattr(admin_operations, "ACTION_LIMIT", 2)
    jobs = [make_job("pending") for _ in range(3)]
    response = operator_client.post(
        JOBS,
        {"action": "cancel", "pgqueue_ids": ",".join(map(str, jobs)), "post": "yes"},
        follow=True,
    )
    assert "more than 2 jobs selected; nothing was changed" in messages_of(response)[0]
    assert all(state(job)["status"] == "pending" for job in jobs)


def test_operator_cancels_pending_jobs_and_asks_running_ones_to_stop(operator_client):
    pending = make_job("pending")
    running = make_job("running")
    done = operator_client.post(
        JOBS,
        {"action": "cancel", "_selected_action": [pending, running], "post": "yes"},
        follow=True,
    )
    assert messages_of(done) == [
        "Cancel: 2 changed (1 running: cancellation requested), 0 skipped."
    ]
    assert state(pending)["status"] == "cancelled"
    # Still running: the worker ends it cancelled when its attempt ends (issue 14).
    assert state(running)["status"] == "running"
    assert sql(
        "SELECT cancel_requested_at IS NOT NULL FROM queue_job_state WHERE job_id = %s", [running]
    ) == [(True,)]


@pytest.mark.skipif(
    admin_operations.FORM_ACTION_FIELD is None, reason="actions on a job's page need Django 6.1"
)
def test_operator_retries_a_dead_job_from_its_own_page(operator_client):
    dead = make_job("dead")
    page = operator_client.get(dead_page(dead))
    assert 'name="CHANGE_FORM-action"' in page.content.decode()
    selection = {"CHANGE_FORM-action": "retry_now", "_selected_action": [dead]}
    confirm = operator_client.post(dead_page(dead), selection)
    assert "Retry now: are you sure?" in confirm.content.decode()
    done = operator_client.post(dead_page(dead), {**selection, "post": "yes"})
    # The job is not dead any more: the operator lands on its page among all jobs.
    assert done.status_code == 302
    assert done.url == job_page(dead)
    assert state(dead)["status"] == "pending"
    assert messages_of(operator_client.get(done.url)) == ["Retry now: 1 changed, 0 skipped."]


def test_a_job_that_left_the_list_since_the_confirmation_is_reported(operator_client):
    dead = make_job("dead")
    gone = make_job("dead")
    sql(
        "UPDATE queue_job_state SET status = 'completed' WHERE job_id = %s", [gone]
    )  # retried and completed elsewhere meanwhile
    done = operator_client.post(
        DEAD, {"action": "retry_now", "_selected_action": [dead, gone], "post": "yes"}, follow=True
    )
    assert messages_of(done) == [
        "Retry now: 1 changed, 1 skipped: 1 no longer in the list it was selected from."
    ]


def test_user_without_the_permission_sees_no_action_and_a_forged_post_is_refused(viewer_client):
    dead = make_job("dead")
    pending = make_job("pending")
    before = {dead: state(dead), pending: state(pending)}

    listing = viewer_client.get(JOBS).content.decode()
    assert 'value="retry_now"' not in listing
    assert 'value="cancel"' not in listing
    page = viewer_client.get(dead_page(dead)).content.decode()
    assert "CHANGE_FORM-action" not in page
    assert "retry_now" not in page

    forged = [
        (JOBS, {"action": "retry_now", "_selected_action": [dead], "index": "0"}),
        (JOBS, {"action": "retry_now", "_selected_action": [dead], "post": "yes"}),
        (DEAD, {"action": "retry_now", "_selected_action": [dead], "post": "yes"}),
        (JOBS, {"action": "cancel", "_selected_action": [pending], "post": "yes"}),
        (
            dead_page(dead),
            {"CHANGE_FORM-action": "retry_now", "_selected_action": [dead], "post": "yes"},
        ),
        (
            job_page(pending),
            {"CHANGE_FORM-action": "cancel", "_selected_action": [pending], "post": "yes"},
        ),
    ]
    for url, data in forged:
        assert viewer_client.post(url, data).status_code == 403, (url, data)
    assert {dead: state(dead), pending: state(pending)} == before


def test_a_selection_above_the_limit_is_refused_whole(operator_client, monkeypatch):
    monkeypatch.setattr(admin_operations, "ACTION_LIMIT", 2)
    jobs = [make_job("dead") for _ in range(3)]
    done = operator_client.post(
        DEAD, {"action": "retry_now", "_selected_action": jobs, "post": "yes"}, follow=True
    )
    assert "more than 2 jobs selected; nothing was changed" in messages_of(done)[0]
    assert all(state(job)["status"] == "dead" for job in jobs)
