"""Which transaction a job written to another database may join: now, at a commit, or none.

With PGQUEUE["QUEUE_DATABASES"], a queue's jobs live on its own alias. A job is part of
the caller's transaction only when that transaction is on the queue's alias: a job
enqueued inside ``transaction.atomic(using="other")`` alone would commit at once on its
own database, whatever "other" does later. That is refused, unless the caller asks
for the job to be enqueued when its transaction commits (after it, not atomically).
Nothing of that runs when QUEUE_DATABASES is empty: one database, today's semantics.

A block that gathers the jobs enqueued inside it (a batch, through `enqueue_listener`)
is a transaction on one database: a job it cannot hold, of another database, is
refused inside it, ``on_commit`` or not, before anything is written or deferred.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from django.db import connections

from .exceptions import EnqueueError


@dataclass(frozen=True, slots=True)
class EnqueueListener:
    """A block of the caller's that gathers the jobs enqueued inside it (a batch).

    A job enqueued inside it must be written on `database`, in the block's own
    transaction there: `listener()` refuses any other (EnqueueError naming the block,
    `name`). `joined` is called with the new job ids of each write, in that transaction.
    """

    name: str
    database: str
    joined: Callable[[list[int]], None]


# The seam for a feature that gathers the jobs enqueued in a scope of the caller's (a
# batch): set for the scope. Outside a scope it costs enqueue one ContextVar read per
# call, and no statement.
enqueue_listener: ContextVar[EnqueueListener | None] = ContextVar(
    "pgqueue_enqueue_listener", default=None
)


def listener(alias: str, queue: str, on_commit: bool) -> EnqueueListener | None:
    """The listener of the block the caller is in (None outside one), which a job of
    `queue` written on `alias` joins; EnqueueError if it cannot: `alias` is not the
    block's database (written outside its transaction, or with `on_commit` after its
    commit). Called before anything is written or deferred."""
    found = enqueue_listener.get()
    if found is None or alias == found.database:
        return found
    how = "deferred past its commit (on_commit=True)" if on_commit else "written outside it"
    raise EnqueueError(
        f"A job of the queue {queue!r} (database {alias!r}) was enqueued inside "
        f"{found.name} (database {found.database!r}): {how}, it could not join the "
        f"transaction of the block. Enqueue it outside the block, or open the block on "
        f"{alias!r}."
    )


def _open_elsewhere(aliases: Sequence[str]) -> list[str]:
    """The aliases other than `aliases` whose connection is inside an atomic block."""
    # Only connections this thread already made: one never opened holds no transaction.
    return [
        conn.alias
        for conn in connections.all(initialized_only=True)
        if conn.alias not in aliases and conn.in_atomic_block
    ]


def commit_to_wait_for(
    alias: str, queue: str, on_commit: bool, *, call: str = "enqueue", what: str = ""
) -> str | None:
    """None to write on `alias` now (in its transaction, if one is open); else the alias
    of the caller's transaction whose commit the write waits for.

    The rule of every write the caller makes on a queue's database (a job of `queue`,
    or an event): it joins the caller's transaction on `alias`, or commits at once when
    the caller has none; under a transaction on other aliases only it is refused
    (EnqueueError), or, with `on_commit`, deferred to that one transaction's commit.
    `call` and `what` name the write in the error (`what`: the job of `queue` if empty).
    """
    if connections[alias].in_atomic_block:
        return None  # transactional enqueue, as on one database
    others = _open_elsewhere([alias])
    if not others:
        return None  # autocommit: the job is written (and committed) at once
    if on_commit and len(others) == 1:
        return others[0]
    where = " and ".join(repr(other) for other in others)
    subject = what or f"the queue {queue!r}"
    if on_commit:
        raise EnqueueError(
            f"{call}(on_commit=True) to {subject} (database {alias!r}) was "
            f"called inside transactions on {where}: it cannot tell which commit to wait "
            f"for. Call it from inside transaction.atomic(using={alias!r}) instead."
        )
    raise EnqueueError(
        f"{subject[0].upper()}{subject[1:]} lives on the database {alias!r}, but {call} was "
        f"called inside a transaction on {where} only: it would commit at once on "
        f"{alias!r}, even if that transaction rolls back. Call {call} inside "
        f"transaction.atomic(using={alias!r}) to make it transactional, or pass "
        f"on_commit=True to write it once the {others[0]!r} transaction commits "
        "(after that commit, not atomically with it)."
    )


def many_commit_to_wait_for(aliases: Sequence[str], on_commit: bool) -> str | None:
    """As commit_to_wait_for for an enqueue_many() call whose jobs span several aliases.

    Outside any transaction each alias's jobs are written all-or-nothing on their own;
    inside one, the call cannot be atomic: refused, unless `on_commit` defers it all
    to the commit of the one open transaction.
    """
    open_ = [a for a in aliases if connections[a].in_atomic_block] + _open_elsewhere(aliases)
    if not open_:
        return None
    if on_commit and len(open_) == 1:
        return open_[0]
    names = ", ".join(repr(alias) for alias in aliases)
    where = " and ".join(repr(alias) for alias in open_)
    raise EnqueueError(
        f"enqueue_many() was given jobs of queues on several databases ({names}) inside "
        f"a transaction on {where}: one transaction cannot cover them all. Call it once "
        "per database (each inside that database's transaction.atomic), call it outside "
        "a transaction (each database's jobs are then written all-or-nothing on their "
        "own), or pass on_commit=True to write them all once that transaction commits."
    )
