"""`run_queue_worker --processes N` in a subprocess: the supervisor and its children."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import WorkerProcess

# A child's command line carries its spec as JSON (django_pgqueue.supervisor.CHILD_BOOT).
_SPEC = re.compile(r"(\{.*\})\s*$")


@dataclass(frozen=True)
class ChildProcess:
    pid: int
    index: int
    worker_id: str | None
    age_s: float


class SupervisedWorkers(WorkerProcess):
    """A supervisor process; `children()` lists its live children from `ps`."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        super().__init__(*args, env=env)
        self.seen: set[int] = set()  # every child pid ever listed, for the teardown

    def children(self) -> dict[int, ChildProcess]:
        """The supervisor's live children, by child index."""
        out = subprocess.run(
            ["ps", "-ww", "-o", "pid=,etimes=,stat=,args=", "--ppid", str(self.pid)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        found: dict[int, ChildProcess] = {}
        for line in out.splitlines():
            pid, age, stat, args = line.split(None, 3)
            match = _SPEC.search(args)
            if stat.startswith("Z") or not match:
                continue
            argv = json.loads(match.group(1))["argv"]
            index = int(argv[argv.index("--child-index") + 1])
            worker_id = argv[argv.index("--worker-id") + 1] if "--worker-id" in argv else None
            found[index] = ChildProcess(int(pid), index, worker_id, float(age))
            self.seen.add(int(pid))
        return found

    def wait_children(self, count: int, timeout: float = 60) -> dict[int, ChildProcess]:
        """Until `count` children are up (a hang guard, not a bound); them."""
        deadline = time.monotonic() + timeout
        while len(found := self.children()) != count:
            assert time.monotonic() < deadline, f"{len(found)} children, not {count}"
            time.sleep(0.05)
        return found

    def kill_all(self) -> None:
        """SIGKILL every child seen and the supervisor (teardown: nothing left behind)."""
        if self.proc is not None and self.proc.poll() is None:
            self.children()
        for pid in self.seen:
            _kill(pid)
        self.kill()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def process_gone(pid: int) -> bool:
    """The process ended (or is a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.fixture
def supervised() -> Iterator[Any]:
    """Start `run_queue_worker ARGS` (with --processes among them) in a subprocess."""
    started: list[SupervisedWorkers] = []

    def start(*args: str, **kwargs: Any) -> SupervisedWorkers:
        proc = SupervisedWorkers(*args, **kwargs).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill_all()
