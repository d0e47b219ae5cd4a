"""django-absurd's side of benchmarks/durable.py, run with its own virtual environment.

Runs of 5 steps: a Django task (`@task`) calling `get_absurd_context().step` five times
on a no-op function, enqueued with `task.enqueue()` on the queue "bench", drained by one
`absurd_worker --concurrency C` process (a minimal Django project configured here, its
database the --url one). Drains are timed on Absurd's run rows, from the first run's
start to the last one's completion, and checked there: every task completed by one
run, five checkpoints each. Its claim timeout (--claim-timeout, the lease) is 2 s in
the kill test, like ours.

Run: python django_absurd_driver.py '{"cmd": "drain", "url": "postgres://...", ...}'
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from typing import Any
from urllib.parse import urlsplit

from _driver import kill_when_ready, main, resume_mark, spawn

QUEUE = "bench"  # its tables: absurd.t_bench (tasks), r_ (runs), c_ (checkpoints), w_
STEPS = 5
MODULE = "django_absurd_driver"  # the tasks' module, as the worker imports it


def configure(url: str) -> None:
    """A minimal Django project on the database of `url`, with Absurd's backend."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    parts = urlsplit(url)
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_absurd"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": parts.path.lstrip("/"),
                "USER": parts.username or "postgres",
                "PASSWORD": parts.password or "",
                "HOST": parts.hostname or "127.0.0.1",
                "PORT": parts.port or 5432,
            }
        },
        TASKS={
            "default": {
                "BACKEND": "django_absurd.backends.AbsurdBackend",
                "QUEUES": ["default", QUEUE],
                "OPTIONS": {"ENABLE_ADMIN": False},
            }
        },
        USE_TZ=True,
        LOGGING_CONFIG=None,
    )
    django.setup()
    # Its per-step and per-task info lines: not what is measured (ours log no line a step).
    logging.getLogger("django_absurd").setLevel(logging.WARNING)


def sql(query: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def tasks() -> Any:
    """The tasks' module imported by its name (the worker imports it so)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return __import__(MODULE)


def plain(i: int) -> int:
    return i


def five_steps() -> int:
    from django_absurd import get_absurd_context

    context = get_absurd_context()
    return sum(context.step(f"s{i}", lambda i=i: plain(i)) for i in range(STEPS))


def resumable(ready: str) -> float:
    from django_absurd import get_absurd_context

    context = get_absurd_context()
    context.step("s0", lambda: plain(0))
    context.step("s1", lambda: plain(1))
    resumed = context.step("s2", lambda: resume_mark(ready))
    context.step("s3", lambda: plain(3))
    context.step("s4", lambda: plain(4))
    return resumed


def overhead(n: int) -> dict[str, float]:
    from django_absurd import get_absurd_context

    context = get_absurd_context()
    started = time.perf_counter()
    for i in range(n):
        plain(i)
    call = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for i in range(n):
        context.step(f"s{i}", lambda i=i: plain(i))
    step = (time.perf_counter() - started) / n
    return {"step_us": step * 1e6, "plain_us": call * 1e6}


if os.environ.get("ABSURD_BENCH_URL"):
    configure(os.environ["ABSURD_BENCH_URL"])
    from django.tasks import task

    five_steps = task(queue_name=QUEUE)(five_steps)  # type: ignore[assignment]
    resumable = task(queue_name=QUEUE)(resumable)  # type: ignore[assignment]
    overhead = task(queue_name=QUEUE)(overhead)  # type: ignore[assignment]


def _setup_env(url: str) -> None:
    os.environ["ABSURD_BENCH_URL"] = url
    configure(url)


def setup(args: dict[str, Any]) -> dict[str, Any]:
    _setup_env(args["url"])
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return {"version": version("django-absurd")}


def reset() -> None:
    sql("TRUNCATE absurd.t_bench, absurd.r_bench, absurd.c_bench, absurd.w_bench")


def worker(args: dict[str, Any]) -> dict[str, Any]:
    _setup_env(args["url"])
    tasks()
    from django.core.management import call_command

    options = ["--queue", QUEUE, "--concurrency", str(args["concurrency"])]
    options += ["--claim-timeout", str(args.get("claim_timeout", 120))]
    call_command("absurd_worker", *options)
    return {}


def run_worker(args: dict[str, Any], until: Any, timeout: float = 600) -> None:
    """A worker process until `until()` holds, then SIGTERM (it has no burst mode)."""
    process = spawn(__file__, {**args, "cmd": "worker"})
    try:
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("django-absurd worker stopped or hung")
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def completed() -> int:
    return sql("SELECT count(*) FROM absurd.t_bench WHERE state = 'completed'")[0][0]


def drain(args: dict[str, Any]) -> dict[str, Any]:
    _setup_env(args["url"])
    n = args["n"]
    reset()
    module = tasks()
    for _ in range(n):
        module.five_steps.enqueue()
    sql("VACUUM ANALYZE absurd.r_bench")
    run_worker(args, lambda: completed() >= n)
    ((runs, done, seconds),) = sql(
        "SELECT count(*), count(DISTINCT task_id),"
        " extract(epoch FROM max(completed_at) - min(started_at)) FROM absurd.r_bench"
    )
    steps = sql("SELECT count(*) FROM absurd.c_bench")[0][0]
    if not (runs == done == completed() == n and steps == n * STEPS):
        raise SystemExit(f"django-absurd drain: {n} tasks, {runs} runs, {steps} checkpoints")
    seconds = float(seconds)
    return {"runs_per_s": n / seconds, "steps_per_s": n * STEPS / seconds, "seconds": seconds}


def _result() -> Any:
    (result,) = sql("SELECT completed_payload FROM absurd.t_bench")[0]
    return json.loads(result) if isinstance(result, str) else result


def step_overhead(args: dict[str, Any]) -> dict[str, Any]:
    _setup_env(args["url"])
    module = tasks()
    reset()
    module.overhead.enqueue(max(1, args["n"] // 10))  # warm-up
    run_worker({**args, "concurrency": 1}, lambda: completed() >= 1)
    reset()
    module.overhead.enqueue(args["n"])
    run_worker({**args, "concurrency": 1}, lambda: completed() >= 1)
    result = _result()
    return {**result, "overhead_us": result["step_us"] - result["plain_us"]}


def kill_resume(args: dict[str, Any]) -> dict[str, Any]:
    _setup_env(args["url"])
    ready = args["ready"]
    module = tasks()
    reset()
    module.resumable.enqueue(ready)
    worker_args = {**args, "cmd": "worker", "claim_timeout": 2}
    killed = kill_when_ready(spawn(__file__, worker_args), ready, "django-absurd")
    run_worker(worker_args, lambda: completed() >= 1, timeout=120)
    return {"seconds": float(_result()) - killed}


if __name__ == "__main__":
    main(
        {
            "setup": setup,
            "worker": worker,
            "drain": drain,
            "step_overhead": step_overhead,
            "kill_resume": kill_resume,
        }
    )
