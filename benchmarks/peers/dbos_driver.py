"""DBOS Transact's side of benchmarks/durable.py, run with DBOS's own virtual environment.

Runs of 5 steps: a workflow (`@DBOS.workflow`) calling a no-op `@DBOS.step` five times,
enqueued with a `DBOSClient` on a queue of `worker_concurrency` C, drained by one
worker process (DBOS launched, executor "local"). Its system database is the --url
database on the same server as ours. Drains are timed on DBOS's own clock columns
(epoch ms) from the first workflow's start to the last one's completion, and checked
in its tables: every workflow SUCCESS, five step outputs each.

Run: python dbos_driver.py '{"cmd": "drain", "url": "postgres://...", ...}'
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from importlib.metadata import version
from typing import Any

import psycopg
from _driver import kill_when_ready, main, resume_mark, spawn
from dbos import DBOS, DBOSClient

QUEUE = "bench"
APP_VERSION = "bench"  # fixed: the client enqueues for the version the worker runs
STEPS = 5
logging.getLogger("dbos").setLevel(logging.WARNING)


def config(url: str) -> dict[str, Any]:
    return {
        "name": "durable-bench",
        "system_database_url": url,
        "application_version": APP_VERSION,
        "executor_id": "local",
        "log_level": "WARNING",
    }


def plain(i: int) -> int:
    return i


noop = DBOS.step(name="noop")(plain)


resume_step = DBOS.step(name="resume_mark")(resume_mark)


@DBOS.workflow(name="five_steps")
def five_steps() -> int:
    return sum(noop(i) for i in range(STEPS))


@DBOS.workflow(name="resumable")
def resumable(ready: str) -> float:
    noop(0)
    noop(1)
    resumed = resume_step(ready)
    noop(3)
    noop(4)
    return resumed


@DBOS.workflow(name="overhead")
def overhead(n: int) -> dict[str, float]:
    """n no-op steps in one workflow against n plain calls: µs per call each."""
    started = time.perf_counter()
    for i in range(n):
        plain(i)
    call = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for i in range(n):
        noop(i)
    step = (time.perf_counter() - started) / n
    return {"step_us": step * 1e6, "plain_us": call * 1e6}


def sql(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def setup(args: dict[str, Any]) -> dict[str, Any]:
    DBOS(config=config(args["url"]))  # type: ignore[arg-type]
    DBOS.launch()  # creates and migrates its system database
    DBOS.destroy()
    return {"version": version("dbos")}


def reset(url: str) -> None:
    sql(url, "TRUNCATE dbos.workflow_status, dbos.operation_outputs CASCADE")
    sql(url, "VACUUM ANALYZE dbos.workflow_status")


def worker(args: dict[str, Any]) -> dict[str, Any]:
    """One DBOS process: launch (recovering its executor's pending workflows), run the
    queue until `until` workflows succeeded (or, with none, until killed)."""
    DBOS(config=config(args["url"]))  # type: ignore[arg-type]
    DBOS.launch()
    DBOS.register_queue(  # after the launch: it writes to the system database
        QUEUE,
        worker_concurrency=args["concurrency"],
        polling_interval_sec=args.get("polling", 1.0),
    )
    until = args.get("until")
    deadline = time.monotonic() + 600
    while until is None or time.monotonic() < deadline:
        done = sql(
            args["url"], "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
        )
        if until is not None and done[0][0] >= until:
            break
        time.sleep(0.05)
    DBOS.destroy()
    return {}


def enqueue(url: str, name: str, n: int, *args: Any) -> None:
    client = DBOSClient(system_database_url=url)
    options = {"workflow_name": name, "queue_name": QUEUE, "app_version": APP_VERSION}
    for _ in range(n):
        client.enqueue(options, *args)  # type: ignore[arg-type]
    client.destroy()


def drain(args: dict[str, Any]) -> dict[str, Any]:
    url, n = args["url"], args["n"]
    reset(url)
    enqueue(url, "five_steps", n)
    process = spawn(__file__, {**args, "cmd": "worker", "until": n})
    if process.wait(900) != 0:
        raise SystemExit(f"dbos worker exited with {process.returncode}")
    ((done, steps, seconds),) = sql(
        url,
        "SELECT count(*) FILTER (WHERE status = 'SUCCESS'),"
        " (SELECT count(*) FROM dbos.operation_outputs),"
        " (max(updated_at) - min(started_at_epoch_ms)) / 1000.0"
        " FROM dbos.workflow_status",
    )
    if done != n or steps != n * STEPS:
        raise SystemExit(f"dbos drain: {done} of {n} runs succeeded, {steps} step outputs")
    seconds = float(seconds)
    return {"runs_per_s": n / seconds, "steps_per_s": n * STEPS / seconds, "seconds": seconds}


def step_overhead(args: dict[str, Any]) -> dict[str, Any]:
    """One workflow of n no-op steps, run in this process."""
    reset(args["url"])
    DBOS(config=config(args["url"]))  # type: ignore[arg-type]
    DBOS.launch()
    overhead(args["n"] // 10)  # warm-up
    result = overhead(args["n"])
    DBOS.destroy()
    return {**result, "overhead_us": result["step_us"] - result["plain_us"]}


def kill_resume(args: dict[str, Any]) -> dict[str, Any]:
    """A run killed in its third step (SIGKILL of its worker), a new worker started at
    once: seconds from the kill to the third step starting again."""
    url, ready = args["url"], args["ready"]
    if os.path.exists(ready):
        os.remove(ready)
    reset(url)
    enqueue(url, "resumable", 1, ready)
    worker_args = {**args, "cmd": "worker"}
    killed = kill_when_ready(spawn(__file__, worker_args), ready, "dbos")
    second = spawn(__file__, {**worker_args, "until": 1})
    try:
        second.wait(120)
    except subprocess.TimeoutExpired:
        second.kill()
        raise SystemExit("dbos kill_resume: the run did not finish within 120 s") from None
    resumed = DBOSClient(system_database_url=url)
    try:
        ((workflow_id,),) = sql(url, "SELECT workflow_uuid FROM dbos.workflow_status")
        resumed_at = float(resumed.retrieve_workflow(workflow_id).get_result())
    finally:
        resumed.destroy()
    return {"seconds": resumed_at - killed}


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
