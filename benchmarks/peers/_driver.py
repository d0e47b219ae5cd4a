"""What both peer drivers share: the JSON command line, worker processes, percentiles.

Standard library only: this runs with a peer's own virtual environment's Python.
A driver is called as `python DRIVER.py '{"cmd": ..., "url": ..., ...}'` and prints one
line of JSON (the command's result) as the last line of its output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

Command = Callable[[dict[str, Any]], dict[str, Any]]


def main(commands: dict[str, Command]) -> None:
    """Run the command named in the JSON argument and print its result as JSON."""
    args = json.loads(sys.argv[1])
    result = commands[args["cmd"]](args)
    print(json.dumps(result), flush=True)


def spawn(script: str, args: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start `script` with the same Python and `args` as its JSON command line."""
    return subprocess.Popen([sys.executable, script, json.dumps(args)])


def wait_all(workers: list[subprocess.Popen[bytes]], timeout: float = 600) -> None:
    """Wait for every worker process; fail if one exits with an error or hangs."""
    deadline = time.monotonic() + timeout
    for worker in workers:
        code = worker.wait(max(1.0, deadline - time.monotonic()))
        if code != 0:
            raise SystemExit(f"peer worker exited with {code}")


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile, the way benchmarks/_common.py computes it."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def latencies(values: list[float], count: int) -> dict[str, float]:
    """p50, p99 and max of the pickup latencies (ms); every one of `count` jobs must have run."""
    if len(values) != count:
        raise SystemExit(f"pickup: only {len(values)} of {count} jobs ran")
    return {
        "p50_ms": percentile(values, 50),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values),
    }


def exactly_once(n: int, started: int, distinct: int, done: int, remaining: int) -> None:
    """Fail unless each of the `n` jobs was started once and finished, none left over."""
    if not (started == distinct == done == n and remaining == 0):
        raise SystemExit(
            f"drain check failed: {n} jobs, {started} starts of {distinct} distinct jobs, "
            f"{done} done, {remaining} left in the queue"
        )


def resume_mark(ready: str) -> float:
    """The third step of the kill test's run: the first time, create the file `ready`
    and hang until SIGKILLed; resumed, return the wall time it started again."""
    if not os.path.exists(ready):
        with open(ready, "w") as f:
            f.write("ready")
        time.sleep(3600)
    return time.time()


def kill_when_ready(worker: subprocess.Popen[bytes], ready: str, who: str) -> float:
    """SIGKILL `worker` once its run hangs in its third step (the file `ready` exists);
    return the wall time of the kill."""
    deadline = time.monotonic() + 120
    while not os.path.exists(ready):
        if time.monotonic() > deadline or worker.poll() is not None:
            worker.kill()
            raise SystemExit(f"{who} kill_resume: the run never reached its third step")
        time.sleep(0.01)
    killed = time.time()
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    return killed
