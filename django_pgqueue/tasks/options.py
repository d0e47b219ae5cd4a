"""A Tasks backend's OPTIONS: retry options for every task and per task path, validated."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import validation, validators
from ..exceptions import ConfigurationError, EnqueueError
from ..retry import ExponentialBackoff, FixedDelay, RetryPolicy

# Keys of a PgQueueBackend's OPTIONS, and of each entry of OPTIONS["TASKS"]. The
# reference documentation is checked against these.
OPTIONS: dict[str, str] = {
    "MAX_ATTEMPTS": "Attempts each task gets; default PGQUEUE['MAX_ATTEMPTS'].",
    "RETRY": "Retry policy of every task; default full jitter from PGQUEUE's RETRY_BACKOFF_*.",
    "TIMEOUT": "Seconds a task may run before it is failed and retried; default JOB_TIMEOUT.",
    "TASKS": "Per-task overrides: {module path: {max_attempts, retry, timeout}}.",
    "SCHEDULES": "Recurring @task calls: {name: {task, cron or every, args, kwargs, ...}}.",
}
TASK_OPTIONS = ("max_attempts", "retry", "timeout")

# A task's module path, as Task.module_path spells it for a module-level function.
# \A and \Z: `$` would also match before a trailing newline.
TASK_PATH_RE = re.compile(r"\A[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\Z", re.ASCII)


@dataclass(frozen=True)
class TaskOptions:
    """How one task is retried; None fields fall back to the PGQUEUE settings."""

    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None

    def over(self, defaults: TaskOptions) -> TaskOptions:
        """These options, with their unset fields taken from `defaults`."""
        return TaskOptions(
            self.max_attempts if self.max_attempts is not None else defaults.max_attempts,
            self.retry if self.retry is not None else defaults.retry,
            self.timeout if self.timeout is not None else defaults.timeout,
        )


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
    return TaskOptions(
        max_attempts=max_attempts,
        retry=retry_policy(raw.get(retry_key), f"{where}[{retry_key!r}]"),
        timeout=timeout,
    )


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
