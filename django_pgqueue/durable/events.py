"""Emitting an event, in the caller's transaction."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..conf import get_settings
from ..store import durable as store
from ..validation import payload as encode
from .run import event_key


def emit_event(key: str, payload: Any = None, *, using: str | None = None) -> bool:
    """Emit the event `key` with its JSON `payload`, in the caller's transaction.

    The jobs waiting for it (`JobContext.wait_for_event`) get the payload and are due at
    once; a job that waits for it later gets it without waiting. The first emit of a key
    wins: a later one changes nothing and returns False. Nothing is delivered unless
    the caller's transaction commits. `using`: the alias of the jobs' queue database
    (PGQUEUE["DATABASE"] by default).
    """
    event_key(key)
    text = encode(payload, None, f"the payload of event {key!r}")
    alias = using or get_settings().DATABASE
    # Its advisory lock on the key is held to the end of the caller's transaction, so a
    # job that parks meanwhile sees the event once the transaction committed.
    with transaction.atomic(using=alias):
        emitted, _ = store.emit_event(alias, key, text)
    return emitted
