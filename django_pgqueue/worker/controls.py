"""The operators' requests a worker process obeys: stop, drain, resume, concurrency.

They reach the process through the registry's beat (`observability.registry`), which
hands them to `Worker.obey`. `Controls` turns each into what the dispatcher does: a
drained worker claims nothing and keeps running what it holds; a new concurrency sizes
the next claims (a thread is started for each slot above the threads running; none is
ended: a smaller limit leaves threads idle); a stop is a graceful one, after which a
supervisor's child is not restarted. A supervisor's child tells it its state after each
drain, resume or concurrency (`state`): the process started in its place (recycled, or
ended for a time limit) starts in that state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .. import validators
from ..models.observability import WORKER_ACTIONS as ACTIONS
from .capacity import Capacity
from .pool import HandlerPool

logger = logging.getLogger(__name__)


class Controls:
    """The operators' requests a dispatcher obeys: drain, and a new concurrency.

    Set from the services' thread, read by the dispatcher's: a flag and a number, each
    written whole."""

    def __init__(self, concurrency: int, wake: threading.Event) -> None:
        self.draining = False
        self.concurrency = concurrency  # the limit claims are sized to
        self.asked_concurrency: int | None = None  # waiting for the dispatcher
        self.stop_asked = False  # an operator asked this process to stop
        self._wake = wake

    def drain(self) -> None:
        self.draining = True
        self._wake.set()

    def resize(self, concurrency: int) -> None:
        self.asked_concurrency = concurrency
        self._wake.set()

    def apply_resize(self, capacity: Capacity, pool: HandlerPool) -> None:
        """On the dispatcher's thread: apply the concurrency asked for, if any (claims
        sized to it from now; a thread started for each slot above those running)."""
        asked, self.asked_concurrency = self.asked_concurrency, None
        if asked is not None:
            self.concurrency = asked
            capacity.limits["sync"] = asked
            pool.grow(asked)
            logger.info("concurrency now %d, as an operator asked", asked)

    def state(self) -> dict[str, Any]:
        """What operators made of this process: draining, and the concurrency asked
        for (the one applied, if none is waiting)."""
        asked = self.asked_concurrency
        return {
            "draining": self.draining,
            "concurrency": self.concurrency if asked is None else asked,
        }

    def obey(self, action: str, concurrency: int | None, stop: Callable[[], None]) -> str:
        """Do what an operator asked (`stop` stops the worker gracefully); what was
        done, in words. ValueError for an action or a concurrency it cannot take."""
        check_request(action, concurrency)
        if action == "stop":
            self.stop_asked = True
            stop()
            return "stopping: no more claims; running handlers get the shutdown grace"
        if action == "drain":
            self.drain()
            return "draining: no more claims; running handlers go on"
        if action == "resume":
            was, self.draining = self.draining, False
            self._wake.set()
            return "claiming again" if was else "was not draining: claiming as before"
        assert concurrency is not None
        self.resize(concurrency)
        return f"concurrency {concurrency} from the next claim"


def check_request(action: str, concurrency: int | None) -> None:
    """Refuse an action a worker does not know, or a concurrency out of range (ValueError)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    if action == "concurrency":
        if concurrency is None:
            raise ValueError("concurrency: give the number of handler threads")
        validators.count(
            concurrency, "concurrency", 1, validators.MAX_CONCURRENCY, error=ValueError
        )
    elif concurrency is not None:
        raise ValueError(f"{action} takes no concurrency")
