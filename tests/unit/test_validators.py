"""The shared validators, and every entry point that uses them refusing the same values."""

from __future__ import annotations

import datetime as dt
import logging
import math

import pytest

from django_pgqueue import executor, maintenance, validation, validators
from django_pgqueue.backends import PgQueueBackend
from django_pgqueue.conf import validate
from django_pgqueue.context import JobContext
from django_pgqueue.durations import parse_duration
from django_pgqueue.exceptions import (
    ConfigurationError,
    EnqueueError,
    PayloadError,
    RetryLater,
)
from django_pgqueue.registry import Handler, handler
from django_pgqueue.retry import Bounded, ExponentialBackoff, FixedDelay, bounded
from django_pgqueue.task_paths import import_task
from django_pgqueue.validators import MAX_SECONDS
from django_pgqueue.worker import WorkerConfig
from django_pgqueue.workflows import step

# Seconds that PostgreSQL cannot add to now() (1e13, inf), or that are not numbers.
OUT_OF_RANGE = [math.inf, -math.inf, math.nan, 1e13, 1e308, 10**400, MAX_SECONDS + 1]


@pytest.mark.parametrize("value", [*OUT_OF_RANGE, 0, -1, True, "5", None])
def test_seconds_refuses_what_postgresql_cannot_hold(value):
    with pytest.raises(ValueError, match=r"lease must be a finite number of seconds > 0 and at"):
        validators.seconds(value, "lease")


def test_seconds_accepts_the_range_and_returns_floats():
    assert validators.seconds(MAX_SECONDS, "x") == float(MAX_SECONDS)
    assert validators.seconds(0.001, "x") == 0.001
    assert validators.seconds(0, "x", allow_zero=True) == 0.0
    assert type(validators.seconds(3, "x")) is float
    with pytest.raises(ConfigurationError, match=">= 0"):
        validators.seconds(-0.5, "x", allow_zero=True, error=ConfigurationError)


@pytest.mark.parametrize("value", [0, 11, True, 2.0, "3", None])
def test_count_refuses_outside_its_bounds(value):
    with pytest.raises(ValueError, match=r"n must be an integer from 1 to 10, got"):
        validators.count(value, "n", 1, 10)


def test_count_without_a_top():
    assert validators.count(10**9, "n", 2) == 10**9
    with pytest.raises(ValueError, match=">= 2"):
        validators.count(1, "n", 2)


# Each entry point, given a bad number of seconds, raises its own error class naming
# the value as the caller knows it.
def _conf(key):
    return lambda v: validate({key: v})


def _backend(value):
    return PgQueueBackend("default", {"QUEUES": [], "OPTIONS": {"TIMEOUT": value}})


SECONDS_ENTRY_POINTS = {
    "PGQUEUE LEASE": (_conf("LEASE"), ConfigurationError, r"PGQUEUE\['LEASE'\]"),
    "PGQUEUE JOB_TIMEOUT": (_conf("JOB_TIMEOUT"), ConfigurationError, "JOB_TIMEOUT"),
    "PGQUEUE POLL_INTERVAL": (_conf("POLL_INTERVAL"), ConfigurationError, "POLL_INTERVAL"),
    "PGQUEUE SWEEP_INTERVAL": (_conf("SWEEP_INTERVAL"), ConfigurationError, "SWEEP_INTERVAL"),
    "PGQUEUE SHUTDOWN_GRACE": (_conf("SHUTDOWN_GRACE"), ConfigurationError, "SHUTDOWN_GRACE"),
    "PGQUEUE RETRY_BACKOFF_CAP": (_conf("RETRY_BACKOFF_CAP"), ConfigurationError, "_CAP"),
    "Worker lease": (lambda v: WorkerConfig.build(["a"], lease=v), ConfigurationError, "lease"),
    "Worker poll_interval": (
        lambda v: WorkerConfig.build(["a"], poll_interval=v),
        ConfigurationError,
        "poll_interval",
    ),
    "Worker sweep_interval": (
        lambda v: WorkerConfig.build(["a"], sweep_interval=v),
        ConfigurationError,
        "sweep_interval",
    ),
    "Worker job_timeout": (
        lambda v: WorkerConfig.build(["a"], job_timeout=v),
        ConfigurationError,
        "job_timeout",
    ),
    "Worker shutdown_grace": (
        lambda v: WorkerConfig.build(["a"], shutdown_grace=v),
        ConfigurationError,
        "shutdown_grace",
    ),
    "@handler timeout": (
        lambda v: handler("validators.never", timeout=v),
        ConfigurationError,
        r"@handler\('validators.never'\): timeout",
    ),
    "Tasks OPTIONS TIMEOUT": (_backend, ConfigurationError, "TIMEOUT"),
    "ExponentialBackoff cap": (lambda v: ExponentialBackoff(cap=v), ValueError, "cap"),
    "FixedDelay seconds": (lambda v: FixedDelay(v), ValueError, "seconds"),
    "enqueue delay": (lambda v: validation.schedule(None, v), EnqueueError, "delay"),
}


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e13, 1e308])
@pytest.mark.parametrize("entry", sorted(SECONDS_ENTRY_POINTS))
def test_every_entry_point_refuses_the_same_seconds(entry, value):
    call, error, name = SECONDS_ENTRY_POINTS[entry]
    with pytest.raises(error, match=name + r".* finite number of seconds .*at most 316,224,000"):
        call(value)


