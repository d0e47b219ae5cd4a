import time
from collections import Counter

import pytest

from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.worker import QueueScheduler, WorkerConfig


def test_weighted_round_robin_gives_turns_in_proportion():
    scheduler = QueueScheduler(("payments", "email"), {"payments": 3})
    firsts = Counter(scheduler.order()[0] for _ in range(400))
    assert firsts == {"payments": 300, "email": 100}


def test_every_round_offers_every_queue():
    scheduler = QueueScheduler(("a", "b", "c"), {})
    for _ in range(10):
        assert sorted(scheduler.order()) == ["a", "b", "c"]


def test_unweighted_queues_alternate():
    scheduler = QueueScheduler(("a", "b"), {})
    assert [scheduler.order()[0] for _ in range(4)] == ["a", "b", "a", "b"]


@pytest.mark.parametrize(
    ("queues", "options", "message"),
    [
        ([], {}, "at least one queue"),
        (["a", "a"], {}, "repeat"),
        (["a b"], {}, "not a valid queue name"),
        (["a"], {"weights": {"b": 2}}, "not one of the worker's queues"),
        (["a"], {"weights": {"a": 0}}, "1..1000"),
        (["a"], {"concurrency": 0}, "concurrency"),
        (["a"], {"lease": 3, "heartbeat_interval": 2}, "at most half the lease"),
    ],
)
def test_worker_config_is_validated(queues, options, message):
    with pytest.raises(ConfigurationError, match=message):
        WorkerConfig.build(queues, **options)


def test_heartbeat_follows_a_short_lease():
    config = WorkerConfig.build(["a"], lease=2)
    assert config.heartbeat_interval == pytest.approx(2 / 3)


def test_a_retry_due_before_the_poll_is_looked_for_and_keeps_a_burst_worker():
    """A claim that finds nothing just after a retry was written must not hide the queue
    past the retry's due time, and the worker is not idle until a claim at or after it
    (a burst worker used to exit with the retry pending: a full-jitter delay near 0)."""
    from django_pgqueue.worker.scheduler import ClaimScheduler

    claims = ClaimScheduler(("soon",), {}, poll_interval=0.5)
    claims.retry_scheduled("soon", due=10.05)
    claims.claimed("soon", 10, None, [], sent=10.01)  # the retry is not due yet
    assert not claims.idle(10.02)  # the retry is about to be due
    assert claims.next_look(10.0) == 10.05  # not 10.51, a poll later
    assert not claims.idle(10.06)  # due: not idle before a claim has looked
    assert claims.refresh(10.06)  # the queue is offered to the next claim
    claims.claimed("soon", 10, None, [], sent=10.06)  # it ran elsewhere, say
    # Empty: one more look first (this worker's last writes may have made jobs due).
    assert not claims.idle(10.07)
    assert claims.refresh(10.07)
    claims.claimed("soon", 10, None, [], sent=10.07)
    assert claims.idle(10.08)
    assert claims.next_look(10.0) == 10.57


class _ControlsView:
    """A session whose queue_controls hold `controlled`; counts the reads."""

    def __init__(self, *controlled: str) -> None:
        self.controlled = controlled
        self.reads = 0

    def run(self, name: str, params: dict[str, object]) -> list[tuple[str]]:
        assert name == "queue_control_list"
        self.reads += 1
        return [(queue,) for queue in self.controlled]


def test_a_waiting_worker_reads_the_controls_view_ahead_of_its_due_time():
    """The view falls due every `view_every`: a worker about to wait reads it a quarter
    of that ahead (its wait ends then), so a claim woken by a NOTIFY finds it fresh."""
    from django_pgqueue.store.claims import QueueClaims
    from django_pgqueue.worker.scheduler import ClaimScheduler

    view = _ControlsView()
    control = QueueClaims(view, view_every=0.5)  # type: ignore[arg-type]
    claims = ClaimScheduler(("mail",), {}, poll_interval=1.0, claims=control)
    start = time.monotonic()
    assert not control.refresh_ahead(start)  # read (never read yet): nothing controlled
    assert view.reads == 1
    assert claims.next_look(start) == pytest.approx(start + 0.375)  # before it is due
    assert not control.refresh_ahead(start + 0.3)  # not due soon: not read
    assert view.reads == 1
    view.controlled = ("mail",)
    assert control.refresh_ahead(start + 0.375)  # read ahead: `mail` became controlled
    assert view.reads == 2
    assert control.controlled("mail")  # a claim now finds it fresh: no read of its own
    assert view.reads == 2
    assert claims.refresh(time.monotonic())
    assert claims.order() == ["mail"]  # claimed at once
    assert claims.next_look(start + 1.0) is None  # past: a refused read is left to the claim
