"""Celery's autoretry_for, dont_autoretry_for and retry_backoff family, per handler and per
task: which exceptions retry a job, how long it waits, and what registration refuses."""

from __future__ import annotations

import random

import pytest

import django_pgqueue
from django_pgqueue import executor
from django_pgqueue.backends import PgQueueBackend
from django_pgqueue.context import JobContext
from django_pgqueue.exceptions import ConfigurationError, PermanentFailure, RetryLater, Snooze
from django_pgqueue.outcomes import Snoozed
from django_pgqueue.registry import Handler, registry
from django_pgqueue.retry import ExponentialBackoff, FixedDelay, RetryOn, celery_backoff


class Transient(Exception):
    """A failure worth retrying (a timeout, a 503)."""


class Flaky(Transient):
    """A subclass of a retried exception: retried too, as in Celery."""


class Broken(Flaky):
    """Retried by its bases, excluded by dont_autoretry_for."""


def ctx(attempt: int = 1, max_attempts: int = 3) -> JobContext:
    return JobContext(
        job_id=1,
        queue="q",
        type="t",
        payload={},
        attempt=attempt,
        max_attempts=max_attempts,
        lease_version=1,
    )


def run(exc: BaseException, retry_on: RetryOn | None, attempt: int = 1) -> executor.Failure:
    def raises(context: JobContext) -> None:
        raise exc

    outcome = executor.run(ctx(attempt), Handler("t", raises, retry_on=retry_on), FixedDelay(7))
    assert isinstance(outcome, executor.Failure)
    return outcome


def test_retry_on_retries_the_listed_classes_and_their_subclasses_only():
    on = RetryOn(autoretry_for=(Transient,), dont_autoretry_for=(Broken,))
    assert on.retries(Transient())
    assert on.retries(Flaky())
    assert not on.retries(Broken())  # dont_autoretry_for wins over its bases
    assert not on.retries(ValueError())
    assert RetryOn().retries(ValueError())  # no lists: every exception
    assert not RetryOn(dont_autoretry_for=(KeyError,)).retries(KeyError())
    assert RetryOn(dont_autoretry_for=(KeyError,)).retries(ValueError())
    assert not RetryOn(autoretry_for=()).retries(ValueError())  # Celery's default: none


def test_an_exception_the_handler_does_not_retry_is_permanent_with_its_error_recorded():
    failure = run(ValueError("bad input 42"), RetryOn(autoretry_for=(Transient,)))
    assert failure.permanent
    assert (failure.error_class, failure.message) == ("ValueError", "bad input 42")
    assert "raises" in failure.traceback
    assert "ValueError: bad input 42" in failure.traceback
    assert failure.last_error == "ValueError: bad input 42"


def test_a_retried_exception_waits_for_the_policy():
    failure = run(Flaky("503"), RetryOn(autoretry_for=(Transient,)))
    assert (failure.permanent, failure.delay, failure.error_class) == (
        False,
        7.0,
        f"{__name__}.Flaky",
    )
    excluded = run(Broken("for good"), RetryOn((Transient,), (Broken,)))
    assert excluded.permanent
    assert run(KeyError("k"), RetryOn(dont_autoretry_for=(KeyError,))).permanent
    assert not run(ValueError("v"), RetryOn(dont_autoretry_for=(KeyError,))).permanent


def test_the_steering_exceptions_keep_their_meaning_whatever_the_lists_say():
    nothing = RetryOn(autoretry_for=())
    later = run(RetryLater(42), nothing)
    assert (later.permanent, later.delay) == (False, 42)
    snoozed = run(Snooze(5), nothing)
    assert isinstance(snoozed, Snoozed)
    assert not snoozed.permanent
    assert run(PermanentFailure("no"), RetryOn(autoretry_for=(Exception,))).permanent


def test_the_async_path_classifies_the_same():
    import asyncio

    async def raises(context: JobContext) -> None:
        raise ValueError("async bad input")

    handler = Handler("t", raises, retry_on=RetryOn(autoretry_for=(Transient,)))
    outcome = asyncio.run(executor.arun(ctx(), handler, FixedDelay(7)))
    assert isinstance(outcome, executor.Failure)
    assert outcome.permanent
    assert outcome.error_class == "ValueError"


def test_ends_job_says_what_the_classification_says():
    only = RetryOn(autoretry_for=(Transient,))
    assert executor.ends_job(ValueError(), ctx(1), only)  # not retried: ends now
    assert not executor.ends_job(Transient(), ctx(1), only)
    assert executor.ends_job(Transient(), ctx(3), only)  # the last attempt
    assert not executor.ends_job(Snooze(1), ctx(3), only)  # spends no attempt
    assert executor.ends_job(PermanentFailure("x"), ctx(1))
    assert not executor.ends_job(ValueError(), ctx(1))  # no lists: retried


