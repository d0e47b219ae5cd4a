"""Workflows: chains, groups, chords and DAGs run by a real worker on the real database."""

from __future__ import annotations

import datetime as dt
import json
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction
from prometheus_client import generate_latest

from django_pgqueue import (
    EnqueueError,
    Workflow,
    batch,
    chain,
    chord,
    enqueue_many,
    group,
    step,
)
from django_pgqueue.maintenance import prune
from django_pgqueue.metrics.collector import QueueCollector
from django_pgqueue.models import Attempt, JobState
from django_pgqueue.stats import collect
from django_pgqueue.workflows import cancel_workflow
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

Q = "wf"


def status(job_id: int) -> str:
    return JobState.objects.get(pk=job_id).status


def statuses(run) -> dict[str, str]:
    return {name: status(job_id) for name, job_id in run.jobs.items()}


def result(job_id: int):
    return Attempt.objects.get(job_id=job_id, status="succeeded").result


def starts(run) -> dict[str, tuple]:
    """Each step's first attempt (started_at, finished_at), by step name."""
    rows = sql(
        "SELECT job_id, min(started_at), max(finished_at) FROM queue_attempts "
        "WHERE job_id = ANY(%s) AND status = 'succeeded' GROUP BY job_id",
        [list(run.jobs.values())],
    )
    by_id = {job_id: (start, end) for job_id, start, end in rows}
    return {name: by_id.get(job_id) for name, job_id in run.jobs.items()}


FINISHED = ("completed", "dead", "cancelled")


def drain(run_worker, *runs, queues=(Q,), **options):
    """Run a worker until every step of `runs` finished (a 60 s hang guard), then stop it."""
    options.setdefault("concurrency", 4)
    worker = run_worker(list(queues), poll_interval=0.05, **options)
    ids = [job_id for run in runs for job_id in run.jobs.values()]
    wait_until(
        lambda: JobState.objects.filter(pk__in=ids).exclude(status__in=FINISHED).count() == 0
    )
    worker.stop()
    return worker


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def p(payload):
    return step("qa.parents", payload, queue=Q)


def test_a_chain_runs_in_order_each_step_reading_the_previous_result(run_worker):
    run = chain(p("a"), p("b"), p("c")).enqueue()
    names = list(run.jobs)
    assert statuses(run) == dict(zip(names, ["pending", "waiting", "waiting"], strict=True))
    drain(run_worker, run)
    assert set(statuses(run).values()) == {"completed"}
    first, second, third = (run.jobs[n] for n in names)
    assert result(first) == {"payload": "a", "parents": {}}
    assert result(second)["parents"] == {names[0]: {"payload": "a", "parents": {}}}
    assert result(third)["parents"][names[1]]["payload"] == "b"
    times = starts(run)
    assert times[names[0]][1] <= times[names[1]][0]
    assert times[names[1]][1] <= times[names[2]][0]


def test_a_burst_worker_runs_the_steps_its_own_completions_made_due(run_worker):
    """--burst ends when its queues are empty: a batch's callback, or a chain's next
    step, made pending by the worker's own last completions (whose NOTIFY may not have
    come yet) is a job to run, not an empty queue."""
    for _ in range(3):
        run = chain(p("a"), p("b"), p("c")).enqueue()
        with batch(on_finish=p("done")):
            enqueue_many([("qa.echo", {"n": n}) for n in range(2)], queue=Q)
        run_worker([Q], burst=True).join()
        assert set(statuses(run).values()) == {"completed"}
        assert set(JobState.objects.values_list("status", flat=True)) == {"completed"}


def test_a_chord_callback_gets_the_group_results_in_group_order(run_worker):
    run = chord(group(*(p(i) for i in range(10))), p("sum")).enqueue()
    names = list(run.jobs)
    drain(run_worker, run, concurrency=8)
    callback = result(run.jobs[names[-1]])
    assert [r["payload"] for r in callback["parents"].values()] == list(range(10))
    times = starts(run)
    assert max(times[n][1] for n in names[:-1]) <= times[names[-1]][0]
    # The callback ran once.
    assert Attempt.objects.filter(job_id=run.jobs[names[-1]]).count() == 1


def test_a_diamond_dag_waits_for_both_branches(run_worker):
    flow = Workflow("diamond")
    flow.add("top", p("top"))
    flow.add("left", p("left"), after=["top"])
    flow.add("right", p("right"), after=["top"])
    flow.add("bottom", p("bottom"), after=["left", "right"])
    run = flow.enqueue()
    drain(run_worker, run)
    assert set(statuses(run).values()) == {"completed"}
    assert sorted(result(run.jobs["bottom"])["parents"]) == ["left", "right"]
    times = starts(run)
    assert max(times["left"][1], times["right"][1]) <= times["bottom"][0]
    assert times["top"][1] <= min(times["left"][0], times["right"][0])


