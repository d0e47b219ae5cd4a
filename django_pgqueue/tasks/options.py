"""A Tasks backend's OPTIONS: retry options for every task and per task path, validated."""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .. import validation, validators
from ..exceptions import ConfigurationError, EnqueueError
from ..registry import RunOptions, check_time_limits
from ..retry import (
    ExponentialBackoff,
    FixedDelay,
    RetryOn,
    RetryPolicy,
    exception_entries,
    retry_on,
    retry_or_backoff,
)
from ..sequences import ON_FAILURE, OnFailure
from ..task_paths import TASK_PATH_RE

# Keys of a PgQueueBackend's OPTIONS, and of each entry of OPTIONS["TASKS"]. The
# reference documentation is checked against these.
OPTIONS: dict[str, str] = {
    "MAX_ATTEMPTS": "Attempts each task gets; default PGQUEUE['MAX_ATTEMPTS'].",
    "RETRY": "Retry policy of every task; default full jitter from PGQUEUE's RETRY_BACKOFF_*.",
    "TIMEOUT": "Seconds a task may run before it is failed and retried; default JOB_TIMEOUT.",
    "TASKS": "Per-task overrides: {module path: {max_attempts, retry, timeout, ...}}.",
    "SCHEDULES": "Recurring @task calls: {name: {task, cron or every, args, kwargs, ...}}.",
}
TASK_OPTIONS = (
    "max_attempts",
    "retry",
    "timeout",
    "concurrency_key",
    # Its jobs with one sequence key run one at a time in enqueue order (a template or a
    # callable, as concurrency_key), and what a dead one does to the rest.
    "sequence",
    "sequence_on_failure",
    # Celery's names, per task: which exceptions retry, and the backoff's shape.
    "autoretry_for",
    "dont_autoretry_for",
    "retry_backoff",
    "retry_backoff_max",
    "retry_jitter",
    # The task takes its parents' results first when it runs as a workflow step.
    "takes_results",
    # Celery's time limits, per task: SoftTimeLimitExceeded raised, then its process ended.
    "soft_time_limit",
    "time_limit",
)

# A task's concurrency key: a template formatted with the call's arguments
# ("customer:{customer_id}", "report:{0}"), or a callable taking them like the task.
ConcurrencyKey = str | Callable[..., Any]
# A template's fields: a keyword argument's name or a positional argument's index.
_FIELD_RE = re.compile(r"\A(?:[A-Za-z_]\w*|\d+)\Z", re.ASCII)


@dataclass(frozen=True)
class RetryOnPaths:
    """A task's autoretry_for and dont_autoretry_for as configured: exception classes or
    dotted paths, checked in shape when the backend is made and imported by `resolve`
    once the apps are loaded (a task module may make the backend while it is imported,
    before the exceptions it defines exist)."""

    autoretry_for: tuple[Any, ...] | None
    dont_autoretry_for: tuple[Any, ...] | None
    where: str

    def resolve(self) -> RetryOn | None:
        """The `RetryOn` of these lists; ConfigurationError when an entry does not import."""
        return retry_on(self.autoretry_for, self.dont_autoretry_for, self.where)


@dataclass(frozen=True, kw_only=True)
class TaskOptions(RunOptions):
    """How one task runs (None fields fall back to the PGQUEUE settings): the fields of
    `RunOptions`, which a `@handler`'s registration holds too, and, per task only, which
    concurrency key and sequence its jobs get and which exceptions retry them."""

    concurrency_key: ConcurrencyKey | None = None
    retry_on: RetryOnPaths | None = None
    sequence: ConcurrencyKey | None = None
    sequence_on_failure: OnFailure = "hold"

    def over(self, defaults: TaskOptions) -> TaskOptions:
        """These options, with their unset attempts, retry policy and timeout taken from
        `defaults` (the backend's own OPTIONS)."""
        unset = ("max_attempts", "retry", "timeout")
        return replace(
            self, **{name: getattr(defaults, name) for name in unset if getattr(self, name) is None}
        )

    def key_for(
        self,
        func: Callable[..., Any],
        takes_context: bool,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        option: str = "concurrency_key",
    ) -> Any:
        """The key of one call of the task `func` for `option` (its concurrency key, or
        with ``option="sequence"`` its sequence key; None without the option).

        A template's fields name the task's parameters however the call passed them
        ("{customer_id}"), or positional arguments by index ("{0}"); a callable gets the
        call's arguments. EnqueueError if the template names an argument the call lacks;
        enqueue() checks the key itself.
        """
        spec = getattr(self, option)
        if spec is None:
            return None
        if callable(spec):
            return spec(*args, **kwargs)
        named = {**_positional_names(func, takes_context, args), **kwargs}
        try:
            return spec.format(*args, **named)
        except (IndexError, KeyError) as exc:
            raise EnqueueError(
                f"the {option} template {spec!r} names argument {exc}, which this call "
                "does not pass."
            ) from None


