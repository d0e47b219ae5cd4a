"""A supervised worker process's word to its supervisor: one JSON line per event, on a
pipe whose read end the supervisor holds (`--report-fd`).

Five events: ``ready`` (the process is up: its services started, about to claim; a
death before it counts as a failed start, however long the start took), ``controls``
(an operator drained, resumed or resized it: its draining and concurrency now, which
the process started in its place starts with), ``stop_asked``
(an operator asked the process to stop: however it then ends, a time limit or a
recycle included, it is not started again), ``recycle``
(the process reached --max-jobs-per-process or --max-memory-per-process and exits once
what it runs ended: start a fresh one now) and ``time_limit`` (a handler ran past its
hard time limit: the process ends at once, and leaves its jobs to be written once it
is gone, see `time_limits.LastWords`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

logger = logging.getLogger(__name__)

READY, CONTROLS, STOP_ASKED = "ready", "controls", "stop_asked"
RECYCLE, TIME_LIMIT = "recycle", "time_limit"


class SupervisorReport:
    """The write end of the pipe to this process's supervisor (written from the
    dispatcher's thread and the registry's beat: one event at a time)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()  # a long line is not interleaved with another

    def send(self, event: str, **data: Any) -> None:
        """Send one event, whole (a write the supervisor reads in full even after this
        process ended); an error is logged: the supervisor is gone or going."""
        line = json.dumps({"event": event, **data}).encode() + b"\n"
        try:
            with self._lock:
                while line:
                    line = line[os.write(self.fd, line) :]
        except OSError as exc:
            logger.warning("cannot tell the supervisor of %s: %s", event, exc)


def read_events(buffer: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The whole lines of `buffer` as events, and what is left of it (a line not ended
    yet). A line that is not an event is logged and passed over."""
    *lines, rest = buffer.split(b"\n")
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict) and "event" in event:
            events.append(event)
        elif line.strip():
            logger.warning("supervisor: a child's report is not an event: %r", line[:200])
    return events, rest
