"""Queue control as an extension: each worker writes PGQUEUE["QUEUES"] at its start.

The controlled claim itself is the store's (`store.claims`): a queue with controls is
claimed under them whether or not this extension is installed (an operator's pause or
a keyed job needs no setting). What needs it is PGQUEUE["QUEUES"]: without it, the
settings are never written, and the system check pgqueue.E015 refuses them.
"""

from __future__ import annotations

from ..extensions import Extension, PeriodicService, WorkerParts, WorkerView
from ..store.session import Session
from ..worker_config import WorkerConfig
from .store import sync_queue_controls


class QueueSettings(PeriodicService):
    """Writes PGQUEUE["QUEUES"] into queue_controls once, as the worker starts."""

    name = "queue settings"

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def start(self, session: Session) -> None:
        """A database error is logged: the rows keep what was written before."""
        sync_queue_controls(self.alias)


class QueueControl(Extension):
    """Pause, concurrency limits and keys, rate limits: PGQUEUE["QUEUES"] written."""

    def worker_parts(self, config: WorkerConfig, view: WorkerView) -> WorkerParts:
        return WorkerParts(services=(QueueSettings(config.database),))
