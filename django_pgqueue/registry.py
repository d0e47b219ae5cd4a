"""Which callable runs which job type.

Handlers register with the `handler` decorator. Like Django's admin, the queue finds
them by importing a ``jobs`` module from every installed app (`autodiscover`), which the
worker does at start and enqueue() does the first time it needs a handler's defaults.

A type with no registered handler can still be run when a *resolver* knows it: the
Tasks backend adds one that imports a ``django.tasks`` Task from its module path (see
`django_pgqueue.tasks.runner`). Each type is resolved at most once per process and
cached, so the worker's dispatch stays a dictionary lookup.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from django.utils.module_loading import autodiscover_modules

from . import validators
from .exceptions import ConfigurationError
from .retry import RetryOn, RetryPolicy, bounded, retry_on, retry_or_backoff

if TYPE_CHECKING:
    from .context import JobContext

F = TypeVar("F", bound=Callable[..., Any])
Resolver = Callable[[str], "Handler | None"]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How the jobs of one type run: attempts, retry policy, timeout and time limits
    (None: the PGQUEUE settings), and whether the function takes its parents' results.

    A registered `Handler` holds them, and so does a Tasks backend's `TaskOptions`."""

    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None
    # Whether the function is called as func(results, ctx): the results of the steps
    # its job waits for first (see JobContext.results_arguments).
    takes_results: bool = False
    # Celery's soft and hard time limits, in seconds (None: PGQUEUE's SOFT_TIME_LIMIT
    # and TIME_LIMIT): SoftTimeLimitExceeded raised in the handler (an async one
    # cancelled); past the hard one the worker process running it is ended.
    soft_time_limit: float | None = None
    time_limit: float | None = None


@dataclass(frozen=True)
class Handler(RunOptions):
    """The function that runs a job type's jobs, and how they run."""

    type: str
    func: Callable[[JobContext], Any]
    _: KW_ONLY
    # A recurring schedule for this type (a cron string, an interval, or a dict);
    # read by django_pgqueue.schedules, checked by its system checks.
    schedule: Any = None
    # The queue enqueue() uses for this type when the call names none and no
    # PGQUEUE["ROUTES"] entry matches it.
    queue: str | None = None
    # The exceptions its jobs are retried for (autoretry_for, dont_autoretry_for);
    # None: every exception. Read by the executor's classification.
    retry_on: RetryOn | None = None
    # The coroutine function the worker's event loop awaits for this type, or None for
    # a handler that runs on a handler thread: the function itself when it is an
    # ``async def``, else its ``async_handler`` (an async ``django.tasks`` Task's runner).
    coroutine: Callable[[JobContext], Awaitable[Any]] | None = field(
        default=None, init=False, compare=False
    )

    def __post_init__(self) -> None:
        if inspect.iscoroutinefunction(self.func):
            object.__setattr__(self, "coroutine", self.func)
        else:
            async_handler = getattr(self.func, "async_handler", None)
            if async_handler is not None and inspect.iscoroutinefunction(async_handler):
                object.__setattr__(self, "coroutine", async_handler)
        # Every handler the worker runs is one of these: bounding its policy here keeps
        # a custom policy's delay (inf, 1e13) from reaching PostgreSQL out of range.
        if self.retry is not None:
            object.__setattr__(self, "retry", bounded(self.retry))


class Registry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.RLock()
        self._discovered = False
        self._resolvers: list[Resolver] = []
        # What the resolvers said about each type they were asked, None included:
        # kept apart from the registered handlers so `clear_resolved` can drop it.
        self._resolved: dict[str, Handler | None] = {}

    def register(self, spec: Handler) -> None:
        with self._lock:
            existing = self._handlers.get(spec.type)
            if existing is not None and _origin(existing.func) != _origin(spec.func):
                raise ConfigurationError(
                    f"Job type {spec.type!r} already has the handler {_origin(existing.func)}; "
                    f"{_origin(spec.func)} cannot register it again."
                )
            self._handlers[spec.type] = spec

    def find(self, type_: str) -> Handler | None:
        """The handler of `type_`: a registered one, else what a resolver makes of it."""
        handler = self._handlers.get(type_)
        if handler is not None or not self._resolvers:
            return handler
        try:
            return self._resolved[type_]
        except KeyError:
            pass
        with self._lock:
            if type_ not in self._resolved:
                found = None
                for resolver in self._resolvers:
                    found = resolver(type_)
                    if found is not None:
                        break
                self._resolved[type_] = found
            return self._resolved[type_]

    def add_resolver(self, resolver: Resolver) -> None:
        """Ask `resolver(type)` for a Handler when a type has no registered handler.

        A resolver must not raise: it returns None for types it does not know, and a
        Handler that fails each job (with the reason) for types it knows but cannot load.
        """
        with self._lock:
            if resolver not in self._resolvers:
                self._resolvers.append(resolver)
            self._resolved.clear()

    def clear_resolved(self) -> None:
        """Forget what the resolvers answered (their configuration changed)."""
        with self._lock:
            self._resolved.clear()

    def types(self) -> list[str]:
        return sorted(self._handlers)

    def may_have_async_handlers(self) -> bool:
        """Whether a job of a type not seen yet may have an async handler: one is
        registered, or a resolver (the Tasks backend's) may make one."""
        with self._lock:
            return bool(self._resolvers) or any(
                spec.coroutine is not None for spec in self._handlers.values()
            )

    def autodiscover(self) -> None:
        """Import the ``jobs`` module of every installed app, once per process."""
        if self._discovered:  # the common case, without the lock (enqueue asks each time)
            return
        with self._lock:
            if self._discovered:
                return
            self._discovered = True  # set first: a jobs module may enqueue at import
            autodiscover_modules("jobs")