def test_a_chain_of_groups(run_worker):
    run = chain(group(p(1), p(2)), group(p(3), p(4), p(5)), p("end")).enqueue()
    names = list(run.jobs)
    drain(run_worker, run)
    assert set(statuses(run).values()) == {"completed"}
    times = starts(run)
    assert max(times[n][1] for n in names[:2]) <= min(times[n][0] for n in names[2:5])
    assert max(times[n][1] for n in names[2:5]) <= times[names[5]][0]
    assert [r["payload"] for r in result(run.jobs[names[5]])["parents"].values()] == [3, 4, 5]


def test_a_task_step_runs_the_task(run_worker):
    from qa.tasks import add

    run = chain(step(add, args=[2, 3]), p("after")).enqueue()
    drain(run_worker, run, queues=("qa-tasks", Q))
    names = list(run.jobs)
    assert result(run.jobs[names[0]]) == 5
    assert result(run.jobs[names[1]])["parents"] == {names[0]: 5}


def test_cycles_and_unknown_steps_are_refused_naming_them_and_nothing_is_written():
    flow = Workflow("loop")
    flow.add("a", p("a"), after=["c"])
    flow.add("b", p("b"), after=["a"])
    flow.add("c", p("c"), after=["b"])
    with pytest.raises(EnqueueError, match=r"has a cycle: 'a' -> 'b' -> 'c' -> 'a'"):
        flow.enqueue()
    lost = Workflow("lost")
    lost.add("a", p("a"), after=["ghost"])
    with pytest.raises(EnqueueError, match="unknown steps: 'a' waits for 'ghost'"):
        lost.enqueue()
    selfish = Workflow("self")
    selfish.add("a", p("a"), after=["a"])
    with pytest.raises(EnqueueError, match="'a' waits for itself"):
        selfish.enqueue()
    with pytest.raises(EnqueueError, match="has a step named 'a' already"):
        selfish.add("a", p("again"))
    with pytest.raises(EnqueueError, match="on_failure must be one of"):
        step("qa.echo", on_failure="ignore")
    bad = Workflow("bad")
    bad.add("a", p("a"))
    bad.add("b", step("qa.echo", {1, 2}, queue=Q), after=["a"])
    with pytest.raises(TypeError):
        bad.enqueue()
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == 0
    assert sql("SELECT count(*) FROM queue_workflows")[0][0] == 0


def test_a_rolled_back_canvas_leaves_nothing():
    with transaction.atomic():
        chord(group(p(1), p(2)), p("cb")).enqueue()
        assert sql("SELECT count(*) FROM queue_jobs")[0][0] == 3
        transaction.set_rollback(True)
    for table in (
        "queue_jobs",
        "queue_job_state",
        "queue_workflows",
        "queue_workflow_steps",
        "queue_job_deps",
    ):
        assert sql(f"SELECT count(*) FROM {table}")[0][0] == 0, table


def test_a_dead_dependency_cancels_what_waits_on_it_saying_why(run_worker):
    flow = Workflow("fails")
    flow.add("ok", p("ok"))
    flow.add("bad", step("qa.parents_fail", "bad", queue=Q))
    flow.add("after", p("after"), after=["ok", "bad"])
    flow.add("later", p("later"), after=["after"])
    run = flow.enqueue()
    drain(run_worker, run)
    assert statuses(run) == {
        "ok": "completed",
        "bad": "dead",
        "after": "cancelled",
        "later": "cancelled",
    }
    bad = run.jobs["bad"]
    assert JobState.objects.get(pk=run.jobs["after"]).last_error == (
        f"cancelled: job {bad} it waits for ended dead or cancelled"
    )
    assert not Attempt.objects.filter(job_id__in=[run.jobs["after"], run.jobs["later"]]).exists()


def test_on_failure_run_runs_anyway_and_sees_only_completed_parents(run_worker):
    flow = Workflow("anyway")
    flow.add("ok", p("ok"))
    flow.add("bad", step("qa.parents_fail", "bad", queue=Q))
    flow.add("cleanup", p("cleanup"), after=["ok", "bad"], on_failure="run")
    run = flow.enqueue()
    drain(run_worker, run)
    assert statuses(run)["cleanup"] == "completed"
    assert list(result(run.jobs["cleanup"])["parents"]) == ["ok"]


