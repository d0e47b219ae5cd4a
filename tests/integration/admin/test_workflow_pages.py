"""The Workflows pages through Django's test client: states, progress, the graph, cancel.

Steps are moved by a worker's Store on its own connection (claim, complete, fail),
as the worker would move them, so the tests commit (transaction=True).
"""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue import Workflow, chain, chord, group, step
from django_pgqueue.admin import workflows as admin_workflows
from django_pgqueue.outcomes import Dead
from django_pgqueue.workflows import cancel_workflow
from tests.conftest import sql
from tests.factories import OPERATOR_PERMISSIONS, VIEWER_PERMISSIONS, make_job, make_user

pytestmark = pytest.mark.django_db(transaction=True)

Q = "wfpages"
LIST = reverse("admin:django_pgqueue_workflow_changelist")
JOBS = reverse("admin:django_pgqueue_job_changelist")


def s(name: str, **options):
    options.setdefault("queue", Q)
    return step("qa.noop", {"step": name}, name=name, **options)


def page_of(workflow_id: int) -> str:
    return reverse("admin:django_pgqueue_workflow_change", args=[workflow_id])


def cancel_url(workflow_id: int) -> str:
    return reverse("admin:django_pgqueue_workflow_cancel", args=[workflow_id])


def job_page(job_id: int) -> str:
    return reverse("admin:django_pgqueue_job_change", args=[job_id])


def status(job_id: int) -> str:
    return sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])[0][0]


def advance(store, outcomes: dict[int, str], queue: str = Q) -> None:
    """Claim the due jobs of `queue` and end each as `outcomes` says (completed or dead).

    A claimed job not in `outcomes` is left running.
    """
    for row in store.claim(queue, 100, "test-worker", 300):
        outcome = outcomes.get(row.job_id, "running")
        if outcome == "completed":
            assert store.complete([(row.job_id, row.lease_version, row.attempt_id, None)])
        elif outcome == "dead":
            failure = Dead("ValueError", "broken", "")
            assert store.fail(row.job_id, row.lease_version, row.attempt_id, failure)[0] == "dead"


def rows_by_workflow(html: str) -> dict[int, str]:
    """The list's table rows, by the workflow id each links to."""
    found = {}
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        match = re.search(r'href="/admin/django_pgqueue/workflow/(\d+)/change/"', row)
        if match:
            found[int(match.group(1))] = row
    return found


def listed(html: str) -> list[int]:
    return list(rows_by_workflow(html))


@pytest.fixture
def four_workflows(stores):
    """A running chain, a failed chord, a finished chain and a cancelled chain."""
    store = stores()
    running = chain(s("a"), s("b"), s("c")).enqueue()
    failed = chord(group(s("x"), s("y")), s("callback")).enqueue()
    finished = chain(s("first", queue="wfdone"), s("second", queue="wfdone")).enqueue()
    cancelled = chain(s("one"), s("two")).enqueue()
    cancel_workflow(cancelled.id)
    advance(
        store,
        {
            running.jobs["a"]: "completed",
            failed.jobs["x"]: "completed",
            failed.jobs["y"]: "dead",
        },
    )
    advance(store, {finished.jobs["first"]: "completed"}, "wfdone")
    advance(store, {finished.jobs["second"]: "completed"}, "wfdone")
    # The chain's b is pending now, not claimed; the chord's callback was cancelled.
    return {"running": running, "failed": failed, "finished": finished, "cancelled": cancelled}


def test_the_list_shows_each_workflows_state_progress_and_step_counts(client, four_workflows):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    html = client.get(LIST).content.decode()
    rows = rows_by_workflow(html)
    runs = four_workflows
    # Newest first.
    assert listed(html) == sorted((run.id for run in runs.values()), reverse=True)
    expected = {
        "running": ("3 steps", "1 / 3", ["1 completed", "1 pending", "1 waiting"]),
        "failed": ("3 steps", "3 / 3", ["1 completed", "1 dead", "1 cancelled"]),
        "finished": ("2 steps", "2 / 2", ["2 completed"]),
        "cancelled": ("2 steps", "2 / 2", ["2 cancelled"]),
    }
    for state, (_, progress, counts) in expected.items():
        row = rows[runs[state].id]
        assert f'pgqueue-wf-{state}">{state}</span>' in row
        assert f'<span class="pgqueue-progress-text">{progress}</span>' in row
        shown = re.findall(r'<span class="pgqueue-count-\w+">([^<]+)</span>', row)
        assert shown == counts
    # The bar's segments are the steps' shares.
    assert 'class="pgqueue-bar-completed" style="width: 33.33%"' in rows[runs["running"].id]
    # Started and finished times: the running chain started, has not finished.
    assert rows[runs["running"].id].count("—") == 1
    assert rows[runs["cancelled"].id].count("—") == 1  # never started


