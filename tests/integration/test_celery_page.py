"""docs/howto/coming-from-celery.md runs as written, block after block.

The page's blocks are executed in order in one namespace, as a reader pasting them into
a shell would; a block whose first line is ``# settings.py`` is applied as the project's
PGQUEUE (merged over the test settings, so retries stay fast). Then what the page says
each spelling does is checked against the tables.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest

from django_pgqueue.models import Attempt, Job, JobState
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = ROOT / "docs" / "howto" / "coming-from-celery.md"
BLOCK = re.compile(
    r"^```python\n(?:# (?P<caption>settings\.py)\n)?(?P<code>.*?)^```", re.DOTALL | re.MULTILINE
)


def page_blocks() -> list[tuple[str | None, str]]:
    return [(m.group("caption"), m.group("code")) for m in BLOCK.finditer(PAGE.read_text())]


def test_the_page_has_every_idiom_and_its_blocks():
    text = PAGE.read_text()
    for idiom in (
        "delay",
        "apply_async",
        "countdown",
        "eta",
        "priority",
        "task_routes",
        "autoretry_for",
        "retry_backoff",
        "max_retries",
        "bind=True",
        "self.retry",
        "AsyncResult.get",
        "beat",
        "rate_limit",
        "revoke",
        "chain",
        "group",
        "chord",
        "task_always_eager",
        "acks_late",
    ):
        assert idiom in text, idiom
    captions = [caption for caption, _ in page_blocks()]
    assert captions.count("settings.py") == 3
    assert len(captions) >= 10


def state(job) -> JobState:
    return JobState.objects.get(pk=job.id)


def test_the_page_runs_and_does_what_it_says(settings):
    namespace: dict = {"__name__": "coming_from_celery"}
    for caption, code in page_blocks():
        if caption == "settings.py":
            project: dict = {}
            exec(compile(code, f"{PAGE.name} ({caption})", "exec"), project)
            settings.PGQUEUE = {**settings.PGQUEUE, **project["PGQUEUE"]}
        else:
            exec(compile(code, PAGE.name, "exec"), namespace)

    # delay / countdown / eta / queue / priority
    jobs = {job.payload.get("email"): job for job in Job.objects.filter(type="receipts.send")}
    states = {email: JobState.objects.get(pk=job.pk) for email, job in jobs.items()}
    assert states["ada@example.com"].queue == "emails"  # the handler's queue
    countdown = states["bob@example.com"].run_at - jobs["bob@example.com"].created_at
    assert dt.timedelta(seconds=59) < countdown <= dt.timedelta(seconds=61)
    eta = states["cy@example.com"].run_at - jobs["cy@example.com"].created_at
    assert dt.timedelta(hours=23) < eta < dt.timedelta(hours=25)
    assert (states["di@example.com"].queue, states["di@example.com"].priority) == ("urgent", 90)

    # routes: exact, glob, the handler's queue, and an explicit queue=
    routed = [namespace[name] for name in ("charge", "refund", "receipt", "urgent")]
    assert [state(job).queue for job in routed] == ["payments", "refunds", "emails", "urgent"]

    # revoke: the delayed job is cancelled
    assert state(namespace["later"]).status == "cancelled"
    assert list(namespace["report"].changed) == [namespace["later"].id]

    # the settings blocks are in force and valid
    from django_pgqueue.conf import get_settings

    conf = get_settings()
    assert "nightly-report" in conf.SCHEDULES
    assert (conf.QUEUES["emails"].rate_count, conf.QUEUES["emails"].rate_period) == (10, 1.0)

    # eager mode's replacement: the page's own test, with its chain
    namespace["test_packing_ships_the_order"]()
    ship = Job.objects.get(type="orders.ship")
    assert ship.payload == {"order_id": 42}
    assert state(ship).status == "completed"

    # retries: a permanent failure is dead at once; RetryLater waits 30 s, spending one
    from django_pgqueue.testing import run_due_jobs

    enqueue = namespace["django_pgqueue"].enqueue
    no_sku = enqueue("stock.sync", {}, queue="stock")
    busy = enqueue("stock.sync", {"sku": "LAMP", "warehouse": "busy"}, queue="stock")
    down = enqueue("stock.sync", {"sku": "LAMP", "warehouse": "down"}, queue="stock")
    negative = enqueue("stock.sync", {"sku": "LAMP", "count": -1}, queue="stock")
    fine = enqueue("stock.sync", {"sku": "LAMP"}, queue="stock")
    run_due_jobs(["stock"])
    assert state(no_sku).status == "dead"
    assert state(no_sku).max_attempts == 4  # max_retries=3
    # autoretry_for: a ConnectionError waits for the backoff (2 s at most, then 4 s,
    # with full jitter); a ValueError is not in the list: dead after its one attempt.
    # A backoff drawn shorter than the burst worker's poll interval is waited for and run
    # at once (a few in a hundred draws): then the next, of a doubled ceiling.
    down_state = state(down)
    assert down_state.status == "pending"
    last = Attempt.objects.filter(job_id=down.id).order_by("-id").first()
    ceiling = 2 * 2 ** (down_state.attempts - 1)
    assert down_state.run_at - last.finished_at <= dt.timedelta(seconds=ceiling + 0.01)
    negative_state = state(negative)
    assert (negative_state.status, negative_state.attempts) == ("dead", 1)
    assert negative_state.last_error == "ValueError: a negative count"
    busy_state = state(busy)
    assert (busy_state.status, busy_state.attempts) == ("pending", 1)
    (attempt,) = Attempt.objects.filter(job_id=busy.id)
    wait = busy_state.run_at - attempt.finished_at
    assert dt.timedelta(seconds=29) < wait <= dt.timedelta(seconds=31)
    assert state(fine).status == "completed"
