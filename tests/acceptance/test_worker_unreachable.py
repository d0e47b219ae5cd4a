"""A worker that cannot reach its database stops at the first signal (issue 12 #17)."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from django_pgqueue.worker.lifecycle import EXIT_UNREACHABLE

pytestmark = pytest.mark.slow


def closed_port() -> int:
    """A local port nothing listens on: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("burst", [False, True])
def test_first_sigterm_ends_a_worker_that_cannot_reach_the_database(worker_process, burst):
    url = f"postgres://postgres@127.0.0.1:{closed_port()}/pgqueue_nowhere"
    args = ["nowhere", "--shutdown-grace", "30", *(["--burst"] if burst else [])]
    worker = worker_process(*args, env={"DATABASE_URL": url})
    # It starts (its SIGTERM handler is installed before it connects), fails to
    # connect, and backs off.
    worker.read_until("database unavailable")
    assert worker.proc.poll() is None
    worker.signal(signal.SIGTERM)
    started = time.monotonic()
    code, output = worker.wait(timeout=120)
    # Ended by the first SIGTERM, not after the 30 s grace (nor by a second signal).
    assert time.monotonic() - started < 20, output[-3000:]
    assert code == EXIT_UNREACHABLE, output[-3000:]
    assert "database unavailable" in output
