"""Run one job's handler and classify what happened. No database here (a handler
that takes its parents' results has them read through its context, as its own call).

Outcomes (the types live in `outcomes.py`): `Success` (with the JSON of a non-None
return value), or `Failure` that is either permanent (straight to dead) or retryable
after a delay from the handler's retry policy or from `RetryLater`. Anything a handler
raises, `SystemExit` and `KeyboardInterrupt` included, becomes a recorded failure,
never a dead worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import traceback as tb
from typing import Any

from asgiref.sync import sync_to_async

from .context import JobContext, async_handler_job
from .exceptions import JobTimeout, PermanentFailure, RetryLater, Snooze, UnknownJobType
from .outcomes import (
    ERROR_CLASS_LIMIT,
    MESSAGE_LIMIT,
    NO_RESULT,
    TRACEBACK_LIMIT,
    Dead,
    Failure,
    Outcome,
    Retry,
    Snoozed,
    Success,
    storable,
    unstorable_result,
)
from .registry import Handler
from .retry import RetryOn, RetryPolicy

_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


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
    return (
        storable(name, ERROR_CLASS_LIMIT),
        storable(message, MESSAGE_LIMIT),
        storable(trace, TRACEBACK_LIMIT),
    )


# The attribute a handler's runner sets on an exception it has logged already.
LOGGED = "_pgqueue_logged"


def mark_logged(exc: BaseException) -> None:
    """Note that `exc` was logged with its traceback where the handler ran."""
    with contextlib.suppress(AttributeError, TypeError):  # one that takes no attributes
        setattr(exc, LOGGED, True)


# The attribute a handler's runner sets on an exception that must not be retried,
# whatever its class (see `mark_permanent`).
PERMANENT = "_pgqueue_permanent"


def mark_permanent(exc: BaseException) -> None:
    """Make the failure that raised `exc` permanent, its class recorded as it is: for a
    runner whose framework names the error (Django's TypeError for a task's return
    value that cannot be stored), when the code already ran and a retry would run it
    again."""
    with contextlib.suppress(AttributeError, TypeError):  # one that takes no attributes
        setattr(exc, PERMANENT, True)


def _logged(failure: Failure, exc: BaseException) -> Failure:
    failure.logged = getattr(exc, LOGGED, False) is True
    return failure


def run(ctx: JobContext, handler: Handler | None, policy: RetryPolicy) -> Outcome:
    """Call the handler for ctx and classify the result; never raises for the job."""
    try:
        try:
            if handler is None:
                raise UnknownJobType(f"No handler is registered for job type {ctx.type!r}.")
            arguments = (_results(ctx), ctx) if handler.takes_results else (ctx,)
            value = handler.func(*arguments)
        except BaseException as exc:
            return classify(exc, ctx, policy, _retry_on(handler))
        return success(value)
    except BaseException as exc:  # classifying itself failed: still an outcome
        return fallback_failure(exc)


async def arun(ctx: JobContext, handler: Handler | None, policy: RetryPolicy) -> Outcome:
    """Await an async handler for ctx and classify the result, like `run`.

    Only a cancellation of the task running it propagates (`asyncio.CancelledError`
    while the task is being cancelled): whoever cancelled it knows why and records
    that. A CancelledError the handler raises of its own is a failure like any other.
    """
    try:
        try:
            if handler is None or handler.coroutine is None:
                raise UnknownJobType(f"No async handler is registered for job type {ctx.type!r}.")
            # This job's task runs in a context of its own: the mark stays with it.
            async_handler_job.set(ctx.job_id)
            if handler.takes_results:
                # The read runs on Django's thread for sync calls, never on the loop.
                results = await sync_to_async(_results)(ctx)
                value = await handler.coroutine(results, ctx)
            else:
                value = await handler.coroutine(ctx)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return classify(exc, ctx, policy, _retry_on(handler))
        except BaseException as exc:
            return classify(exc, ctx, policy, _retry_on(handler))
        return success(value)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        return fallback_failure(exc)


def _results(ctx: JobContext) -> Any:
    """The results a handler with takes_results receives (None: its job waits for none)."""
    arguments = ctx.results_arguments()
    return arguments[0] if arguments else None


def _retry_on(handler: Handler | None) -> RetryOn | None:
    return None if handler is None else handler.retry_on


def classify(
    exc: BaseException, ctx: JobContext, policy: RetryPolicy, retry_on: RetryOn | None = None
) -> Failure:
    """The failure of a handler that raised `exc` (Snooze, RetryLater, permanent, other);
    `retry_on`: the exceptions its handler retries (None: every one)."""
    if isinstance(exc, Snooze):  # pending again later, its attempt given back
        return snoozed(exc)
    if isinstance(exc, RetryLater):
        cls, message, trace = describe(exc)
        return Retry(cls, message, trace, delay=exc.delay)
    if permanent(exc, retry_on):
        return _logged(Dead(*describe(exc)), exc)
    return _logged(retryable(exc, ctx, policy), exc)


def permanent(exc: BaseException, retry_on: RetryOn | None = None) -> bool:
    """Whether a handler that raised `exc` fails its job for good: `PermanentFailure`, an
    unknown type, an exception marked permanent (`mark_permanent`), or one its handler
    does not retry (`retry_on`). `RetryLater` and `Snooze` never are."""
    if isinstance(exc, PermanentFailure | UnknownJobType) or getattr(exc, PERMANENT, False) is True:
        return True
    if isinstance(exc, RetryLater | Snooze):
        return False
    return retry_on is not None and not retry_on.retries(exc)


def ends_job(exc: BaseException, ctx: JobContext, retry_on: RetryOn | None = None) -> bool:
    """Whether the attempt that raised `exc` ends its job (dead), as `classify` decides:
    a permanent failure, or any failure but a `Snooze` (which spends no attempt) on the
    job's last attempt."""
    if isinstance(exc, Snooze):
        return False
    return permanent(exc, retry_on) or ctx.is_last_attempt


