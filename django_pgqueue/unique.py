"""Unique jobs: a key, how long a job holds it, and what another enqueue of it does.

The database decides (``pgqueue_enqueue_unique``), in the enqueuing
transaction: a unique partial index on the state rows for the holds that follow a job's
status, a key row for a hold of a period. Nothing here touches a connection.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from .exceptions import EnqueueError
from .validation import key as _checked_key
from .validators import MAX_SECONDS

# How long a job holds its key, by its status: while it is pending; while it is pending,
# running or parked for an event (waiting); until it completed (or was cancelled: a dead
# job keeps the key, so that an operator's retry cannot make a second one).
HOLDS = ("pending", "active", "until_completed")
# What an enqueue of a key held by another job does: return that job; refuse
# (UniqueConflict); replace the payload and due time of a holder never claimed, of the
# same type (a debounce); or cancel it and enqueue the new job, which starts once the
# cancelled job's code stopped (cancel-in-progress).
ON_CONFLICT = ("return", "refuse", "replace", "cancel_running")

Hold = Literal["pending", "active", "until_completed"]
OnConflict = Literal["return", "refuse", "replace", "cancel_running"]


@dataclass(frozen=True, slots=True)
class Unique:
    """A unique key for enqueue(): at most one job of the queue holds `key` at a time.

    `hold` is how long a job holds the key: ``"pending"``, ``"active"`` (pending,
    running or parked for an event; the default), ``"until_completed"``, or a period
    (seconds or a timedelta) from its enqueue, whatever becomes of the job.
    `on_conflict` says what an enqueue of a held key does: ``"return"`` the holder
    (``created=False``), ``"refuse"`` with `UniqueConflict`, or ``"replace"`` the
    payload and due time of a holder never claimed (``hold="pending"`` only; a claimed
    holder is returned while it holds the key, a holder of another type raises
    `EnqueueError`): enqueued with a delay, N enqueues within the delay give one job
    that runs the delay after the last (`Unique.debounce`); or ``"cancel_running"``
    (``hold="active"`` only; `Unique.cancel_running`): the new job is enqueued, the
    key's jobs not running are cancelled, its running job is asked to stop, and the
    new job starts only once that job's code stopped.
    """

    key: str
    hold: Hold | float | dt.timedelta = "active"
    on_conflict: OnConflict = "return"

    def __post_init__(self) -> None:
        if self.key is None:
            raise EnqueueError("Unique needs a key, got None.")
        _checked_key(self.key, "Unique key")
        if isinstance(self.hold, str):
            if self.hold not in HOLDS:
                raise EnqueueError(
                    f"Unique hold must be one of {', '.join(HOLDS)} or a period of "
                    f"seconds, got {self.hold!r}."
                )
        else:
            self.period()  # checks it
        if self.on_conflict not in ON_CONFLICT:
            raise EnqueueError(
                f"Unique on_conflict must be one of {', '.join(ON_CONFLICT)}, "
                f"got {self.on_conflict!r}."
            )
        if self.on_conflict == "replace" and self.hold != "pending":
            raise EnqueueError(
                'Unique on_conflict="replace" replaces a pending job: it needs '
                f'hold="pending", got hold={self.hold!r}.'
            )
        if self.on_conflict == "cancel_running" and self.hold != "active":
            raise EnqueueError(
                'Unique on_conflict="cancel_running" keeps one job of the key pending or '
                f'running: it needs hold="active", got hold={self.hold!r}.'
            )

    @classmethod
    def debounce(cls, key: str) -> Unique:
        """The key of a debounce: a pending job of `key` takes the newest payload and due
        time (give enqueue() the window as its delay)."""
        return cls(key, hold="pending", on_conflict="replace")

    @classmethod
    def cancel_newest(cls, key: str) -> Unique:
        """The key of a cancel-newest strategy: while a job of `key` is pending, running
        or parked, an enqueue of it writes nothing and returns that job
        (``created=False``), decided by the unique index in the caller's transaction."""
        return cls(key, hold="active", on_conflict="return")

    @classmethod
    def cancel_running(cls, key: str) -> Unique:
        """The key of a cancel-in-progress strategy: an enqueue of `key` cancels the
        key's jobs that are not running (pending, waiting or parked), asks its running
        job to stop (a cancel request, as `actions.cancel` makes), and enqueues the new
        job, which waits until that job's code stopped. The key is a sequence key of the
        queue (its jobs run one at a time), decided under the sequence's row lock in the
        caller's transaction."""
        return cls(key, hold="active", on_conflict="cancel_running")

    def period(self) -> float | None:
        """The hold's period in seconds (None: the hold follows the job's status)."""
        hold = self.hold
        if isinstance(hold, str):
            return None
        seconds = hold.total_seconds() if isinstance(hold, dt.timedelta) else hold
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 < seconds <= MAX_SECONDS
        ):
            raise EnqueueError(
                f"Unique hold as a period must be more than 0 and at most {MAX_SECONDS:,} "
                f"seconds, got {hold!r}."
            )
        return float(seconds)

    def params(self) -> dict[str, Any]:
        """The statement's parameters for this key."""
        seconds = self.period()
        return {
            "unique_key": self.key,
            "unique_hold": "period" if seconds is not None else self.hold,
            "unique_seconds": seconds,
            "on_conflict": self.on_conflict,
        }
