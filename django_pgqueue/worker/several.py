"""One worker process over queues on several databases: a `Worker` per database.

Each database's `Worker` keeps what is that database's own: its connections, its
listener, its heartbeat, its sweep, the leases and fencing of its jobs, its queue
controls and schedules, its row in the worker registry (the same worker id on each).
They share the process's `concurrency` handler slots by their queues' weights
(`slots.py`), so the process runs at most that many handlers at once, and a database
with work takes the slots an idle one leaves.

A database that is down stops only its own queues: its dispatcher waits for it (its
handlers still running finish, their outcomes written once it is back) while the
others claim and complete as before. A stop request (SIGTERM, `stop()`) stops them all;
so does one that ends on its own with a failure (too many stuck handlers), so that a
supervisor sees the process go and starts another. In burst mode each ends when its
own queues are empty, and the process when all have.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from ..registry import Registry
from ..registry import registry as default_registry
from ..worker_config import WorkerConfig, queues_by_database
from .lifecycle import Worker
from .signals import SignalRelay
from .slots import SharedSlots

logger = logging.getLogger(__name__)


class SeveralDatabases:
    """Runs the queues of several databases in one process, a `Worker` for each."""

    def __init__(
        self,
        queues: Iterable[str],
        *,
        registry: Registry | None = None,
        install_signal_handlers: bool = True,
        **options: Any,
    ) -> None:
        names = tuple(queues)
        placed = queues_by_database(names)
        # The options checked once for all the queues, and one worker id for every part.
        whole = WorkerConfig.build(names, **{**options, "database": next(iter(placed))})
        self.config = whole
        self.registry = registry or default_registry
        self.install_signal_handlers = install_signal_handlers
        weights = dict(options.pop("weights", None) or {})
        options.pop("database", None)
        options["worker_id"] = whole.worker_id
        options["concurrency"] = whole.concurrency
        self.slots = SharedSlots(
            whole.concurrency,
            {alias: sum(weights.get(q, 1) for q in mine) for alias, mine in placed.items()},
        )
        self.parts = [
            Worker(
                mine,
                registry=self.registry,
                install_signal_handlers=False,
                slots=self.slots,
                database=alias,
                weights={q: w for q, w in weights.items() if q in mine},
                **options,
            )
            for alias, mine in placed.items()
        ]
        self._relay = SignalRelay(self, whole.shutdown_grace)
        self._codes: dict[str, int] = {}  # each part's exit code, once it ended

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    @property
    def databases(self) -> list[str]:
        return [part.config.database for part in self.parts]

    @property
    def asked(self) -> bool:
        """A stop was requested (the signal relay escalates a second one)."""
        return any(part._switch.asked for part in self.parts)

    @property
    def exit_code(self) -> int:
        """The first part's non-zero exit code (see `Worker.exit_code`), else 0."""
        codes = [self._codes.get(part.config.database, part.exit_code) for part in self.parts]
        return next((code for code in codes if code), 0)

    @property
    def stats(self) -> dict[str, int]:
        """Every part's counters, added up."""
        total: dict[str, int] = {}
        for part in self.parts:
            for key, value in part.stats.items():
                total[key] = total.get(key, 0) + value
        return total

    def request(self, *, force: bool = False) -> None:
        """A stop request, as `Worker.stop` takes it (the signal relay's call)."""
        self.stop(force=force)

    def stop(self, *, force: bool = False) -> None:
        """Stop every part (see `Worker.stop`)."""
        for part in self.parts:
            part.stop(force=force)

    def stop_gracefully(self) -> None:
        for part in self.parts:
            part.stop_gracefully()

    def run(self) -> int:
        """Run every part until stopped (in burst mode: until all are idle); the exit code."""
        self.registry.autodiscover()  # once, before the parts' threads start
        restore = self._relay.install() if self.install_signal_handlers else None
        relay = None
        if restore:
            relay = threading.Thread(target=self._relay.run, name="pgqueue-signals", daemon=True)
            relay.start()
        logger.info(
            "worker %s serving %s",
            self.worker_id,
            "; ".join(f"{p.config.database}: {','.join(p.config.queues)}" for p in self.parts),
        )
        threads = [
            threading.Thread(target=self._run_part, args=(part,), name=f"pgqueue-db-{i}")
            for i, part in enumerate(self.parts)
        ]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)  # short: the main thread takes the signals
        except BaseException:  # KeyboardInterrupt without the signal relay: stop all
            self.stop()
            for thread in threads:
                if thread.is_alive():
                    thread.join()
            raise
        finally:
            if restore:
                restore()
            self._relay.close()
            if relay is not None:
                relay.join(timeout=5)
        return self.exit_code

    def _run_part(self, part: Worker) -> None:
        alias = part.config.database
        try:
            code = part.run()
        except BaseException:
            logger.exception("worker %s on %r crashed", self.worker_id, alias)
            code = 1
        self._codes[alias] = code
        if code:  # the others stop too, with their grace: the process exits with it
            logger.error("worker %s on %r ended with exit code %d", self.worker_id, alias, code)
            self.stop_gracefully()


def worker_for(queues: Iterable[str], **options: Any) -> Worker | SeveralDatabases:
    """A `Worker` for `queues`, or a `SeveralDatabases` when they live on several
    databases (PGQUEUE["QUEUE_DATABASES"]); same options as `Worker`."""
    names = tuple(queues)
    if options.get("database") is None and len(queues_by_database(names)) > 1:
        return SeveralDatabases(names, **options)
    return Worker(names, **options)