def _origin(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)!s}"


registry = Registry()


def handler(
    type: str,
    *,
    max_attempts: int | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    schedule: Any = None,
    queue: str | None = None,
    autoretry_for: Any = None,
    dont_autoretry_for: Any = None,
    retry_backoff: bool | float | None = None,
    retry_backoff_max: float | None = None,
    retry_jitter: bool | None = None,
    takes_results: bool = False,
    soft_time_limit: float | None = None,
    time_limit: float | None = None,
) -> Callable[[F], F]:
    """Register the decorated function as the handler of job type `type`.

    The function receives a `JobContext`; an ``async def`` function runs on the
    worker's event loop (ASYNC_CONCURRENCY at once), any other on a handler thread.
    Return to complete the job; raise
    `RetryLater(delay)` to retry after a chosen delay, `PermanentFailure` to fail
    without retrying, and any other exception to retry with the retry policy.
    `schedule` (a cron string such as ``"0 6 * * *"``, an interval such as ``"5m"``,
    or a dict; see the Replace Celery beat how-to) also enqueues a job of this type
    on every tick. `queue` is the queue enqueue() puts jobs of this type in when
    the call names none (a ``queue=`` argument wins; so does a PGQUEUE["ROUTES"]
    entry, the project's own say).

    Celery's options: with `autoretry_for` (exception classes, or their dotted paths)
    only those exceptions are retried, and `dont_autoretry_for` are never retried; any
    other exception makes the job dead at once, its error recorded. `retry_backoff`
    (True: a first delay of 1 s; or that delay in seconds), `retry_backoff_max`
    (default 600 s) and `retry_jitter` (default True) are an `ExponentialBackoff`, in
    place of `retry`. `soft_time_limit` raises `SoftTimeLimitExceeded` in a handler
    that runs that many seconds (an async one is cancelled); past `time_limit` the
    worker process running it is ended and replaced, the job failed with
    `TimeLimitExceeded` (see the Time limits how-to). Every option is checked here:
    ConfigurationError names a bad one.

    `takes_results`: the function is called as ``func(results, ctx)``, `results` being
    what the steps its job waits for returned, as Celery passes a parent's result: one
    parent's result as it is, several (or a chord's group) as a list in parent order,
    for a ``link_error`` step the `StepFailure` of the failed step, and None for a job
    that waits for nothing (see `JobContext.results_arguments`).
    """
    where = f"@handler({type!r})"
    validators.type_name(type, f"{where}: type", error=ConfigurationError)
    if max_attempts is not None:
        validators.count(
            max_attempts,
            f"{where}: max_attempts",
            1,
            validators.MAX_ATTEMPTS,
            error=ConfigurationError,
        )
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(
            f"{where}: retry must have a delay(attempt) method, such as "
            f"ExponentialBackoff or FixedDelay; got {retry!r}."
        )
    if timeout is not None:
        validators.seconds(timeout, f"{where}: timeout", error=ConfigurationError)
    if queue is not None:
        validators.queue_name(queue, f"{where}: queue", error=ConfigurationError)
    check_time_limits(soft_time_limit, time_limit, where)
    policy = retry_or_backoff(retry, retry_backoff, retry_backoff_max, retry_jitter, where)
    on = retry_on(autoretry_for, dont_autoretry_for, where)
    validators.flag(takes_results, f"{where}: takes_results", error=ConfigurationError)

    def decorate(func: F) -> F:
        if not callable(func):
            raise ConfigurationError(f"@handler({type!r}) must decorate a callable.")
        registry.register(
            Handler(
                type,
                func,
                max_attempts=max_attempts,
                retry=policy,
                timeout=timeout,
                schedule=schedule,
                queue=queue,
                retry_on=on,
                takes_results=takes_results,
                soft_time_limit=soft_time_limit,
                time_limit=time_limit,
            )
        )
        return func

    return decorate


def check_time_limits(soft: float | None, hard: float | None, where: str) -> None:
    """Refuse a soft or hard time limit that is not a positive duration, or a soft one
    not below the hard one (it would never be raised)."""
    if soft is not None:
        validators.seconds(soft, f"{where}: soft_time_limit", error=ConfigurationError)
    if hard is not None:
        validators.seconds(hard, f"{where}: time_limit", error=ConfigurationError)
    if soft is not None and hard is not None and soft >= hard:
        raise ConfigurationError(
            f"{where}: soft_time_limit ({soft:g}s) must be below time_limit ({hard:g}s): "
            "the soft limit is the handler's warning before the hard one ends its process."
        )
