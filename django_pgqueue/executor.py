"""Run one job's handler and classify what happened. No database here.

Outcomes: `Success` (with the JSON of a non-None return value), or `Failure` that is
either permanent (straight to dead) or retryable after a delay from the handler's
retry policy or from `RetryLater`. Anything a handler raises, `SystemExit` and
`KeyboardInterrupt` included, becomes a recorded failure, never a dead worker.
"""

from __future__ import annotations

import json
import traceback as tb
from dataclasses import dataclass
from typing import Any

from .context import JobContext
from .exceptions import JobTimeout, PermanentFailure, RetryLater, Snooze, UnknownJobType
from .registry import Handler
from .retry import RetryPolicy

MESSAGE_LIMIT = 4_000
TRACEBACK_LIMIT = 32_000
LAST_ERROR_LIMIT = 1_000

_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


@dataclass(slots=True)
class Success:
    result: str | None = None


@dataclass(slots=True)
class Failure:
    error_class: str
    message: str
    traceback: str
    permanent: bool
    delay: float = 0.0
    # issue 14: a Snooze, written with job_snooze (no attempt spent), not job_fail.
    snoozed: bool = False

    @property
    def last_error(self) -> str:
        return storable(f"{self.error_class}: {self.message}", LAST_ERROR_LIMIT)


Outcome = Success | Failure


def storable(text: str, limit: int) -> str:
    """Make text safe for a PostgreSQL text column: no NUL, valid UTF-8, bounded."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = text[: limit - 20] + "... [truncated]"
    return text


def describe(exc: BaseException) -> tuple[str, str, str]:
    """(error class, message, traceback) of an exception, safe to store."""
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    try:
        message = str(exc)
    except Exception as str_exc:
        message = f"<str() of the exception failed: {type(str_exc).__name__}>"
    trace = "".join(tb.format_exception(cls, exc, exc.__traceback__))
    return storable(name, 255), storable(message, MESSAGE_LIMIT), storable(trace, TRACEBACK_LIMIT)


def run(ctx: JobContext, handler: Handler | None, policy: RetryPolicy) -> Outcome:
    """Call the handler for ctx and classify the result."""
    try:
        if handler is None:
            raise UnknownJobType(f"No handler is registered for job type {ctx.type!r}.")
        value = handler.func(ctx)
    except Snooze as exc:  # issue 14
        return snoozed(exc)
    except RetryLater as exc:
        cls, message, trace = describe(exc)
        return Failure(cls, message, trace, permanent=False, delay=exc.delay)
    except (PermanentFailure, UnknownJobType) as exc:
        return Failure(*describe(exc), permanent=True)
    except BaseException as exc:
        return retryable(exc, ctx, policy)
    return success(value)


def snoozed(snooze: Snooze) -> Failure:
    """The outcome of a handler that raised or returned Snooze."""
    return Failure(
        "django_pgqueue.Snooze",
        storable(str(snooze), MESSAGE_LIMIT),
        "",
        False,
        delay=snooze.seconds,
        snoozed=True,
    )


def success(value: Any) -> Outcome:
    if isinstance(value, Snooze):  # issue 14: returned rather than raised
        return snoozed(value)
    if value is None:
        return Success()
    try:
        text = _dumps(value)
        # jsonb refuses NUL (\u0000) and the UTF-8 encoding refuses lone surrogates.
        if "\\u0000" in text:
            raise ValueError("it contains a NUL character, which PostgreSQL cannot store")
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        return unstorable_result(value, exc)
    return Success(text)


def unstorable_result(value: Any, exc: BaseException) -> Failure:
    """The failure recorded when a handler's return value cannot be stored."""
    return Failure(
        "django_pgqueue.ResultNotStorable",
        storable(
            f"the handler returned {type(value).__name__} {value!r:.200}, which cannot be "
            f"stored as JSON ({exc}); the job ran but is marked dead so it is not re-run",
            MESSAGE_LIMIT,
        ),
        "",
        permanent=True,
    )


def retryable(exc: BaseException, ctx: JobContext, policy: RetryPolicy) -> Failure:
    cls, message, trace = describe(exc)
    try:
        delay = max(0.0, float(policy.delay(ctx.attempt)))
    except Exception:
        delay = 0.0
    return Failure(cls, message, trace, permanent=False, delay=delay)


def timed_out(ctx: JobContext, seconds: float, policy: RetryPolicy) -> Failure:
    exc = JobTimeout(f"the handler ran longer than its timeout of {seconds:g}s")
    return retryable(exc, ctx, policy)
