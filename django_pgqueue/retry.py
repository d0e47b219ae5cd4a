"""Retry policies: how long a failed job waits before its next attempt, and for which
exceptions a job is retried at all.

The default is exponential backoff with full jitter: attempt n waits
``uniform(0, min(cap, base * 2 ** (n - 1)))`` seconds, so a thousand jobs that fail
together come back spread out instead of as a second wave. `FixedDelay` is the
counter-example from the design article: every retry of a burst lands at once.

`RetryOn` is a handler's choice of exceptions (Celery's ``autoretry_for`` and
``dont_autoretry_for``): any other is a permanent failure. `celery_backoff` maps
Celery's ``retry_backoff``, ``retry_backoff_max`` and ``retry_jitter`` onto
`ExponentialBackoff`. Both are checked where a handler or a task is registered.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from django.utils.module_loading import import_string

from . import validators
from .conf import get_settings
from .exceptions import ConfigurationError, PermanentFailure, RetryLater, Snooze


@runtime_checkable
class RetryPolicy(Protocol):
    """How long a failed job waits: any object with a delay(attempt) method is one."""

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        ...


def _seconds(name: str, value: float) -> float:
    return validators.seconds(value, name, allow_zero=True)


@dataclass(frozen=True)
class ExponentialBackoff:
    """Full jitter: uniform(0, min(cap, base * 2 ** (attempt - 1))).

    With ``jitter=False`` every retry waits the whole ceiling, min(cap, base * 2 **
    (attempt - 1)): Celery's ``retry_jitter=False``, and a burst's retries land together.
    """

    # The defaults of PGQUEUE's RETRY_BACKOFF_BASE and RETRY_BACKOFF_CAP.
    base: float = 15.0
    cap: float = 21600.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    jitter: bool = True

    def __post_init__(self) -> None:
        _seconds("base", self.base)
        _seconds("cap", self.cap)
        if self.cap < self.base:
            raise ValueError(f"cap ({self.cap:g}) must be >= base ({self.base:g})")
        if not isinstance(self.jitter, bool):
            raise ValueError(f"jitter must be True or False, got {self.jitter!r}")

    def ceiling(self, attempt: int) -> float:
        """The largest delay attempt number `attempt` can draw."""
        # 2 ** 1000 overflows a float; the cap is reached long before.
        return min(self.cap, self.base * 2.0 ** min(max(attempt, 1) - 1, 1000))

    def delay(self, attempt: int) -> float:
        if not self.jitter:
            return self.ceiling(attempt)
        return self.rng.uniform(0.0, self.ceiling(attempt))


@dataclass(frozen=True)
class FixedDelay:
    """The same delay after every failure (no jitter)."""

    seconds: float = 10.0

    def __post_init__(self) -> None:
        _seconds("seconds", self.seconds)

    def delay(self, attempt: int) -> float:
        return self.seconds


@dataclass(frozen=True)
class Bounded:
    """Another policy whose delays are kept within 0..MAX_SECONDS (10 years).

    A delay outside that range (infinity, 1e13, NaN, negative) would make the retry's
    `now() + interval` fail in PostgreSQL and leave the job without an outcome; it is
    clamped instead, with a warning naming the policy.
    """

    policy: RetryPolicy

    def delay(self, attempt: int) -> float:
        value = self.policy.delay(attempt)
        if isinstance(value, bool) or not isinstance(value, int | float):
            value = float(value)  # as the worker always read a policy's answer
        return validators.clamp_seconds(value, f"retry policy {self.policy!r} delay")


def bounded(policy: RetryPolicy) -> RetryPolicy:
    """`policy`, wrapped in `Bounded` unless its delays are in range by construction."""
    # Exact types: a subclass may override delay().
    if type(policy) in (ExponentialBackoff, FixedDelay, Bounded):
        return policy
    return Bounded(policy)


def default_policy() -> RetryPolicy:
    """The full-jitter policy configured by PGQUEUE's RETRY_BACKOFF_BASE and _CAP."""
    conf = get_settings()
    return ExponentialBackoff(base=conf.RETRY_BACKOFF_BASE, cap=conf.RETRY_BACKOFF_CAP)


# The exceptions a handler raises to steer its job: they keep their meaning whatever a
# handler's RetryOn says, so naming one in its lists is refused as a mistake.
_STEERING = (PermanentFailure, RetryLater, Snooze)


@dataclass(frozen=True)
class RetryOn:
    """Which exceptions a handler's jobs are retried for; any other fails the job for good.

    `autoretry_for` (None: every exception) and `dont_autoretry_for` are Celery's: an
    exception is retried, while attempts remain, when it is an instance of a class of
    `autoretry_for` and of none of `dont_autoretry_for`. `RetryLater`, `Snooze` and
    `PermanentFailure` keep their meaning whatever the lists say.
    """

    autoretry_for: tuple[type[BaseException], ...] | None = None
    dont_autoretry_for: tuple[type[BaseException], ...] = ()

    def retries(self, exc: BaseException) -> bool:
        """Whether a failure that raised `exc` is retried (while attempts remain)."""
        if isinstance(exc, self.dont_autoretry_for):
            return False
        return self.autoretry_for is None or isinstance(exc, self.autoretry_for)