def test_link_error_runs_only_when_something_failed(run_worker):
    failing = chain(p("a"), step("qa.parents_fail", "b", queue=Q), p("c")).link_error(
        p("errback"), name="errback"
    )
    fine = chain(p("x"), p("y")).link_error(p("errback"), name="errback")
    bad_run, good_run = failing.enqueue(), fine.enqueue()
    drain(run_worker, bad_run, good_run)
    assert statuses(bad_run)["errback"] == "completed"
    assert statuses(good_run)["errback"] == "cancelled"
    assert JobState.objects.get(pk=good_run.jobs["errback"]).last_error.startswith("skipped")


def test_operator_retry_of_a_dead_step_puts_its_cancelled_dependents_back(run_worker):
    from django_pgqueue import actions

    flow = Workflow("retry")
    flow.add("bad", step("qa.parents_fail", "bad", queue=Q))
    flow.add("next", p("next"), after=["bad"])
    flow.add("last", p("last"), after=["next"])
    run = flow.enqueue()
    drain(run_worker, run)
    assert statuses(run) == {"bad": "dead", "next": "cancelled", "last": "cancelled"}
    report = actions.retry_now([run.jobs["bad"]])
    assert report.changed == [run.jobs["bad"]]
    assert statuses(run) == {"bad": "pending", "next": "waiting", "last": "waiting"}
    counters = sql(
        "SELECT job_id, waiting_for, failed, cancelled_by FROM queue_workflow_steps ORDER BY job_id"
    )
    assert [row[1:] for row in counters] == [(0, 0, None), (1, 0, None), (1, 0, None)]
    # It dies again: they are cancelled again, counted once more, never twice.
    drain(run_worker, run)
    assert statuses(run) == {"bad": "dead", "next": "cancelled", "last": "cancelled"}
    assert [
        row[1:3]
        for row in sql(
            "SELECT job_id, waiting_for, failed FROM queue_workflow_steps ORDER BY job_id"
        )
    ] == [(0, 0), (0, 1), (0, 1)]


def test_a_retried_dependency_that_succeeds_settles_then_once(run_worker):
    from django_pgqueue import actions

    flow = Workflow("heal")
    flow.add("bad", step("qa.parents_fail", "bad", queue=Q))
    flow.add("cb", p("cb"), after=["bad"])
    run = flow.enqueue()
    drain(run_worker, run)
    # The operator fixes the cause: the retried job now completes (qa.echo's handler
    # is not swapped in; the same job is completed by a fenced write instead).
    actions.retry_now([run.jobs["bad"]])
    sql("UPDATE queue_jobs SET type = 'qa.echo' WHERE id = %s", [run.jobs["bad"]])
    drain(run_worker, run)
    assert statuses(run) == {"bad": "completed", "cb": "completed"}
    assert Attempt.objects.filter(job_id=run.jobs["cb"]).count() == 1


def test_cancelling_a_workflow_cancels_waiting_and_pending_steps_and_asks_running_ones():
    flow = Workflow("stop")
    flow.add("a", p("a"))
    flow.add("b", p("b"), after=["a"])
    flow.add("c", p("c"))
    flow.add("d", p("d"), after=["b", "c"])
    run = flow.enqueue()
    # "c" runs: fabricate its claim as a worker would have (a lease, an attempt).
    sql(
        "UPDATE queue_job_state SET status = 'running', attempts = 1, lease_version = 1, "
        "locked_by = 'w', locked_until = now() + interval '1 minute' WHERE job_id = %s",
        [run.jobs["c"]],
    )
    done = run.cancel()
    assert done.cancelled == sorted([run.jobs["a"], run.jobs["b"], run.jobs["d"]])
    assert done.requested == [run.jobs["c"]]
    assert statuses(run) == {"a": "cancelled", "b": "cancelled", "c": "running", "d": "cancelled"}
    assert sql(
        "SELECT cancel_requested_at IS NOT NULL FROM queue_job_state WHERE job_id = %s",
        [run.jobs["c"]],
    ) == [(True,)]
    assert cancel_workflow(run.id).cancelled == []


def test_operator_cancel_of_one_waiting_step_cancels_what_waits_on_it():
    from django_pgqueue import actions

    run = chain(p("a"), p("b"), p("c")).enqueue()
    names = list(run.jobs)
    report = actions.cancel([run.jobs[names[1]]])
    assert report.changed == [run.jobs[names[1]]]
    assert statuses(run) == dict(zip(names, ["pending", "cancelled", "cancelled"], strict=True))
    # An operator's cancel is not undone by retrying something else.
    assert sql(
        "SELECT cancelled_by FROM queue_workflow_steps WHERE job_id = %s", [run.jobs[names[1]]]
    ) == [(None,)]