def test_celery_backoff_maps_onto_exponential_backoff():
    assert celery_backoff(True, None, None, "w") == ExponentialBackoff(base=1, cap=600)
    assert celery_backoff(None, None, None, "w") is None
    assert celery_backoff(False, None, None, "w") is None
    exact = celery_backoff(5, 40, False, "w")
    assert exact == ExponentialBackoff(base=5, cap=40, jitter=False)
    assert [exact.delay(n) for n in range(1, 7)] == [5, 10, 20, 40, 40, 40]
    jittered = ExponentialBackoff(base=5, cap=40, rng=random.Random(3))
    delays = [jittered.delay(3) for _ in range(200)]
    assert all(0 <= d <= 20 for d in delays)
    assert len(set(delays)) > 100


def test_a_handler_takes_the_celery_options(settings):
    @django_pgqueue.handler(
        "selective.options",
        autoretry_for=(Transient, "builtins.ConnectionError"),
        dont_autoretry_for=Broken,
        retry_backoff=2,
        retry_backoff_max=30,
        retry_jitter=False,
    )
    def options(context: JobContext) -> None: ...

    spec = registry.find("selective.options")
    assert spec.retry_on == RetryOn((Transient, ConnectionError), (Broken,))
    assert spec.retry == ExponentialBackoff(base=2, cap=30, jitter=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"autoretry_for": ValueError("x")}, r"autoretry_for takes exception classes"),
        ({"autoretry_for": [ValueError, int]}, r"autoretry_for takes exception classes.*int"),
        ({"dont_autoretry_for": "not a path"}, r"dont_autoretry_for takes exception classes"),
        ({"autoretry_for": "shop.nowhere.Gone"}, r"autoretry_for: cannot import 'shop.nowhere"),
        ({"autoretry_for": "json.dumps"}, r"'json.dumps' is .*, not an exception class"),
        ({"autoretry_for": (RetryLater,)}, r"RetryLater steers its job"),
        ({"dont_autoretry_for": "django_pgqueue.PermanentFailure"}, r"PermanentFailure steers"),
        ({"retry_backoff": True, "retry": FixedDelay(1)}, r"give retry or retry_backoff"),
        ({"retry_backoff_max": 60}, r"retry_backoff, which is not given"),
        ({"retry_jitter": False}, r"retry_backoff, which is not given"),
        ({"retry_backoff": -1}, r"retry_backoff must be a finite number"),
        ({"retry_backoff": "1"}, r"retry_backoff must be a finite number"),
        ({"retry_backoff": True, "retry_backoff_max": 0}, r"retry_backoff_max must be"),
        ({"retry_backoff": 10, "retry_backoff_max": 5}, r"retry_backoff_max \(5\) must be >="),
        ({"retry_backoff": True, "retry_jitter": "yes"}, r"retry_jitter must be True or False"),
    ],
)
def test_registration_refuses_bad_options_naming_them(options, message):
    with pytest.raises(ConfigurationError, match=message) as caught:
        django_pgqueue.handler("selective.refused", **options)
    assert "@handler('selective.refused')" in str(caught.value)
    assert registry.find("selective.refused") is None


def backend(tasks: dict) -> PgQueueBackend:
    params = {"BACKEND": "django_pgqueue.backends.PgQueueBackend", "OPTIONS": {"TASKS": tasks}}
    return PgQueueBackend("test", params)


def test_a_tasks_options_take_the_celery_options_and_import_paths_when_resolved():
    configured = backend(
        {
            "shop.tasks.charge": {
                "autoretry_for": ["shop.services.GatewayError", TimeoutError],
                "dont_autoretry_for": "shop.services.CardDeclined",
                "retry_backoff": True,
                "retry_backoff_max": 120,
            },
            # Shapes only when the backend is made: the module may not import yet.
            "shop.tasks.later": {"autoretry_for": "shop.not_yet.Defined"},
        }
    )
    from shop.services import CardDeclined, GatewayError

    options = configured.task_options("shop.tasks.charge")
    assert options.retry == ExponentialBackoff(base=1, cap=120)
    assert options.retry_on.resolve() == RetryOn((GatewayError, TimeoutError), (CardDeclined,))
    assert configured.task_options("shop.tasks.mail").retry_on is None
    later = configured.task_options("shop.tasks.later").retry_on
    with pytest.raises(ConfigurationError, match=r"\['shop.tasks.later'\]: autoretry_for: can"):
        later.resolve()
    [error] = configured.check()
    assert error.id == "pgqueue.E007"
    assert "shop.not_yet.Defined" in error.msg


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"autoretry_for": 42}, r"\['shop.tasks.charge'\]: autoretry_for takes exception"),
        ({"dont_autoretry_for": ["no path"]}, r"dont_autoretry_for takes exception classes"),
        ({"retry_backoff": True, "retry": {"policy": "fixed", "seconds": 1}}, r"not both"),
        ({"retry_jitter": False}, r"retry_backoff, which is not given"),
        ({"retry_backoff": 0}, r"retry_backoff must be a finite number of seconds > 0"),
        ({"autoretry": [ValueError]}, r"unknown key.*'autoretry'"),
    ],
)
def test_a_tasks_bad_options_are_refused_when_the_backend_is_made(entry, message):
    with pytest.raises(ConfigurationError, match=message):
        backend({"shop.tasks.charge": entry})
