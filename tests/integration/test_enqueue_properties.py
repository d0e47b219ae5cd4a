"""Whatever enqueue() accepts, the database stores and a worker runs and records.

Hypothesis generates every argument of enqueue(); in about a third of the examples one
of them is made invalid. An accepted job is read back from queue_jobs and
queue_job_state at once; at the end one burst Worker in this process runs every
accepted job with a handler that returns its payload, and each must be completed with
that payload as its stored result. A refused call must raise the documented class
with a message naming the bad argument, and write nothing.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

pytest.importorskip("hypothesis")
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_pgqueue import enqueue
from django_pgqueue.conf import get_settings
from django_pgqueue.exceptions import EnqueueError, PayloadError
from django_pgqueue.models import Attempt, Job, JobState
from django_pgqueue.registry import Handler, registry
from tests.property_strategies import (
    FULL,
    PROPERTY_SETTINGS,
    bad_seconds,
    broken,
    good_seconds,
    json_text,
    json_values,
    queue_names,
    same_json,
    type_names,
    unstorable_values,
)

pytestmark = pytest.mark.django_db(transaction=True)

# Types of this test, so that their echo handlers cannot clash with another test's.
PREFIX = "pq_prop."


def echo(ctx: Any) -> Any:
    return ctx.payload


valid_keys = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=255,
)
VALID: dict[str, st.SearchStrategy[Any]] = {
    "type": type_names(PREFIX),
    "payload": json_values,
    "queue": st.one_of(st.none(), queue_names()),
    "priority": st.one_of(st.none(), st.integers(-100, 100)),
    "delay": st.one_of(
        st.none(), good_seconds, good_seconds.map(lambda s: dt.timedelta(seconds=s))
    ),
    "max_attempts": st.one_of(st.none(), st.integers(1, 1000)),
    "idempotency_key": st.one_of(st.none(), valid_keys),
}
INVALID: dict[str, st.SearchStrategy[Any]] = {
    "type": broken(type_names(PREFIX), 255),
    "payload": unstorable_values(),
    "queue": broken(queue_names(), 63),
    "priority": st.one_of(
        st.integers(max_value=-101), st.integers(min_value=101), st.floats(), st.booleans()
    ),
    "delay": bad_seconds,
    "max_attempts": st.one_of(
        st.integers(max_value=0), st.integers(min_value=1001), st.booleans(), st.floats()
    ),
    "idempotency_key": st.one_of(
        st.just(""),
        json_text.map(lambda t: t + "\x00"),
        st.text("k", min_size=256, max_size=300),
        st.integers(),
    ),
}


@st.composite
def enqueue_calls(draw: Any) -> tuple[str | None, dict[str, Any]]:
    """(the argument made invalid or None, enqueue's keyword arguments)."""
    bad = draw(st.sampled_from([None, None, None, None, None, None, *INVALID]))
    return bad, {
        name: draw(INVALID[name] if name == bad else strategy) for name, strategy in VALID.items()
    }


PLAIN = dict.fromkeys(VALID) | {"type": PREFIX + "plain"}


def seconds_of(delay: Any) -> float:
    if delay is None:
        return 0.0
    return delay.total_seconds() if isinstance(delay, dt.timedelta) else float(delay)


def test_whatever_enqueue_accepts_a_worker_runs_and_records(run_worker):
    accepted: dict[int, Any] = {}  # job id -> the payload given
    queues: set[str] = set()
    default_queue = get_settings().DEFAULT_QUEUE

    @settings(PROPERTY_SETTINGS, max_examples=400 if FULL else 60)
    @given(call=enqueue_calls())
    # Found before: each passed validation, then failed in the database or on the way.
    @example(call=("queue", {**PLAIN, "queue": "email\n"}))
    @example(call=("type", {**PLAIN, "type": PREFIX + "charge\n"}))
    @example(call=("delay", {**PLAIN, "delay": 1e13}))
    @example(call=("delay", {**PLAIN, "delay": 10**400}))
    @example(call=(None, {**PLAIN, "payload": {"x": 1e23, "y": [-0.0, 5e-324, 10**30]}}))
    def enqueue_one(call: tuple[str | None, dict[str, Any]]) -> None:
        bad, args = call
        jobs_before = Job.objects.count()
        if bad is not None:
            error = PayloadError if bad == "payload" else EnqueueError
            with pytest.raises(error) as info:
                enqueue(args.pop("type"), args.pop("payload"), **args)
            message = str(info.value)
            if bad == "payload":
                assert info.value.path.startswith("payload"), message
            else:
                assert message.startswith(bad + " "), message
            assert Job.objects.count() == jobs_before  # nothing half-written
            return

        registry.register(Handler(args["type"], echo))
        job = enqueue(
            args.pop("type"), args["payload"], **{k: v for k, v in args.items() if k != "payload"}
        )
        if not job.created:
            # The idempotency key matched a pending job of an earlier example.
            assert job.id in accepted
            return
        stored = Job.objects.get(pk=job.id)
        state = JobState.objects.get(pk=job.id)
        queue = args["queue"] or default_queue
        assert (stored.queue, state.queue, stored.type) == (queue, queue, job.type)
        assert same_json(stored.payload, args["payload"])
        assert stored.idempotency_key == args["idempotency_key"]
        assert state.status == "pending"
        assert state.priority == (args["priority"] or 0)
        assert state.max_attempts == (args["max_attempts"] or get_settings().MAX_ATTEMPTS)
        ahead = (state.run_at - stored.created_at).total_seconds()
        assert ahead == pytest.approx(seconds_of(args["delay"]), abs=1e-3)
        accepted[job.id] = args["payload"]
        queues.add(queue)

    enqueue_one()
    assert accepted, "no example was accepted"

    # Every accepted job is due now: the delays were checked above.
    JobState.objects.filter(pk__in=accepted).update(run_at=dt.datetime.now(dt.UTC))
    worker = run_worker(sorted(queues), burst=True, concurrency=4, batch_size=20)
    worker.join(120)
    states = dict(JobState.objects.filter(pk__in=accepted).values_list("pk", "status"))
    assert set(states.values()) == {"completed"}, states
    results = dict(
        Attempt.objects.filter(job_id__in=accepted, status="succeeded").values_list(
            "job_id", "result"
        )
    )
    assert results.keys() == accepted.keys()
    for job_id, payload in accepted.items():
        assert same_json(results[job_id], payload), (job_id, payload, results[job_id])
