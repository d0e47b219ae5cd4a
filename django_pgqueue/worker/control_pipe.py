"""A supervised child's side of its supervisor's control pipe: the stops it is asked for.

The supervisor writes one line per request ("graceful" or "now"); end of file means the
supervisor died, and the child stops gracefully rather than run on unsupervised.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger("django_pgqueue.supervisor")


def follow_supervisor(fd: int, stop: Callable[[bool], None]) -> threading.Thread:
    """In a child: act on the supervisor's control pipe from a daemon thread.

    `stop(force)` is called for each request; end of file (the supervisor died) is a
    graceful stop."""

    def run() -> None:
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while line := pipe.readline():
                now = line.strip() == b"now"
                logger.info(
                    "the supervisor asks for a%s stop", "n immediate" if now else " graceful"
                )
                stop(now)
        logger.warning("supervisor gone (its control pipe closed): stopping gracefully")
        stop(False)

    thread = threading.Thread(target=run, name="pgqueue-supervisor", daemon=True)
    thread.start()
    return thread
