"""Which of a supervisor's children LISTENs for their queues: one at a time.

PostgreSQL delivers each NOTIFY to every session that LISTENs on its channel. Children
of one `run_queue_worker --processes N` that all listened would all wake for each job
enqueued, and all but one would claim nothing. So the children serving the same
queues on the same database share a turn: an exclusive `flock` on a file the
supervisor made for them (one per queue set, in a directory it removes at its end).
The child holding it LISTENs and claims on a NOTIFY; the others stay idle, their empty
queues looked at as rarely as a listening worker's (someone listens for them). The
holder gives the turn up when it cannot take a job: no room, drained by an operator,
done with its share of jobs, or stopping while its handlers finish (another child with
room takes it and looks at the queues at once: a NOTIFY may have come meanwhile); when
its listener loses its connection; and when it stops; the kernel gives it up when the
process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable

# How often a child with room and without the turn tries to take it. Only a hand-over
# waits this long (the holder filled up or stopped); a NOTIFY reaches the holder at once.
TURN_RETRY = 0.01


def turn_path(directory: str, database: str, queues: Iterable[str]) -> str:
    """The file whose lock is the turn of the children serving `queues` on `database`."""
    key = json.dumps([database, sorted(set(queues))]).encode()
    return os.path.join(directory, f"listen-{hashlib.sha256(key).hexdigest()[:20]}")


class ListenTurn:
    """This process's side of the turn: take it (when there is room), hold it, give it up."""

    def __init__(self, directory: str, database: str, queues: Iterable[str]) -> None:
        # Opened here, not inherited: a lock belongs to an open file description, and
        # one shared by every child would let them all hold it at once.
        self._fd = os.open(
            turn_path(directory, database, queues), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        self.held = False

    def take(self, room: Callable[[], bool], stop: threading.Event) -> bool:
        """Wait until this process has room for a job and the turn is free, and take it;
        False if `stop` was set first."""
        while not stop.is_set():
            if room():
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass
                else:
                    self.held = True
                    return True
            stop.wait(TURN_RETRY)
        return False

    def give(self) -> None:
        """Give the turn up (another child with room takes it)."""
        if self.held:
            self.held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.give()
        with contextlib.suppress(OSError):
            os.close(self._fd)
