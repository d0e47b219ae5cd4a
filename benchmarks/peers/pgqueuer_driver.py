"""pgqueuer's side of benchmarks/peers.py, run with pgqueuer's own virtual environment.

asyncpg is pgqueuer's fastest documented driver, and uvloop runs the event loop, as
pgqueuer's own command line does. Drains are timed on the database clock from the
first 'picked' to the last 'successful' row of pgqueuer_log, and checked there: every
job picked once and logged successful once, none left in the queue. Pickup latency:
the handler's first line takes time.time(), written beside the time the enqueue call
started (the payload's `t`, the same machine's clock), what a user sees.

Run: python pgqueuer_driver.py '{"cmd": "drain", "url": "postgres://...", ...}'
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from importlib.metadata import version
from typing import Any

import asyncpg
import uvloop
from _driver import exactly_once, latencies, main, spawn, wait_all
from pgqueuer import QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

PICKUP_TABLE = (
    "CREATE TABLE IF NOT EXISTS peer_pickup"
    " (job_id bigint, created timestamptz, started timestamptz)"
)


def run(coro: Any) -> Any:
    return uvloop.run(coro)


async def connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url)


async def setup(args: dict[str, Any]) -> dict[str, Any]:
    conn = await connect(args["url"])
    try:
        if await conn.fetchval("SELECT to_regclass('pgqueuer') IS NULL"):
            await Queries(AsyncpgDriver(conn)).install()
        await conn.execute(PICKUP_TABLE)
    finally:
        await conn.close()
    return {"version": version("pgqueuer")}


async def reset(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics, peer_pickup")
    await conn.execute("VACUUM ANALYZE pgqueuer")


async def enqueue_single(args: dict[str, Any]) -> dict[str, Any]:
    n = args["n"]
    conn = await connect(args["url"])
    try:
        await reset(conn)
        queries = Queries(AsyncpgDriver(conn))
        started = time.perf_counter()
        for i in range(n):  # no explicit transaction: one each
            await queries.enqueue("noop", json.dumps({"n": i}).encode())
        return {"jobs_per_s": n / (time.perf_counter() - started)}
    finally:
        await conn.close()


async def enqueue_bulk(args: dict[str, Any]) -> dict[str, Any]:
    n = args["n"]
    conn = await connect(args["url"])
    try:
        await reset(conn)
        queries = Queries(AsyncpgDriver(conn))
        payloads = [json.dumps({"n": i}).encode() for i in range(n)]
        started = time.perf_counter()
        await queries.enqueue(["noop"] * n, payloads, [0] * n)
        return {"jobs_per_s": n / (time.perf_counter() - started)}
    finally:
        await conn.close()


async def drained(conn: asyncpg.Connection, n: int) -> dict[str, Any]:
    """The drain's rate on the database clock, first 'picked' to last 'successful',
    once the log shows each of the n jobs picked once and successful once."""
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE status = 'picked'),"
        " count(DISTINCT job_id) FILTER (WHERE status = 'picked'),"
        " count(DISTINCT job_id) FILTER (WHERE status = 'successful'),"
        " extract(epoch FROM max(created) FILTER (WHERE status = 'successful')"
        "   - min(created) FILTER (WHERE status = 'picked'))"
        " FROM pgqueuer_log"
    )
    remaining = await conn.fetchval("SELECT count(*) FROM pgqueuer")
    exactly_once(n, row[0], row[1], row[2], remaining)
    return {"jobs_per_s": n / float(row[3]), "seconds": float(row[3])}


async def drain(args: dict[str, Any]) -> dict[str, Any]:
    n = args["n"]
    conn = await connect(args["url"])
    try:
        await reset(conn)
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, n, 20_000):
            size = min(20_000, n - start)
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
        await conn.execute("VACUUM ANALYZE pgqueuer")
        worker = {"cmd": "worker", "url": args["url"], "batch": args.get("batch")}
        wait_all([spawn(__file__, worker) for _ in range(args["processes"])])
        return await drained(conn, n)
    finally:
        await conn.close()


async def async_drain(args: dict[str, Any]) -> dict[str, Any]:
    """Jobs that each await asyncio.sleep(delay), drained by one worker process holding
    `in_flight` at once; timed and checked like drain."""
    n = args["n"]
    conn = await connect(args["url"])
    try:
        await reset(conn)
        queries = Queries(AsyncpgDriver(conn))
        payload = json.dumps({"delay": args["delay"]}).encode()
        for start in range(0, n, 20_000):
            size = min(20_000, n - start)
            await queries.enqueue(["sleep"] * size, [payload] * size, [0] * size)
        await conn.execute("VACUUM ANALYZE pgqueuer")
        worker = {
            "cmd": "worker",
            "url": args["url"],
            "batch": args["batch"],
            "in_flight": args["in_flight"],
        }
        wait_all([spawn(__file__, worker)])
        return await drained(conn, n)
    finally:
        await conn.close()


async def worker(args: dict[str, Any]) -> dict[str, Any]:
    """One worker process: drain the queue (no-op jobs), or serve the clock job until SIGTERM."""
    conn = await connect(args["url"])
    manager = QueueManager(Queries(AsyncpgDriver(conn)))
    # A pool: handlers of one batch run concurrently, and an asyncpg connection runs
    # one statement at a time.
    clock = await asyncpg.create_pool(args["url"], min_size=4) if args.get("continuous") else None

    @manager.entrypoint("noop")
    async def noop(job: Job) -> None:
        pass

    @manager.entrypoint("sleep")
    async def sleep(job: Job) -> None:
        await asyncio.sleep(json.loads(job.payload)["delay"])

    @manager.entrypoint("clock")
    async def record(job: Job) -> None:
        started = time.time()  # the handler's first line
        await clock.execute(
            "INSERT INTO peer_pickup VALUES ($1, to_timestamp($2), to_timestamp($3))",
            job.id,
            json.loads(job.payload)["t"],
            started,
        )

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, manager.shutdown.set)
    options: dict[str, Any] = {}
    if args.get("batch"):
        options["batch_size"] = args["batch"]
    if args.get("in_flight"):
        options["max_concurrent_tasks"] = args["in_flight"]
    mode = QueueExecutionMode.continuous if clock else QueueExecutionMode.drain
    await manager.run(mode=mode, **options)
    return {}


async def pickup(args: dict[str, Any]) -> dict[str, Any]:
    count, gap = args["count"], args["gap"]
    conn = await connect(args["url"])
    try:
        await reset(conn)
        queries = Queries(AsyncpgDriver(conn))
        process = spawn(__file__, {"cmd": "worker", "url": args["url"], "continuous": True})
        try:
            # Started, not starting: it ran a probe job (then idle again), as ours does.
            await queries.enqueue("clock", json.dumps({"t": time.time()}).encode())
            deadline = time.monotonic() + 120
            while not await conn.fetchval("SELECT count(*) FROM peer_pickup"):
                if time.monotonic() > deadline:
                    raise SystemExit("pickup: the worker ran no job within 120 s of its start")
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            await conn.execute("TRUNCATE peer_pickup")
            for _ in range(count):
                await queries.enqueue("clock", json.dumps({"t": time.time()}).encode())
                await asyncio.sleep(gap)
            # Longer than pgqueuer's dequeue_timeout (30 s), its poll for a missed NOTIFY.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if await conn.fetchval("SELECT count(*) FROM peer_pickup") >= count:
                    break
                await asyncio.sleep(0.05)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        rows = await conn.fetch(
            "SELECT extract(epoch FROM started - created) * 1000 FROM peer_pickup"
        )
        return latencies([float(r[0]) for r in rows], count)
    finally:
        await conn.close()


if __name__ == "__main__":
    main(
        {
            name: lambda args, f=f: run(f(args))
            for name, f in {
                "setup": setup,
                "enqueue_single": enqueue_single,
                "enqueue_bulk": enqueue_bulk,
                "drain": drain,
                "async_drain": async_drain,
                "worker": worker,
                "pickup": pickup,
            }.items()
        }
    )
