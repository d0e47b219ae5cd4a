"""procrastinate's side of benchmarks/peers.py, run with procrastinate's own virtual environment.

procrastinate's asynchronous psycopg connector (psycopg 3 with its C extension, like
ours). Drains are timed on the database clock from the first 'started' to the last
'succeeded' row of procrastinate_events, and checked there: every job started once and
succeeded, none left to do. Pickup latency: the handler's first line takes time.time(),
written beside the time the defer call started (the payload's `t`, the same machine's
clock), what a user sees.

Run: python procrastinate_driver.py '{"cmd": "drain", "url": "postgres://...", ...}'
"""

from __future__ import annotations

import asyncio
import logging
import time
from importlib.metadata import version
from typing import Any

import procrastinate
import psycopg
from _driver import exactly_once, latencies, main, spawn, wait_all

QUEUE = "bench"
# Only its warning that the App lives in the __main__ module (right for a driver script).
logging.getLogger("procrastinate").setLevel(logging.ERROR)
PICKUP_TABLE = (
    "CREATE TABLE IF NOT EXISTS peer_pickup"
    " (job_id bigint, created timestamptz, started timestamptz)"
)


def make_app(url: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    app.url = url  # type: ignore[attr-defined]

    @app.task(name="noop", queue=QUEUE)
    async def noop(n: int | None = None) -> None:
        pass

    @app.task(name="clock", queue=QUEUE, pass_context=True)
    async def clock(context: procrastinate.JobContext, t: float) -> None:
        started = time.time()  # the handler's first line
        await app.connector.execute_query_async(
            "INSERT INTO peer_pickup VALUES (%(id)s, to_timestamp(%(t)s), to_timestamp(%(s)s))",
            id=context.job.id,
            t=t,
            s=started,
        )

    return app


async def execute(app: procrastinate.App, query: str) -> None:
    """Run `query` outside a transaction (VACUUM needs that; the connector opens one)."""
    async with await psycopg.AsyncConnection.connect(app.url, autocommit=True) as conn:
        await conn.execute(query)


async def one(app: procrastinate.App, query: str) -> Any:
    return (await app.connector.execute_query_one_async(query))["v"]


async def setup(args: dict[str, Any]) -> dict[str, Any]:
    app = make_app(args["url"])
    async with app.open_async():
        if await one(app, "SELECT to_regclass('procrastinate_jobs') IS NULL AS v"):
            await app.schema_manager.apply_schema_async()
        await execute(app, PICKUP_TABLE)
    return {"version": version("procrastinate")}


async def reset(app: procrastinate.App) -> None:
    await execute(app, "TRUNCATE procrastinate_jobs, procrastinate_events, peer_pickup CASCADE")
    await execute(app, "VACUUM ANALYZE procrastinate_jobs")


async def enqueue_single(args: dict[str, Any]) -> dict[str, Any]:
    n = args["n"]
    app = make_app(args["url"])
    async with app.open_async():
        await reset(app)
        task = app.tasks["noop"]
        started = time.perf_counter()
        for i in range(n):  # no explicit transaction: one each
            await task.defer_async(n=i)
        return {"jobs_per_s": n / (time.perf_counter() - started)}


async def enqueue_bulk(args: dict[str, Any]) -> dict[str, Any]:
    n = args["n"]
    app = make_app(args["url"])
    async with app.open_async():
        await reset(app)
        jobs = [{"n": i} for i in range(n)]
        started = time.perf_counter()
        await app.tasks["noop"].batch_defer_async(*jobs)
        return {"jobs_per_s": n / (time.perf_counter() - started)}


async def drain(args: dict[str, Any]) -> dict[str, Any]:
    n = args["n"]
    app = make_app(args["url"])
    async with app.open_async():
        await reset(app)
        for start in range(0, n, 20_000):
            await app.tasks["noop"].batch_defer_async(*[{}] * min(20_000, n - start))
        await execute(app, "VACUUM ANALYZE procrastinate_jobs")
        worker = {"cmd": "worker", "url": args["url"], "concurrency": args.get("concurrency")}
        wait_all([spawn(__file__, worker) for _ in range(args["processes"])])
        row = await app.connector.execute_query_one_async(
            "SELECT count(*) FILTER (WHERE type = 'started') AS started,"
            " count(DISTINCT job_id) FILTER (WHERE type = 'started') AS distinct_started,"
            " count(DISTINCT job_id) FILTER (WHERE type = 'succeeded') AS done,"
            " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
            "   - min(at) FILTER (WHERE type = 'started')) AS seconds"
            " FROM procrastinate_events"
        )
        remaining = await one(
            app, "SELECT count(*) AS v FROM procrastinate_jobs WHERE status <> 'succeeded'"
        )
        exactly_once(n, row["started"], row["distinct_started"], row["done"], remaining)
        seconds = float(row["seconds"])
        return {"jobs_per_s": n / seconds, "seconds": seconds}


async def worker(args: dict[str, Any]) -> dict[str, Any]:
    """One worker process: drain the queue and stop, or (continuous) run until SIGTERM."""
    app = make_app(args["url"])
    options: dict[str, Any] = {"queues": [QUEUE], "wait": bool(args.get("continuous"))}
    if args.get("concurrency"):
        options["concurrency"] = args["concurrency"]
    async with app.open_async():
        await app.run_worker_async(**options)
    return {}


async def pickup(args: dict[str, Any]) -> dict[str, Any]:
    count, gap = args["count"], args["gap"]
    app = make_app(args["url"])
    async with app.open_async():
        await reset(app)
        process = spawn(__file__, {"cmd": "worker", "url": args["url"], "continuous": True})
        try:
            # Started, not starting: it ran a probe job (then idle again), as ours does.
            await app.tasks["clock"].defer_async(t=time.time())
            deadline = time.monotonic() + 120
            while not await one(app, "SELECT count(*) AS v FROM peer_pickup"):
                if time.monotonic() > deadline:
                    raise SystemExit("pickup: the worker ran no job within 120 s of its start")
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            await app.connector.execute_query_async("TRUNCATE peer_pickup")
            for _ in range(count):
                await app.tasks["clock"].defer_async(t=time.time())
                await asyncio.sleep(gap)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if await one(app, "SELECT count(*) AS v FROM peer_pickup") >= count:
                    break
                await asyncio.sleep(0.05)
        finally:
            process.terminate()
            process.wait(30)
        rows = await app.connector.execute_query_all_async(
            "SELECT extract(epoch FROM started - created) * 1000 AS ms FROM peer_pickup"
        )
        return latencies([float(r["ms"]) for r in rows], count)


if __name__ == "__main__":
    main(
        {
            name: lambda args, f=f: asyncio.run(f(args))
            for name, f in {
                "setup": setup,
                "enqueue_single": enqueue_single,
                "enqueue_bulk": enqueue_bulk,
                "drain": drain,
                "worker": worker,
                "pickup": pickup,
            }.items()
        }
    )
