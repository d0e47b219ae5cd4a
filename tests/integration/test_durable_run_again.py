"""An operator runs a durable job again from one of its steps, with real workers: that
step's checkpoint and the later ones are dropped in the retry's transaction, the
earlier ones kept, so the job resumes at that step; a running job, a completed one and
a step the job does not have change nothing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.urls import reverse

from django_pgqueue import emit_event, enqueue
from django_pgqueue.actions import NO_STEP, NOT_ALLOWED, RUNNING, cancel, run_again_from
from django_pgqueue.models import Attempt, EventWait, JobState, JobStep
from tests.conftest import ROOT, sql
from tests.integration.test_worker import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)

WORKER = {"poll_interval": 0.05, "sweep_interval": 0.2, "concurrency": 2}


def state(job_id: int) -> JobState:
    return JobState.objects.get(pk=job_id)


def calls(job_id: int) -> dict[str, int]:
    """How many times each step's function was called for the job."""
    rows = sql(
        "SELECT step, count(*) FROM qa_durable_call WHERE job_id = %s GROUP BY step", [job_id]
    )
    return dict(rows)


def checkpoints(job_id: int) -> list[tuple[str, int | None]]:
    """The job's checkpoints in the order recorded: (name, lease version)."""
    steps = JobStep.objects.filter(job_id=job_id).order_by("recorded_at", "name")
    return [(step.name, step.lease_version) for step in steps]


def dead_at_step_4(run_worker) -> int:
    """A job of five steps whose fourth raised on its only attempt: dead."""
    job = enqueue("qa.durable_fails_at", {"fail_at": 4}, queue="ra")
    run_worker(["ra"], burst=True, **WORKER).join(120)
    assert state(job.id).status == "dead"
    assert checkpoints(job.id) == [("s1", 1), ("s2", 1), ("s3", 1)]
    assert calls(job.id) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1}
    return job.id


def test_a_dead_job_runs_again_from_its_second_step(run_worker):
    job_id = dead_at_step_4(run_worker)
    first = JobStep.objects.get(job_id=job_id, name="s1")

    report = run_again_from(job_id, "s2")
    assert (report.changed, report.skipped) == ([job_id], {})
    assert report.message() == "Run again from 's2': 1 changed, 0 skipped."
    # In the retry's transaction: the job is due again under a new lease, its
    # checkpoints from s2 on are gone, s1's stays as it was.
    after = state(job_id)
    assert (after.status, after.attempts, after.lease_version) == ("pending", 0, 2)
    assert checkpoints(job_id) == [("s1", 1)]

    run_worker(["ra"], burst=True, **WORKER).join(120)
    assert state(job_id).status == "completed"
    # Steps 2 to 4 ran again (step 4 succeeds on the second lease), step 1 did not, 5 once.
    assert calls(job_id) == {"s1": 1, "s2": 2, "s3": 2, "s4": 2, "s5": 1}
    # s1's checkpoint is the first attempt's; the others the attempt after the retry's.
    second = Attempt.objects.get(job_id=job_id, status="succeeded")
    assert second.lease_version > 2
    assert checkpoints(job_id) == [("s1", 1)] + [
        (f"s{i}", second.lease_version) for i in range(2, 6)
    ]
    kept = JobStep.objects.get(job_id=job_id, name="s1")
    assert (kept.recorded_at, kept.result) == (first.recorded_at, first.result)
    assert second.result == ["s1", "s2", "s3", "s4", "s5"]


def test_the_concept_pages_block_runs_a_job_again_as_written(run_worker):
    page = (ROOT / "docs" / "concepts" / "durable.md").read_text("utf-8")
    (code,) = [block for block in BLOCK.findall(page) if "run_again_from" in block]
    namespace: dict[str, object] = {"__name__": "docs_block"}
    exec(compile(code, "<docs block>", "exec"), namespace)
    job_id = dead_at_step_4(run_worker)
    assert namespace["run_again"](job_id, "s3") == "Run again from 's3': 1 changed, 0 skipped."
    assert checkpoints(job_id) == [("s1", 1), ("s2", 1)]
    run_worker(["ra"], burst=True, **WORKER).join(120)
    assert state(job_id).status == "completed"
    assert calls(job_id) == {"s1": 1, "s2": 1, "s3": 2, "s4": 2, "s5": 1}