def retry_on(autoretry_for: Any, dont_autoretry_for: Any, where: str) -> RetryOn | None:
    """A handler's `RetryOn` from its options (None when it gives neither list).

    Each list is an exception class, its dotted path (``"requests.RequestException"``,
    imported now) or a list or tuple of them; ConfigurationError names a bad entry.
    """
    if autoretry_for is None and dont_autoretry_for is None:
        return None
    only = None
    if autoretry_for is not None:
        only = _exception_classes(autoretry_for, f"{where}: autoretry_for")
    never = ()
    if dont_autoretry_for is not None:
        never = _exception_classes(dont_autoretry_for, f"{where}: dont_autoretry_for")
    return RetryOn(only, never)


_DOTTED_PATH = re.compile(r"\A[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\Z")


def exception_entries(value: Any, where: str) -> tuple[type[BaseException] | str, ...]:
    """An autoretry_for or dont_autoretry_for list checked without importing anything:
    exception classes and dotted paths, as a tuple (one entry may stand alone)."""
    entries = tuple(value) if isinstance(value, list | tuple) else (value,)
    for entry in entries:
        if isinstance(entry, str) and _DOTTED_PATH.match(entry):
            continue
        if isinstance(entry, type) and issubclass(entry, BaseException):
            _not_steering(entry, where)
            continue
        raise ConfigurationError(
            f"{where} takes exception classes or their dotted paths "
            f"('requests.RequestException'), in a tuple or a list; got {entry!r}."
        )
    return entries


def _exception_classes(value: Any, where: str) -> tuple[type[BaseException], ...]:
    classes = []
    for entry in exception_entries(value, where):
        if isinstance(entry, str):
            try:
                found = import_string(entry)
            except ImportError as exc:
                raise ConfigurationError(f"{where}: cannot import {entry!r} ({exc}).") from None
            if not (isinstance(found, type) and issubclass(found, BaseException)):
                raise ConfigurationError(
                    f"{where}: {entry!r} is {found!r}, not an exception class."
                )
            _not_steering(found, where)
            entry = found
        classes.append(entry)
    return tuple(classes)


def _not_steering(cls: type[BaseException], where: str) -> None:
    if issubclass(cls, _STEERING):
        raise ConfigurationError(
            f"{where}: {cls.__name__} steers its job whatever the list says "
            "(PermanentFailure: dead now; RetryLater: retried after its delay; Snooze: "
            "later, no attempt spent); leave it out."
        )


# Celery's default retry_backoff_max: 10 minutes.
CELERY_BACKOFF_MAX = 600.0


def celery_backoff(
    retry_backoff: Any, retry_backoff_max: Any, retry_jitter: Any, where: str
) -> ExponentialBackoff | None:
    """The policy of Celery's ``retry_backoff``, ``retry_backoff_max`` and ``retry_jitter``.

    ``retry_backoff=True`` is a first delay of 1 second, a number that first delay; the
    delays double up to ``retry_backoff_max`` (default 600 s), full jitter unless
    ``retry_jitter=False``. None when `retry_backoff` is not given (or False);
    ConfigurationError for a bad value, or for the other two without it.
    """
    if retry_backoff is None or retry_backoff is False:
        if retry_backoff_max is not None or retry_jitter is not None:
            raise ConfigurationError(
                f"{where}: retry_backoff_max and retry_jitter shape the delays of "
                "retry_backoff, which is not given: add retry_backoff=True (a first delay "
                "of 1 s) or the first delay in seconds."
            )
        return None
    if retry_backoff is True:
        base = 1.0
    else:
        base = validators.seconds(
            retry_backoff, f"{where}: retry_backoff", error=ConfigurationError
        )
    cap = CELERY_BACKOFF_MAX
    if retry_backoff_max is not None:
        name = f"{where}: retry_backoff_max"
        cap = validators.seconds(retry_backoff_max, name, error=ConfigurationError)
    if retry_jitter is not None:
        validators.flag(retry_jitter, f"{where}: retry_jitter", error=ConfigurationError)
    if cap < base:
        raise ConfigurationError(
            f"{where}: retry_backoff_max ({cap:g}) must be >= the first delay, retry_backoff "
            f"({base:g})."
        )
    return ExponentialBackoff(base=base, cap=cap, jitter=retry_jitter is not False)


def retry_or_backoff(
    retry: RetryPolicy | None,
    retry_backoff: Any,
    retry_backoff_max: Any,
    retry_jitter: Any,
    where: str,
) -> RetryPolicy | None:
    """The policy a handler or a task asked for: `retry`, or the Celery backoff of the
    other three (`celery_backoff`); ConfigurationError when it gives both."""
    backoff = celery_backoff(retry_backoff, retry_backoff_max, retry_jitter, where)
    if backoff is not None and retry is not None:
        raise ConfigurationError(
            f"{where}: give retry or retry_backoff, not both (retry_backoff is an "
            "ExponentialBackoff policy)."
        )
    return retry or backoff
