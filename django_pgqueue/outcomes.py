"""What an attempt ended with, and what of it PostgreSQL can store.

Both the executor (which classifies a handler's result) and the data layer (which
writes it) use these types; neither imports the other for them.
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


@dataclass(slots=True)
class Failure:
    error_class: str
    message: str
    traceback: str
    permanent: bool
    delay: float = 0.0
    # A Snooze, written with job_give_back (no attempt spent), not job_fail.
    snoozed: bool = False
    # The worker's own shutdown stopped the handler: its attempt is given back too, and
    # the job is due again at once (never dead for it).
    interrupted: bool = False
    # Interrupted, and its row held by the stopping worker while the handler may still
    # run (store.hold): written with job_interrupt, the row left running, its slot held.
    held: bool = False
    # The framework the handler runs in logged this failure already, with its traceback
    # (Django's Tasks framework logs a failed task): the worker's own line is INFO.
    logged: bool = False

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


def plainer(failure: Failure) -> Failure:
    """The same failure as plain text with a delay PostgreSQL can add to now(), for
    when PostgreSQL refused the original (its text, or a delay out of range)."""
    return dataclasses.replace(
        failure,
        error_class=storable(failure.error_class, ERROR_CLASS_LIMIT),
        message=storable(repr(failure.message), MESSAGE_LIMIT),
        traceback="",
        delay=bounded_delay(failure.delay),
    )


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
    return Failure(
        "django_pgqueue.ResultNotStorable",
        storable(
            f"the handler returned {type(value).__name__} {_safe_repr(value)}, which cannot "
            f"be stored as JSON ({_safe_str(exc)}); the job ran but is marked dead so it is "
            "not re-run",
            MESSAGE_LIMIT,
        ),
        "",
        permanent=True,
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