# A flag (takes_results) and the choice between a policy and Celery's backoff are
# refused in the same words by a handler, a task's OPTIONS entry and a workflow step.
def _task(**entry):
    tasks = {"shop.tasks.charge": entry}
    return PgQueueBackend("default", {"QUEUES": [], "OPTIONS": {"TASKS": tasks}})


FLAG_ENTRY_POINTS = {
    "@handler": (lambda v: handler("validators.flag", takes_results=v), ConfigurationError),
    "Tasks OPTIONS": (lambda v: _task(takes_results=v), ConfigurationError),
    "workflow step": (lambda v: step("validators.flag", takes_results=v), EnqueueError),
}


@pytest.mark.parametrize("value", [1, 0, "yes", None])
@pytest.mark.parametrize("entry", sorted(FLAG_ENTRY_POINTS))
def test_every_entry_point_refuses_the_same_takes_results(entry, value):
    call, error = FLAG_ENTRY_POINTS[entry]
    with pytest.raises(error, match=rf"takes_results.* must be True or False, got {value!r}\."):
        call(value)


@pytest.mark.parametrize(
    "call",
    [
        lambda: handler("validators.both", retry=FixedDelay(1), retry_backoff=True),
        lambda: _task(retry={"policy": "fixed", "seconds": 1}, retry_backoff=True),
    ],
    ids=["@handler", "Tasks OPTIONS"],
)
def test_a_policy_and_celerys_backoff_are_refused_together_in_the_same_words(call):
    with pytest.raises(ConfigurationError, match="give retry or retry_backoff, not both"):
        call()


# -- names -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["email\n", "email\r\n", "\nemail", "a\nb"])
def test_queue_names_with_a_newline_are_refused_everywhere(name):
    with pytest.raises(EnqueueError, match="not a valid queue name"):
        validation.queue_name(name)
    with pytest.raises(ConfigurationError, match="DEFAULT_QUEUE"):
        validate({"DEFAULT_QUEUE": name})
    with pytest.raises(ConfigurationError, match="not a valid queue name"):
        WorkerConfig.build([name])
    with pytest.raises(ConfigurationError, match="not a valid queue name"):
        PgQueueBackend("default", {"QUEUES": [name]})
    assert not validators.is_queue_name(name)


@pytest.mark.parametrize("name", ["payments.charge\n", "payments.charge\r\n", "a\nb"])
def test_type_names_with_a_newline_are_refused_everywhere(name):
    with pytest.raises(EnqueueError, match="not a valid job type"):
        validation.type_name(name)
    with pytest.raises(ConfigurationError, match="not a valid job type"):
        handler(name)
    assert not validators.is_type_name(name)