def decode_failure(exc: BaseException) -> Failure:
    """The permanent failure of a payload that cannot be decoded (it never will be)."""
    try:
        return Dead(*describe(exc))
    except BaseException:
        return fallback_failure(exc, permanent=True)


def fallback_failure(exc: BaseException, *, permanent: bool = False) -> Failure:
    """A failure built from the exception's class alone, when describing it failed too."""
    cls = type(exc)
    end = Dead if permanent else Retry
    return end(
        storable(f"{cls.__module__}.{cls.__qualname__}", ERROR_CLASS_LIMIT),
        "the outcome of the handler could not be described",
    )


def snoozed(snooze: Snooze) -> Failure:
    """The outcome of a handler that raised or returned Snooze."""
    return Snoozed(
        "django_pgqueue.Snooze", storable(str(snooze), MESSAGE_LIMIT), delay=snooze.seconds
    )


def success(value: Any) -> Outcome:
    """The Success of a handler's return value, or why the value cannot be stored.

    Anything raised while encoding (a `__str__` or `default` of the value's own, a
    recursion) makes the value unstorable: the job ran, so it is not re-run.
    """
    if value is None:
        return NO_RESULT
    if isinstance(value, Snooze):  # returned rather than raised
        return snoozed(value)
    try:
        text = _dumps(value)
        # jsonb refuses NUL and the UTF-8 encoding refuses lone surrogates. The test is
        # on the value's strings: the encoded text spells a backslash as "\\", so a
        # substring test on it would take r"C:\u0000dir" for a NUL.
        if _has_nul(value):
            raise ValueError("it contains a NUL character, which PostgreSQL cannot store")
        text.encode("utf-8")
    except Exception as exc:
        return unstorable_result(value, exc)
    return Success(text)


def _has_nul(value: Any) -> bool:
    """A NUL in any string of a JSON-encodable value (keys included)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def retryable(exc: BaseException, ctx: JobContext, policy: RetryPolicy) -> Failure:
    cls, message, trace = describe(exc)
    try:
        delay = max(0.0, float(policy.delay(ctx.attempt)))
    except Exception:
        delay = 0.0
    return Retry(cls, message, trace, delay=delay)


def timed_out(ctx: JobContext, seconds: float, policy: RetryPolicy) -> Failure:
    exc = JobTimeout(f"the handler ran longer than its timeout of {seconds:g}s")
    return retryable(exc, ctx, policy)
