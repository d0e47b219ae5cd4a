"""Emitting an event, in the caller's transaction."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction

from .. import enqueue_scope
from ..conf import get_settings
from ..store import durable as store
from ..validation import payload as encode
from .run import event_key


def emit_event(
    key: str, payload: Any = None, *, using: str | None = None, on_commit: bool = False
) -> bool | None:
    """Emit the event `key` with its JSON `payload`, in the caller's transaction.

    The jobs waiting for it (`JobContext.wait_for_event`) get the payload and are due at
    once; a job that waits for it later gets it without waiting. The first emit of a key
    wins: a later one changes nothing and returns False. Nothing is delivered unless
    the caller's transaction commits. `using`: the alias of the jobs' queue database
    (PGQUEUE["DATABASE"] by default). Like enqueue, inside a transaction on another
    database only it is refused (EnqueueError: it would commit at once), unless
    `on_commit` is True: then it is emitted once that transaction commits (after the
    commit, not atomically) and None is returned.
    """
    event_key(key)
    text = encode(payload, None, f"the payload of event {key!r}")
    alias = using or get_settings().DATABASE
    caller = enqueue_scope.commit_to_wait_for(
        alias, "", on_commit, call="emit_event", what=f"the event {key!r}"
    )
    if caller is not None:
        transaction.on_commit(partial(_emit, alias, key, text), using=caller)
        return None
    return _emit(alias, key, text)


def _emit(alias: str, key: str, text: str) -> bool:
    # Its advisory lock on the key is held to the end of the caller's transaction, so a
    # job that parks meanwhile sees the event once the transaction committed.
    with transaction.atomic(using=alias):
        emitted, _ = store.emit_event(alias, key, text)
    return emitted
