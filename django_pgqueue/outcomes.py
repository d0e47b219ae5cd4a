"""What an attempt ended with, and what of it PostgreSQL can store.

One type per end of an attempt, each written by one statement of the store:

- `Success`: the job is completed, with the handler's result (``job_complete``);
  `Committed`, completed so by the handler in its own transaction;
- `Retry`: it failed and is due again after `delay`, or dead once its attempts are
  spent (``job_fail``);
- `Dead`: it failed for good (``job_fail``, permanent);
- `Snoozed`: pending again after `delay`, its attempt given back (``job_fail``,
  give_back);
- `Parked`: waits for an event or its timeout, its attempt given back (``job_park``);
- `Interrupted`: the worker's own shutdown stopped the handler: due again at once, its
  attempt given back (``job_fail``, give_back);
- `InterruptedRunning`: the same, while the handler may still run (``job_interrupt``):
  the row stays running, given back once the handler returned (on the stopping
  worker's hold) or, once the process is gone, by the sweep.

A job handed back before its handler started is neither: ``job_release``. Both the
executor (which classifies a handler's result) and the data layer (which writes it) use
these types; neither imports the other for them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

MESSAGE_LIMIT = 4_000
TRACEBACK_LIMIT = 32_000
LAST_ERROR_LIMIT = 1_000
ERROR_CLASS_LIMIT = 255


@dataclass(slots=True, frozen=True)
class Success:
    result: str | None = None


NO_RESULT = Success()  # a handler that returned None


@dataclass(slots=True, frozen=True)
class Committed(Success):
    """Completed by the handler itself, in its own transaction (``job_complete`` on the
    job's database, `JobContext.complete_atomically`): nothing is left to write."""


@dataclass(slots=True)
class Failure:
    """What failed in an attempt; its subclass is the end it leads the job to."""

    error_class: str
    message: str
    traceback: str = ""
    # The framework the handler runs in logged this failure already, with its traceback
    # (Django's Tasks framework logs a failed task): the worker's own line is INFO.
    logged: bool = False

    @property
    def last_error(self) -> str:
        return storable(f"{self.error_class}: {self.message}", LAST_ERROR_LIMIT)

    @property
    def permanent(self) -> bool:
        """Whether it ends the job for good (dead), whatever attempts are left."""
        return isinstance(self, Dead)


@dataclass(slots=True)
class Retry(Failure):
    """Failed: due again after `delay` seconds, or dead once its attempts are spent."""

    delay: float = 0.0


@dataclass(slots=True)
class Dead(Failure):
    """Failed for good: dead, whatever attempts are left."""


@dataclass(slots=True)
class Snoozed(Failure):
    """Not done yet (a Snooze): pending again after `delay`, its attempt given back."""

    delay: float = 0.0


@dataclass(slots=True)
class Parked(Snoozed):
    """Waits for the event `key` (a durable wait): waiting, in no claim index, until it is
    emitted or `timeout` seconds passed (None: never), its attempt given back; the wait's
    checkpoint is the step `name`."""

    key: str = ""
    name: str = ""
    timeout: float | None = None


@dataclass(slots=True)
class Interrupted(Failure):
    """The worker's own shutdown stopped the handler: due again at once, its attempt
    given back (never dead for it)."""


@dataclass(slots=True)
class InterruptedRunning(Interrupted):
    """Interrupted while its handler may still run: its attempt is closed, given back,
    and its row stays running with its slots. `held`: the stopping worker holds the row
    (`store.hold`) and gives the job back once the handler returned, so its lease ends
    now; else the lease runs out once the process is gone and the sweep gives it back."""

    held: bool = True


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


def as_plain_text(failure: Failure) -> Failure:
    """The same failure as plain text with a delay PostgreSQL can add to now(), for
    when PostgreSQL refused the original (its text, or a delay out of range)."""
    plain = dataclasses.replace(
        failure,
        error_class=storable(failure.error_class, ERROR_CLASS_LIMIT),
        message=storable(repr(failure.message), MESSAGE_LIMIT),
        traceback="",
    )
    if isinstance(plain, Retry | Snoozed):
        plain.delay = bounded_delay(plain.delay)
    return plain


# The longest retry delay written: a century; now() + more than about 292,000 years is
# out of a timestamp's range, and infinity out of an interval's.
MAX_RETRY_DELAY = 100 * 366 * 86_400.0


def bounded_delay(delay: float) -> float:
    """`delay` in [0, MAX_RETRY_DELAY]; NaN counts as 0."""
    if math.isnan(delay):
        return 0.0
    return min(max(delay, 0.0), MAX_RETRY_DELAY)


def unstorable_result(value: Any, exc: BaseException) -> Failure:
    """The failure recorded when a handler's return value cannot be stored."""
    return Dead(
        "django_pgqueue.ResultNotStorable",
        storable(
            f"the handler returned {type(value).__name__} {_safe_repr(value)}, which cannot "
            f"be stored as JSON ({_safe_str(exc)}); the job ran but is marked dead so it is "
            "not re-run",
            MESSAGE_LIMIT,
        ),
    )


def _safe_repr(value: Any) -> str:
    """repr(value), at most 200 characters; a value's own __repr__ may raise or recurse."""
    try:
        return f"{value!r:.200}"
    except BaseException:  # whatever it raises, the failure is still recorded
        return f"<{type(value).__name__} whose repr() failed>"


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:
        return type(exc).__name__
