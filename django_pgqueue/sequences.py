"""Sequences: jobs with one sequence key run one at a time, in enqueue order.

enqueue(sequence="customer-42") writes a job behind the unfinished earlier jobs of its
sequence: the first is pending, the others wait (``waiting``, in no claim index) until
the one before them ends. A job that ends dead holds the rest back (``"hold"``, the
default) or lets them go on (``"continue"``); a retry keeps its place. The database
decides, in the enqueuing transaction and in the transaction that ends
each job: nothing here touches a connection but `release`, which lets a held sequence go
on past its dead head (the admin's Held sequences page).
"""

from __future__ import annotations

from typing import Any, Literal

from .conf import get_settings
from .exceptions import EnqueueError
from .store import operator as store
from .validation import key as _checked_key

# What a job that ends dead does to the jobs behind it in its sequence: hold them back
# until an operator retries it or releases the sequence, or let them go on.
ON_FAILURE = ("hold", "continue")

OnFailure = Literal["hold", "continue"]


def params(sequence: Any, on_failure: Any, *, keyed: bool = False) -> dict[str, Any]:
    """The enqueue statement's parameters of a sequence key (none without one),
    validated: EnqueueError naming the problem. `keyed`: the job has a unique or
    idempotency key, which a sequenced job cannot take (waiting, it would not hold it)."""
    if sequence is None:
        if on_failure != "hold":
            raise EnqueueError("sequence_on_failure needs a sequence key (sequence=...).")
        return {}
    key = _checked_key(sequence, "sequence")
    if on_failure not in ON_FAILURE:
        raise EnqueueError(
            f"sequence_on_failure must be one of {', '.join(ON_FAILURE)}, got {on_failure!r}."
        )
    if keyed:
        raise EnqueueError(
            "A sequenced job takes no idempotency_key or unique key: pass sequence alone "
            "(a job waiting in its sequence would not hold the key)."
        )
    return {"sequence_key": key, "sequence_on_failure": on_failure}


def release(queue: str, sequence: str, *, using: str | None = None) -> int | None:
    """Let the held sequence `sequence` of `queue` go on past its dead head: the head
    stays dead, the next job of the sequence becomes pending. Returns the head released,
    or None when the sequence was not held (its head was retried or released meanwhile).
    Runs on `using` (default: the queue's database), in the caller's transaction if any.
    """
    conf = get_settings()
    alias = using or (
        conf.QUEUE_DATABASES.alias(queue, conf.DATABASE) if conf.QUEUE_DATABASES else conf.DATABASE
    )
    return store.release_sequence(alias, queue, sequence)
