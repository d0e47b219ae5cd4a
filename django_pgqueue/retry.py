"""Retry policies: how long a failed job waits before its next attempt.

The default is exponential backoff with full jitter: attempt n waits
``uniform(0, min(cap, base * 2 ** (n - 1)))`` seconds, so a thousand jobs that fail
together come back spread out instead of as a second wave. `FixedDelay` is the
counter-example from the design article: every retry of a burst lands at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from . import validators
from .conf import get_settings


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
    """Full jitter: uniform(0, min(cap, base * 2 ** (attempt - 1)))."""

    # The defaults of PGQUEUE's RETRY_BACKOFF_BASE and RETRY_BACKOFF_CAP.
    base: float = 15.0
    cap: float = 21600.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        _seconds("base", self.base)
        _seconds("cap", self.cap)
        if self.cap < self.base:
            raise ValueError(f"cap ({self.cap:g}) must be >= base ({self.base:g})")

    def ceiling(self, attempt: int) -> float:
        """The largest delay attempt number `attempt` can draw."""
        # 2 ** 1000 overflows a float; the cap is reached long before.
        return min(self.cap, self.base * 2.0 ** min(max(attempt, 1) - 1, 1000))

    def delay(self, attempt: int) -> float:
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