def test_a_step_the_job_does_not_have_changes_nothing(run_worker):
    job_id = dead_at_step_4(run_worker)
    before = state(job_id)
    report = run_again_from(job_id, "s4")  # it raised: it has no checkpoint
    assert (report.changed, report.skipped) == ([], {NO_STEP: [job_id]})
    # The retry was rolled back with it.
    after = state(job_id)
    assert (after.status, after.lease_version) == ("dead", before.lease_version)
    assert checkpoints(job_id) == [("s1", 1), ("s2", 1), ("s3", 1)]


def test_a_running_job_and_a_completed_one_are_refused(run_worker, tmp_path: Path):
    hold = tmp_path / "release"
    running = enqueue("qa.durable_steps", {"steps": 3, "hold_at": 1, "hold": str(hold)}, queue="rb")
    run_worker(["rb"], **WORKER)
    # s0 recorded, s1's function holds the attempt open.
    wait_until(lambda: checkpoints(running.id) == [("s0", 1)] and calls(running.id).get("s1"))
    report = run_again_from(running.id, "s0")
    assert (report.changed, report.skipped) == ([], {RUNNING: [running.id]})
    assert state(running.id).lease_version == 1
    os.close(os.open(hold, os.O_CREAT))
    wait_until(lambda: state(running.id).status == "completed")
    # The handler went on under its lease: nothing was dropped, nothing ran twice.
    assert checkpoints(running.id) == [("s0", 1), ("s1", 1), ("s2", 1)]
    assert calls(running.id) == {"s0": 1, "s1": 1, "s2": 1}

    report = run_again_from(running.id, "s1")
    assert (report.changed, report.skipped) == ([], {NOT_ALLOWED: [running.id]})
    assert report.message() == (
        "Run again from 's1': 0 changed, 1 skipped: 1 not in an allowed state (1 completed)."
    )
    assert checkpoints(running.id) == [("s0", 1), ("s1", 1), ("s2", 1)]


def test_a_cancelled_parked_job_waits_for_its_event_again(run_worker):
    job = enqueue("qa.durable_event", {"key": "ra:paid", "timeout": 3600}, queue="rc")
    run_worker(["rc"], **WORKER)
    wait_until(lambda: state(job.id).status == "waiting")
    assert cancel([job.id]).changed == [job.id]
    assert EventWait.objects.filter(job_id=job.id).exists()

    # From its first step: that checkpoint and the cancelled wait are dropped.
    assert run_again_from(job.id, "before").changed == [job.id]
    assert not EventWait.objects.filter(job_id=job.id).exists()
    # Parked again (the wait's row is back only once the handler waits anew).
    wait_until(
        lambda: (
            state(job.id).status == "waiting"
            and EventWait.objects.filter(job_id=job.id, key="ra:paid").exists()
        )
    )
    emit_event("ra:paid", "paid")
    wait_until(lambda: state(job.id).status == "completed")
    assert calls(job.id) == {"before": 2, "after": 1}
    assert Attempt.objects.get(job_id=job.id, status="succeeded").result == "paid"


def test_the_job_page_offers_it_to_operators_only(run_worker, operator_client, viewer):
    job_id = dead_at_step_4(run_worker)
    page_url = reverse("admin:django_pgqueue_job_change", args=[job_id])
    url = reverse("admin:django_pgqueue_job_run_again", args=[job_id])
    page = operator_client.get(page_url).content.decode()
    assert f'<a class="pgqueue-run-again" href="{url}?step=s2">run again from here</a>' in page

    confirm = operator_client.get(url, {"step": "s2"})
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert '<input type="submit" value="Yes, run again from s2">' in html  # not disabled
    assert [s.name for s in confirm.context["kept"]] == ["s1"]
    assert [s.name for s in confirm.context["dropped"]] == ["s2", "s3"]
    assert operator_client.get(url, {"step": "s9"}).status_code == 404
    assert checkpoints(job_id) == [("s1", 1), ("s2", 1), ("s3", 1)]  # a GET changes nothing

    operator_client.force_login(viewer)
    assert "pgqueue-run-again" not in operator_client.get(page_url).content.decode()
    assert operator_client.get(url, {"step": "s2"}).status_code == 403
    assert operator_client.post(url, {"step": "s2", "post": "yes"}).status_code == 403
    assert state(job_id).status == "dead"
