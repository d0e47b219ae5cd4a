"""I/O-bound jobs by the thousand: async handlers on the event loop against threads.

Each job waits 200 ms of I/O, two ways (`--io`): `sleep`, an asyncio.sleep (time.sleep
on a thread), which measures the queue's own cost per job; `tcp`, one round trip (a new
connection each time) to a local TCP server (its own process, asyncio) that answers a
line 200 ms after it came: the I/O wait of a webhook or a payment provider, with no
network in the way, and the handler's own connection costs on top. N jobs are enqueued
first, then drained by one `run_queue_worker --burst` process:

- async: `bench.async_io` (asyncio.open_connection), `--async-concurrency 1000`;
- threads: `bench.sync_io` (a blocking socket), `--concurrency 100`.

The drain is timed on the database clock (first attempt's start to last attempt's
finish) and checked: every job completed exactly once. The steady rate counts the
finishes between the 10th and the 90th percentile of them: the pool full, without
the ramp of the first claims or the tail of the last jobs' own delay. The worker's resident memory
is sampled from /proc while it drains (the peak is kept, at up to 1,000 in flight).

Run: python benchmarks/async_io.py [--smoke] [--runs 3] [--jobs 10000] [--delay 0.2]
     python benchmarks/async_io.py --delay-server PORT DELAY   (the local server alone)
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from typing import Any

from _common import (
    MANAGE,
    machine,
    markdown_table,
    parser,
    setup_django,
    sql,
    truncate,
    write_json,
)
from throughput import check_drained

# (name, job type, worker options)
CONFIGS = [
    ("async, 1,000 in flight", "bench.async_io", ["--async-concurrency", "1000"], 1000),
    ("threads, concurrency 100", "bench.sync_io", ["--concurrency", "100"], 100),
]


def delay_server(port: int, delay: float) -> None:
    """Answer each line after `delay` seconds, many connections at once."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            await asyncio.sleep(delay)
            writer.write(line)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    _more_files()
    asyncio.run(serve())


def _more_files() -> None:
    """Raise this process's open-file limit to its hard limit (a socket per job)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(delay: float) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--delay-server", str(port), str(delay)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, port
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit("the delay server did not start")


def rss_kib(pid: int) -> int:
    """The resident set of process `pid`, in KiB (0 once it ended)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def steady_rate(n: int) -> float:
    """Jobs/s between the 10th and the 90th percentile of the finishes: the rate once
    the pool is full, without the ramp of the first claims or the tail of the last
    jobs' own delay, which the whole window counts."""
    [(seconds,)] = sql(
        "SELECT extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY finished_at)"
        " - percentile_disc(0.1) WITHIN GROUP (ORDER BY finished_at))"
        " FROM queue_attempts WHERE status = 'succeeded'"
    )
    return 0.8 * n / float(seconds) if seconds else float("nan")


def drain(
    n: int, job_type: str, options: list[str], payload: dict[str, Any], batch: int
) -> dict[str, Any]:
    from django_pgqueue import enqueue_many

    truncate()
    for start in range(0, n, 20_000):
        enqueue_many([(job_type, payload)] * min(20_000, n - start), queue="bench_io")
    sql("VACUUM ANALYZE queue_job_state")
    command = [
        *(sys.executable, str(MANAGE), "run_queue_worker", "bench_io", "--burst", "-v", "0"),
        *("--batch-size", str(batch), *options),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker = subprocess.Popen(command, env=os.environ, preexec_fn=_more_files)
    peak = 0
    while worker.poll() is None:
        peak = max(peak, rss_kib(worker.pid))
        time.sleep(0.05)
    if worker.returncode != 0:
        raise SystemExit(f"worker exited with {worker.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    seconds = check_drained(n)
    return {
        "jobs_per_s": n / seconds,
        "steady_jobs_per_s": steady_rate(n),
        "seconds": seconds,
        "peak_rss_mib": peak / 1024,
        # The worker's CPU time per job (start-up included): what a loaded machine's
        # share of a core has to cover.
        "cpu_ms_per_job": cpu * 1000 / n,
    }


def main() -> None:
    if sys.argv[1:2] == ["--delay-server"]:
        delay_server(int(sys.argv[2]), float(sys.argv[3]))
        return
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_async")
    p.add_argument("--jobs", type=int, default=10_000, help="jobs per drain run")
    p.add_argument("--delay", type=float, default=0.2, help="seconds of I/O per job")
    p.add_argument("--io", default="sleep,tcp", help="the kinds of I/O: sleep, tcp or both")
    args = p.parse_args()
    setup_django(args.database_url)
    runs = 1 if args.smoke else args.runs
    results: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "runs": runs,
        "delay_s": args.delay,
        "load": os.getloadavg(),
    }
    kinds = [kind.strip() for kind in args.io.split(",")]
    if not set(kinds) <= {"sleep", "tcp"}:
        raise SystemExit(f"--io: sleep, tcp or both, not {args.io!r}")
    server, port = start_server(args.delay)
    rows, drains = [], []
    try:
        for (name, job_type, options, in_flight), io in [
            (config, io) for io in kinds for config in CONFIGS
        ]:
            payload = {"port": port} if io == "tcp" else {"delay": args.delay}
            jobs = (500 if in_flight > 100 else 200) if args.smoke else args.jobs
            batch = min(500, in_flight)
            measured = [drain(jobs, job_type, options, payload, batch) for _ in range(runs)]
            values = [m["jobs_per_s"] for m in measured]
            rate = sorted(values)[len(values) // 2]
            steadies = [m["steady_jobs_per_s"] for m in measured]
            steady = sorted(steadies)[len(steadies) // 2]
            rss = sorted(m["peak_rss_mib"] for m in measured)[len(measured) // 2]
            cpu = sorted(m["cpu_ms_per_job"] for m in measured)[len(measured) // 2]
            ceiling = in_flight / args.delay
            drains.append(
                {
                    "name": name,
                    "io": io,
                    "type": job_type,
                    "options": options,
                    "batch_size": batch,
                    "jobs": jobs,
                    "jobs_per_s": rate,
                    "runs": values,
                    "steady_jobs_per_s": steady,
                    "steady_runs": steadies,
                    "peak_rss_mib": rss,
                    "cpu_ms_per_job": cpu,
                    "ceiling_jobs_per_s": ceiling,
                }
            )
            rows.append(
                [
                    name,
                    io,
                    f"{jobs:,}",
                    f"{rate:,.0f}",
                    f"{steady:,.0f}",
                    f"{ceiling:,.0f}",
                    f"{rss:,.0f} MiB",
                    f"{cpu:.2f} ms",
                ]
            )
            print(
                f"{name}, {io}: {rate:,.0f} jobs/s ({steady:,.0f} steady), "
                f"peak RSS {rss:,.0f} MiB, "
                f"{cpu:.2f} ms of worker CPU per job",
                flush=True,
            )
    finally:
        server.kill()
        server.wait()
    results["drain"] = drains
    results["load_after"] = os.getloadavg()
    headers = [
        "worker (one process)",
        "I/O",
        "jobs",
        "jobs/s",
        "jobs/s, steady (10th-90th percentile of finishes)",
        "ceiling (in flight / delay)",
        "peak RSS",
        "worker CPU per job",
    ]
    print(markdown_table(headers, rows))
    print(f"results: {write_json(args.json_out, 'async_io', results)}")


if __name__ == "__main__":
    main()
