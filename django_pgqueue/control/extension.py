"""Queue control as an extension: its part in each worker is `ControlledClaims`."""

from __future__ import annotations

from ..extensions import Extension, WorkerHooks
from ..store.worker import Store
from ..worker_config import WorkerConfig
from .claims import ControlledClaims


class QueueControl(Extension):
    """Pause, concurrency limits and keys, rate limits: the claim respects them."""

    def worker_hooks(self, config: WorkerConfig, store: Store) -> WorkerHooks:
        return ControlledClaims.for_worker(config, store)