def test_the_list_filters_by_state(client, four_workflows):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    for state, run in four_workflows.items():
        html = client.get(LIST, {"state": state}).content.decode()
        assert listed(html) == [run.id], state
    # An unknown state is no filter.
    assert len(listed(client.get(LIST, {"state": "bogus"}).content.decode())) == 4


def test_the_list_pages_by_keyset_and_a_filtered_page_reads_a_bounded_scan(
    client, monkeypatch
) -> None:
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    monkeypatch.setattr(admin_workflows, "PER_PAGE", 2)
    monkeypatch.setattr(admin_workflows, "SCAN_LIMIT", 3)
    ids = [chain(s("a"), s("b")).enqueue().id for _ in range(5)]
    newest_first = sorted(ids, reverse=True)
    first = client.get(LIST)
    assert listed(first.content.decode()) == newest_first[:2]
    assert first.context["older"] == newest_first[1]
    second = client.get(LIST, {"before": newest_first[1]})
    assert listed(second.content.decode()) == newest_first[2:4]
    third = client.get(LIST, {"before": newest_first[3]})
    assert listed(third.content.decode()) == newest_first[4:]
    assert third.context["older"] is None
    # The oldest one cancelled: a filtered page reads 3 workflows, finds none, goes on.
    cancel_workflow(ids[0])
    filtered = client.get(LIST, {"state": "cancelled"})
    assert listed(filtered.content.decode()) == []
    assert filtered.context["older"] == newest_first[2]
    assert "older ones may match too" in filtered.content.decode()
    rest = client.get(LIST, {"state": "cancelled", "before": newest_first[2]})
    assert listed(rest.content.decode()) == [ids[0]]
    assert rest.context["older"] is None


def test_the_workflow_page_draws_one_linked_node_per_step_coloured_by_status(client, stores):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    flow = Workflow("diamond")
    flow.add("fetch", s("fetch"))
    flow.add("left", s("left"), after=["fetch"])
    flow.add("right", s("right"), after=["fetch"])
    flow.add("merge", s("merge"), after=["left", "right"])
    run = flow.enqueue()
    store = stores()
    advance(store, {run.jobs["fetch"]: "completed"})
    advance(store, {run.jobs["left"]: "completed"})  # right stays running
    expected = {"fetch": "completed", "left": "completed", "right": "running", "merge": "waiting"}
    assert {name: status(job_id) for name, job_id in run.jobs.items()} == expected

    response = client.get(page_of(run.id))
    assert response.status_code == 200
    html = response.content.decode()
    nodes = re.findall(
        r'<a href="([^"]+)" class="pgqueue-node pgqueue-node-(\w+)" data-job="(\d+)"', html
    )
    assert sorted((int(job), colour, href) for href, colour, job in nodes) == sorted(
        (run.jobs[name], expected[name], job_page(run.jobs[name])) for name in run.jobs
    )
    assert html.count('class="pgqueue-edge"') == 4
    # Layers by depth: fetch above left and right, which are above merge.
    y = {
        int(job): float(top)
        for job, top in re.findall(
            r'data-job="(\d+)"><title>[^<]*</title><rect x="[\d.]+" y="([\d.]+)"', html
        )
    }
    ids = run.jobs
    assert y[ids["fetch"]] < y[ids["left"]] == y[ids["right"]] < y[ids["merge"]]
    # The header and the steps table.
    assert 'pgqueue-wf-running">running</span>' in html
    assert '<span class="pgqueue-progress-text">2 / 4</span>' in html
    table = html.split('class="pgqueue-steps"')[1]
    for name, job_id in ids.items():
        assert f"<strong>{name}</strong>" in table
        assert f'href="{job_page(job_id)}">#{job_id}</a>' in table
    assert "<td>left, right</td>" in table
    assert f"{JOBS}?workflow={run.id}" in html


def test_the_drawing_is_capped_and_the_table_lists_every_step(client, monkeypatch):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    monkeypatch.setattr(admin_workflows, "DRAW_LIMIT", 3)
    run = chord(group(*(s(f"member-{n}") for n in range(5))), s("callback")).enqueue()
    html = client.get(page_of(run.id)).content.decode()
    assert html.count('class="pgqueue-node ') == 3
    assert "The drawing shows the first 3 of 6 steps" in html
    assert html.split('class="pgqueue-steps"')[1].count("<tr>") == 1 + 6


def test_a_layer_wider_than_a_row_wraps(client):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    run = chord(group(*(s(f"member-{n}") for n in range(13))), s("callback")).enqueue()
    html = client.get(page_of(run.id)).content.decode()
    tops = [float(y) for y in re.findall(r'<rect x="[\d.]+" y="([\d.]+)"', html)]
    assert [tops.count(y) for y in sorted(set(tops))] == [6, 6, 1, 1]