def _positional_names(
    func: Callable[..., Any], takes_context: bool, args: Sequence[Any]
) -> dict[str, Any]:
    """The parameter names of the call's positional arguments (the context skipped)."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # no signature to read: indexes only
        return {}
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return dict(zip(positional[1 if takes_context else 0 :], args, strict=False))


def concurrency_key_option(value: Any, where: str) -> ConcurrencyKey | None:
    """Check a task's concurrency_key option: None, a callable, or a template whose
    fields name arguments only ("{customer_id}", "{0}"; no attributes or indexing)."""
    if value is None or callable(value):
        return value
    if not isinstance(value, str) or not value:
        raise ConfigurationError(
            f"{where} must be a template such as 'customer:{{customer_id}}' or a callable "
            f"taking the task's arguments, got {value!r}."
        )
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(value) if field is not None]
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {value!r} is not a valid template ({exc}).") from None
    bad = [field for field in fields if not _FIELD_RE.match(field)]
    if bad:
        raise ConfigurationError(
            f"{where}: template fields must name an argument ('{{customer_id}}') or its "
            f"position ('{{0}}'), got {{{bad[0]}}} in {value!r}."
        )
    return value


def retry_policy(value: Any, where: str) -> RetryPolicy | None:
    """A RetryPolicy from a policy object or a settings-friendly dict."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        spec = dict(value)
        kind = spec.pop("policy", None)
        factory = {"exponential": ExponentialBackoff, "fixed": FixedDelay}.get(kind)  # type: ignore[arg-type]
        if factory is not None:
            try:
                return factory(**spec)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"{where}: {exc}.") from None
    elif isinstance(value, RetryPolicy):
        return value
    raise ConfigurationError(
        f"{where} must be a retry policy (ExponentialBackoff, FixedDelay or any object with "
        "a delay(attempt) method), {'policy': 'exponential', 'base': 1.0, 'cap': 600.0} or "
        f"{{'policy': 'fixed', 'seconds': 10.0}}; got {value!r}."
    )


def _task_options(raw: Mapping[str, Any], keys: Sequence[str], where: str) -> TaskOptions:
    validators.mapping(raw, where, keys, error=ConfigurationError)
    max_key, retry_key, timeout_key = keys[:3]
    max_attempts = raw.get(max_key)
    if max_attempts is not None:
        try:
            validation.max_attempts(max_attempts)
        except EnqueueError as exc:
            raise ConfigurationError(f"{where}[{max_key!r}]: {exc}") from None
    timeout = raw.get(timeout_key)
    if timeout is not None:
        timeout = validators.seconds(timeout, f"{where}[{timeout_key!r}]", error=ConfigurationError)
    retry = retry_policy(raw.get(retry_key), f"{where}[{retry_key!r}]")
    key = on = soft = hard = sequence = None
    takes_results, sequence_on_failure = False, "hold"
    if "concurrency_key" in keys:  # a task's own entry
        takes_results = validators.flag(
            raw.get("takes_results", False), f"{where}['takes_results']", error=ConfigurationError
        )
        soft, hard = raw.get("soft_time_limit"), raw.get("time_limit")
        check_time_limits(soft, hard, where)
        key = concurrency_key_option(raw.get("concurrency_key"), f"{where}['concurrency_key']")
        sequence = concurrency_key_option(raw.get("sequence"), f"{where}['sequence']")
        sequence_on_failure = raw.get("sequence_on_failure", "hold")
        if sequence_on_failure not in ON_FAILURE:
            raise ConfigurationError(
                f"{where}['sequence_on_failure'] must be one of {', '.join(ON_FAILURE)}, "
                f"got {sequence_on_failure!r}."
            )
        on = _retry_on_paths(raw.get("autoretry_for"), raw.get("dont_autoretry_for"), where)
        retry = retry_or_backoff(
            retry,
            raw.get("retry_backoff"),
            raw.get("retry_backoff_max"),
            raw.get("retry_jitter"),
            where,
        )
    return TaskOptions(
        max_attempts=max_attempts,
        retry=retry,
        timeout=timeout,
        concurrency_key=key,
        retry_on=on,
        takes_results=takes_results,
        soft_time_limit=soft,
        time_limit=hard,
        sequence=sequence,
        sequence_on_failure=sequence_on_failure,
    )


def _retry_on_paths(autoretry_for: Any, dont_autoretry_for: Any, where: str) -> RetryOnPaths | None:
    if autoretry_for is None and dont_autoretry_for is None:
        return None
    only = never = None
    if autoretry_for is not None:
        only = exception_entries(autoretry_for, f"{where}: autoretry_for")
    if dont_autoretry_for is not None:
        never = exception_entries(dont_autoretry_for, f"{where}: dont_autoretry_for")
    return RetryOnPaths(only, never, where)


def parse_options(raw: Any, where: str) -> tuple[TaskOptions, dict[str, TaskOptions]]:
    """Validate a backend's OPTIONS: (defaults for every task, overrides per task path)."""
    if raw is None:
        raw = {}
    validators.mapping(raw, where, OPTIONS, error=ConfigurationError)
    # SCHEDULES is read and checked by django_pgqueue.schedules.
    top = {key: value for key, value in raw.items() if key not in ("TASKS", "SCHEDULES")}
    defaults = _task_options(top, ("MAX_ATTEMPTS", "RETRY", "TIMEOUT"), where)
    per_task: dict[str, TaskOptions] = {}
    for path, options, entry in validators.entries(
        raw.get("TASKS") or {},
        f"{where}['TASKS']",
        lambda key: isinstance(key, str) and TASK_PATH_RE.match(key) is not None,
        "task module paths such as 'shop.tasks.charge'",
        error=ConfigurationError,
    ):
        per_task[path] = _task_options(options, TASK_OPTIONS, entry)
    return defaults, per_task