def test_task_paths_with_a_trailing_newline_are_not_task_paths():
    with pytest.raises(ConfigurationError, match="task module paths"):
        PgQueueBackend("default", {"OPTIONS": {"TASKS": {"shop.tasks.charge\n": {}}}})
    assert import_task("shop.tasks.charge\n") is None


# -- payload size in bytes ------------------------------------------------------------------


def test_enqueue_many_measures_the_payload_limit_in_bytes_not_characters():
    payload = "é" * 60  # 62 characters of JSON, 122 bytes
    with pytest.raises(PayloadError, match="122 bytes as JSON, over the limit of 100"):
        validation.payload(payload, 100)
    with pytest.raises(PayloadError, match="item 0: payload is 122 bytes"):
        validation.payloads([payload], 100)
    assert validation.payloads(["é" * 48], 100) == '["' + "é" * 48 + '"]'


# -- delays computed while a job runs --------------------------------------------------


@pytest.mark.parametrize("delay", [math.inf, 1e13, 10**400])
def test_retry_later_clamps_a_delay_postgresql_cannot_hold(delay, caplog):
    with caplog.at_level(logging.WARNING, logger="django_pgqueue"):
        exc = RetryLater(delay)
    assert exc.delay == MAX_SECONDS
    assert "RetryLater delay" in caplog.text
    assert "316224000" in caplog.text


@pytest.mark.parametrize("delay", [math.nan, -1, "5", True])
def test_retry_later_refuses_a_delay_that_is_not_seconds(delay):
    with pytest.raises(ValueError, match="RetryLater delay must be a number of seconds >= 0"):
        RetryLater(delay)


def test_retry_later_keeps_a_delay_in_range():
    assert RetryLater(2.5).delay == 2.5
    assert RetryLater(MAX_SECONDS).delay == MAX_SECONDS


class ReturnsDelay:
    def __init__(self, value: float) -> None:
        self.value = value

    def delay(self, attempt: int) -> float:
        return self.value


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (math.inf, MAX_SECONDS),
        (1e13, MAX_SECONDS),
        (10**400, MAX_SECONDS),
        (-5.0, 0.0),
        (math.nan, 0.0),
        (7.0, 7.0),
        (7, 7.0),
    ],
)
def test_a_handlers_custom_policy_is_bounded(returned, expected, caplog):
    spec = Handler("validators.custom", lambda ctx: None, retry=ReturnsDelay(returned))
    assert isinstance(spec.retry, Bounded)
    ctx = JobContext(
        job_id=1,
        queue="q",
        type="validators.custom",
        payload=None,
        attempt=1,
        max_attempts=5,
        lease_version=1,
        priority=0,
        worker_id="w",
        created_at=None,
    )
    with caplog.at_level(logging.WARNING, logger="django_pgqueue"):
        failure = executor.retryable(ValueError("boom"), ctx, spec.retry)
    assert failure.delay == expected
    assert ("outside 0.." in caplog.text) == (returned != expected)


def test_policies_in_range_by_construction_are_not_wrapped():
    for policy in (ExponentialBackoff(), FixedDelay(3)):
        assert bounded(policy) is policy
    wrapped = bounded(ReturnsDelay(1.0))
    assert bounded(wrapped) is wrapped


# -- operator durations and batch sizes ------------------------------------------------------


@pytest.mark.parametrize("text", ["523w", "3661d", "99999999999999w"])
def test_a_duration_longer_than_the_bound_is_refused(text):
    with pytest.raises(ValueError, match=rf"the duration '{text}' must be .*at most 316,224,000"):
        parse_duration(text)


def test_maintenance_refuses_ages_and_batch_sizes_out_of_range_before_any_query():
    with pytest.raises(ValueError, match=r"older_than must be .*at most 316,224,000"):
        maintenance.prune(dt.timedelta(days=999_999_999))
    with pytest.raises(ValueError, match=r"since must be .*at most 316,224,000"):
        maintenance.requeue_dead(since=dt.timedelta(days=999_999_999))
    for bad in (0, True, 2.5, "10"):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            maintenance.prune(dt.timedelta(days=1), batch_size=bad)
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            maintenance.requeue_dead(batch_size=bad)