def test_queue_stats_and_metrics_count_waiting_steps():
    chord(group(p(1), p(2)), p("cb")).enqueue()
    chain(p("a"), p("b"), p("c")).enqueue()
    figures = {f.queue: f for f in collect().queues}[Q]
    assert (figures.pending, figures.waiting, figures.live) == (3, 3, 6)
    out = StringIO()
    call_command("queue_stats", "--json", stdout=out)
    assert json.loads(out.getvalue())["totals"]["waiting"] == 3
    text = generate_latest(QueueCollector()).decode()
    assert f'pgqueue_jobs{{queue="{Q}",status="waiting"}} 3.0' in text


def test_pruning_keeps_a_workflows_finished_steps_until_the_whole_workflow_finished():
    run = chord(group(p(1), p(2)), p("cb")).enqueue()
    names = list(run.jobs)
    members = [run.jobs[n] for n in names[:2]]
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now() - interval '30 days' "
        "WHERE job_id = ANY(%s)",
        [members],
    )
    plain = enqueue_many([("qa.noop", None)], queue=Q)[0].id
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now() - interval '30 days' "
        "WHERE job_id = %s",
        [plain],
    )
    out = StringIO()
    call_command("prune_queue_jobs", "--older-than", "7d", "--dry-run", stdout=out)
    sql("UPDATE queue_workflows SET created_at = now() - interval '31 days'")
    call_command("prune_queue_jobs", "--older-than", "7d", stdout=StringIO())
    assert sql("SELECT id FROM queue_jobs ORDER BY id") == [(j,) for j in sorted(run.jobs.values())]
    assert sql("SELECT count(*) FROM queue_workflows") == [(1,)]
    # The workflow finishes: its steps go with the next prune.
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now() - interval '30 days' "
        "WHERE job_id = %s",
        [run.jobs[names[2]]],
    )
    # A workflow created since the cutoff, all of it finished and pruned: its row stays
    # until it is older than the cutoff too.
    young = chain(p("y1"), p("y2")).enqueue()
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now() - interval '30 days' "
        "WHERE job_id = ANY(%s)",
        [list(young.jobs.values())],
    )
    out = StringIO()
    call_command("prune_queue_jobs", "--older-than", "7d", stdout=out)
    assert sql("SELECT count(*) FROM queue_jobs") == [(0,)]
    assert sql("SELECT count(*) FROM queue_job_deps") == [(0,)]
    assert sql("SELECT count(*) FROM queue_workflow_steps") == [(0,)]
    # The workflow's own row goes once its steps are gone: nothing is left of it.
    assert sql("SELECT id FROM queue_workflows") == [(young.id,)]
    assert "Deleted 1 workflow whose steps were all gone." in out.getvalue()


def test_a_workflow_is_pruned_whole_in_one_statement_even_past_the_batch_size():
    """Batches of 3: a plain job, then a chain of 5 steps (larger than a batch: it goes
    alone, whole, in the next statement), then two plain jobs. Pruning completed jobs
    only leaves a workflow with a dead step whole."""
    old = "UPDATE queue_job_state SET status = %s, finished_at = now() - interval '30 days' "
    first = enqueue_many([("qa.noop", None)], queue=Q)[0].id
    run = chain(*(p(i) for i in range(5))).enqueue()
    failed = chain(p("ok"), p("bad")).enqueue()
    rest = [job.id for job in enqueue_many([("qa.noop", None)] * 2, queue=Q)]
    sql(old + "WHERE job_id = ANY(%s)", ["completed", [first, *run.jobs.values(), *rest]])
    sql(old + "WHERE job_id = ANY(%s)", ["completed", list(failed.jobs.values())])
    sql(old + "WHERE job_id = %s", ["dead", list(failed.jobs.values())[-1]])
    week = dt.timedelta(days=7)
    assert prune(week, statuses=["completed"], dry_run=True).jobs == {"completed": 8}
    result = prune(week, statuses=["completed"], batch_size=3)
    assert result.batches == [1, 5, 2]
    assert result.jobs == {"completed": 8}
    assert sql("SELECT id FROM queue_jobs ORDER BY id") == [(j,) for j in failed.jobs.values()]
    assert prune(week, batch_size=3).jobs == {"completed": 1, "dead": 1}
