"""Shared fixtures. Every test that touches the database talks to a real PostgreSQL."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_pgqueue.worker import Worker

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"


def sql(query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run a query on the test's Django connection and return all rows."""
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        # A statement with no result has no description; a SELECT of no columns has an
        # empty one, and its rows still count.
        return cursor.fetchall() if cursor.description is not None else []


def database_url() -> str:
    """DATABASE_URL of the test database, for worker subprocesses."""
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class WorkerThread:
    """A `Worker` running in a real thread of this process, with its own connections."""

    def __init__(self, queues: list[str], *, observers: Any = (), **options: Any) -> None:
        options.setdefault("poll_interval", 0.1)
        self.worker = Worker(queues, install_signal_handlers=False, **options)
        for observer in observers:  # told of the jobs' events from the start
            self.worker.add_observer(observer)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def start(self) -> WorkerThread:
        self.thread.start()
        return self

    def join(self, timeout: float = 60) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker thread did not stop in time"
        if self.error:
            raise self.error

    def stop(self, timeout: float = 60, force: bool = False) -> None:
        self.worker.stop(force=force)
        self.join(timeout)


@pytest.fixture
def store_class() -> type:
    """The Store the `stores` fixture opens; a module overrides it for a subclass."""
    from django_pgqueue.store.worker import Store

    return Store


@pytest.fixture
def stores(store_class: type) -> Iterator[Any]:
    """Open worker Stores on the test database (each closed after the test)."""
    opened: list[Any] = []

    def make(name: str = "test", **options: Any) -> Any:
        store = store_class("default", name, **options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def run_worker() -> Iterator[Any]:
    started: list[WorkerThread] = []

    def start(queues: list[str], **options: Any) -> WorkerThread:
        worker = WorkerThread(queues, **options).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.thread.is_alive():
            worker.worker.stop(force=True)
            worker.thread.join(30)
    # Handlers that hang return now; the jobs their workers held at shutdown are
    # written before the test database is flushed (which their row locks would block).
    from qa.jobs import RELEASE  # the test project's handlers, loaded with Django

    RELEASE.set()
    try:
        for worker in started:
            assert worker.worker.wait_for_held(60), "a held job's handler did not return"
    finally:
        RELEASE.clear()


class WorkerProcess:
    """`manage.py run_queue_worker` in a subprocess against the test database."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = [sys.executable, str(MANAGE), "run_queue_worker", *args]
        self.env = {**os.environ, "DATABASE_URL": database_url(), **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self._read = b""  # output read_until took from the pipe; wait() puts it first

    def start(self) -> WorkerProcess:
        self.proc = subprocess.Popen(
            self.args,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def read_until(self, text: str, timeout: float = 30) -> str:
        """Read the output until `text` shows (the timeout is a hang guard); all of it
        so far. Straight from the pipe, so `wait()` still returns the whole output."""
        assert self.proc is not None
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while text not in (seen := self._read.decode(errors="replace")):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no {text!r} in the output after {timeout}s:\n{seen[-3000:]}"
            chunk = os.read(fd, 65536)
            assert chunk, f"the process exited before writing {text!r}:\n{seen[-3000:]}"
            self._read += chunk
        return seen

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        assert self.proc is not None
        output, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, self._read.decode(errors="replace") + output

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def worker_process() -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(*args: str, **kwargs: Any) -> WorkerProcess:
        proc = WorkerProcess(*args, **kwargs).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


# The admin fixtures, for every tier; imported last: factories uses `sql` above.
from tests.factories import (  # noqa: E402, F401
    operator,
    operator_client,
    superuser_client,
    viewer,
    viewer_client,
)
from tests.supervised import supervised  # noqa: E402, F401