def test_cancelling_a_workflow_needs_the_operate_permission_and_works(client, stores):
    run = chain(s("a"), s("b"), s("c")).enqueue()
    advance(stores(), {})  # a runs
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    assert "Cancel workflow" not in client.get(page_of(run.id)).content.decode()
    assert client.post(cancel_url(run.id)).status_code == 403
    assert [status(j) for j in run.jobs.values()] == ["running", "waiting", "waiting"]

    client.force_login(make_user("operator", *OPERATOR_PERMISSIONS))
    html = client.get(page_of(run.id)).content.decode()
    assert f'action="{cancel_url(run.id)}"' in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert client.get(cancel_url(run.id)).status_code == 405
    response = client.post(cancel_url(run.id), follow=True)
    assert response.redirect_chain == [(page_of(run.id), 302)]
    assert [status(j) for j in run.jobs.values()] == ["running", "cancelled", "cancelled"]
    messages = [str(m) for m in response.context["messages"]]
    assert messages == [
        f"Cancelled 2 step(s) of workflow #{run.id}; asked 1 running step(s) to stop "
        "(they end cancelled when their worker writes them)."
    ]
    assert client.post(cancel_url(10**12)).status_code == 404


def test_a_csrf_less_cancel_is_refused():
    run = chain(s("a"), s("b")).enqueue()
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("operator", *OPERATOR_PERMISSIONS))
    assert client.post(cancel_url(run.id)).status_code == 403
    assert [status(j) for j in run.jobs.values()] == ["pending", "waiting"]


def test_a_steps_job_page_links_to_its_workflow_and_a_plain_job_has_no_such_row(client):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    run = chain(s("a"), s("b")).enqueue()
    html = client.get(job_page(run.jobs["b"])).content.decode()
    assert f'<a href="{page_of(run.id)}">chain</a> (step b)' in html
    plain = make_job("pending", queue=Q)
    html = client.get(job_page(plain)).content.decode()
    assert "/admin/django_pgqueue/workflow/" not in html.split('id="content-main"')[1]


def test_the_jobs_list_filters_by_workflow(client):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    run = chain(s("a"), s("b")).enqueue()
    other = chain(s("a"), s("b")).enqueue()
    response = client.get(JOBS, {"workflow": run.id})
    assert response.status_code == 200
    shown = {row.pk for row in response.context["cl"].result_list}
    assert shown == set(run.jobs.values())
    assert not shown & set(other.jobs.values())
    malformed = client.get(JOBS, {"workflow": "12x"})
    assert malformed.status_code == 200
    assert list(malformed.context["cl"].result_list) == []


def test_an_unknown_workflow_is_not_found(client):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    assert client.get(page_of(10**12)).status_code == 404
    assert client.get("/admin/django_pgqueue/workflow/abc/change/").status_code == 404


def test_the_list_reads_the_same_number_of_queries_however_many_workflows(client):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    counts = []
    for _ in range(2):
        for _ in range(3):
            chord(group(s("x"), s("y")), s("callback")).enqueue()
        with CaptureQueriesContext(connection) as queries:
            assert client.get(LIST).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]
    workflow_reads = [q["sql"] for q in queries if "queue_workflows" in q["sql"]]
    assert len(workflow_reads) == 1
    assert "count(*) FROM queue_workflows" not in workflow_reads[0]


def test_a_named_canvas_is_listed_by_its_name_and_an_empty_group_as_finished(client, stores):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    named = chain(s("a"), s("b"), name="nightly rates").enqueue()
    empty = group().enqueue(name="nothing to do")
    rows = rows_by_workflow(client.get(LIST).content.decode())
    assert "nightly rates" in rows[named.id]
    assert ">chain<" not in rows[named.id]
    assert 'pgqueue-wf-finished">finished</span>' in rows[empty.id]
    assert "nothing to do" in rows[empty.id]


def test_a_pruned_workflow_says_so(client, stores):
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    run = chain(s("a"), s("b")).enqueue()
    kept = chain(s("c")).enqueue()
    # prune_queue_jobs deletes a finished workflow's jobs; their steps go with them.
    sql("DELETE FROM queue_jobs WHERE id = ANY(%s)", [list(run.jobs.values())])
    rows = rows_by_workflow(client.get(LIST).content.decode())
    assert 'pgqueue-wf-pruned">pruned</span>' in rows[run.id]
    assert 'pgqueue-wf-running">running</span>' in rows[kept.id]
    assert listed(client.get(LIST, {"state": "pruned"}).content.decode()) == [run.id]
    html = client.get(page_of(run.id)).content.decode()
    assert "Its steps were deleted by prune_queue_jobs" in html
    assert "pgqueue-graph" not in html.split('id="content-main"')[1]
    assert "more steps, not listed" not in html
