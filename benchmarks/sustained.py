"""Steady under overload: one worker's peak rate, its completions under twice that load,
its pickup latency at half of it and when idle.

The workload: a producer enqueues with `enqueue_many` every 25 ms (128 jobs a batch is
5,120 jobs/s; a phase offering another rate sizes the batch to it), and a worker of
concurrency 16 runs 1 ms jobs (`bench.sustained` in testproject/qa/jobs.py). Modes:

- `inproc`: the producer's thread and a `Worker` in one process;
- `separate`: a producer process and a `run_queue_worker` process;
- `processes2`: a producer process and `run_queue_worker --processes 2`.

Phases, each with fresh processes and emptied tables, for each mode:

- peak: a backlog enqueued first and the producer at 128 jobs / 25 ms: the completion
  rate (attempts finished, on the database clock) is the worker's peak;
- overload: offered twice that peak: completions per window (5 s) and their spread
  around the median;
- half: offered half the peak: pickup latency of every job, from just before the
  `enqueue_many` call (the producer's time.time() in the payload) to the handler's
  first line (its time.time(), sent back over UDP): one clock;
- idle: single `enqueue()` calls 100 ms apart on an idle worker: the same latency.

Each window also samples `n_dead_tup` of `queue_job_state` (the shared server runs with
autovacuum off: nothing reclaims them) and the pending count; each phase records the
load average. `--ab-pairs N` adds N pairs of peak runs in `inproc` mode, alternating the
default claim size and `--batch-size 10` (the default before the claim followed the
free slots), for a before/after ratio in one run.

Run: python benchmarks/sustained.py [--smoke] [--modes inproc,separate] [--ab-pairs 2]
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from _common import (
    MANAGE,
    ROOT,
    machine,
    markdown_table,
    parser,
    percentile,
    setup_django,
    sql,
    truncate,
    write_json,
)

MODES = ("inproc", "separate", "processes2")
QUEUE = "sustained"
TYPE = "bench.sustained"
CONCURRENCY = 16
TICK = 0.025  # the producer's cadence
PEAK_BATCH = 128  # the producer's batch in the peak phase: 5,120 jobs/s offered
OLD_BATCH = 10  # BATCH_SIZE's default before the claim followed the free slots
READY_TIMEOUT = 120.0

# Phase sizes: (full, smoke).
SIZES = {
    "window": (5.0, 1.0),
    "warmup": (3.0, 1.0),
    "peak": (15.0, 2.0),
    "overload": (30.0, 3.0),
    "half": (20.0, 2.0),
    "idle_jobs": (100, 5),
}
IDLE_GAP = 0.1
BACKLOG_RATE = 6_000  # jobs/s the peak phase's backlog is sized for, beside the producer

TARGETS = {
    "peak_per_process": 2_500,  # jobs/s at defaults
    "window_spread": 0.25,  # every overload window within ±25% of the median
    "half_p99_ms": 50.0,
    "idle_p50_ms": 2.0,
}


# -- the child processes: producer, and producer + Worker in one process --------------


def _child_django() -> None:
    """Django for a child process: the coordinator created and migrated the database."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path[:0] = [str(ROOT / "testproject"), str(ROOT)]
    import django

    django.setup()


def produce(rate: float, seconds: float, port: int | None) -> dict[str, Any]:
    """Offer `rate` jobs/s for `seconds`: a batch every TICK (one enqueue() each when the
    rate is below a job per tick). A late tick is sent at once, never skipped."""
    from django_pgqueue import enqueue, enqueue_many

    single = rate * TICK < 1
    interval = 1 / rate if single else TICK
    size = 1 if single else max(1, round(rate * TICK))
    started = time.time()
    sent = late = 0
    busy = 0.0
    k = 0
    while (due := started + k * interval) < started + seconds:
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        elif wait < -interval:
            late += 1
        t = time.time()  # the pickup latency counts from here
        payload: dict[str, Any] = {"t": t} if port is None else {"t": t, "port": port}
        if single:
            enqueue(TYPE, payload, queue=QUEUE)
        else:
            enqueue_many([(TYPE, payload)] * size, queue=QUEUE)
        busy += time.time() - t
        sent += size
        k += 1
    elapsed = time.time() - started
    return {"jobs": sent, "seconds": elapsed, "late_ticks": late, "enqueue_busy_s": busy}


def child(argv: list[str]) -> None:
    """`--child MODE RATE SECONDS PORT [BATCH]`: the producer (MODE inproc: with a Worker
    in the same process). Prints "ready", waits for a line on stdin, produces, prints
    its figures as JSON."""
    mode, rate, seconds, port = argv[0], float(argv[1]), float(argv[2]), int(argv[3])
    batch = int(argv[4]) if len(argv) > 4 else None
    _child_django()
    worker = thread = None
    if mode == "inproc":
        from django_pgqueue.worker import Worker

        options: dict[str, Any] = {"concurrency": CONCURRENCY}
        if batch:
            options["batch_size"] = batch
        worker = Worker([QUEUE], install_signal_handlers=False, **options)
        thread = threading.Thread(target=worker.run, name="worker")
        thread.start()
    print("ready", flush=True)
    sys.stdin.readline()
    figures = produce(rate, seconds, port or None)
    if worker is not None and thread is not None:
        worker.stop_gracefully()  # the phase is over: unstarted jobs go back
        thread.join(60)
    print(json.dumps(figures), flush=True)


# -- the coordinator -----------------------------------------------------------------


class Starts:
    """Collects the handlers' (enqueue time, start time) datagrams."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(64)
            except TimeoutError:
                continue
            self.samples.append(struct.unpack("!dd", data))

    def close(self) -> list[tuple[float, float]]:
        time.sleep(0.3)  # the last datagrams
        self._stop.set()
        self._thread.join()
        self.sock.close()
        return self.samples


def worker_command(processes: int, batch: int | None) -> list[str]:
    args = [sys.executable, str(MANAGE), "run_queue_worker", QUEUE, "-v", "0"]
    args += ["--concurrency", str(CONCURRENCY)]
    if processes > 1:
        args += ["--processes", str(processes)]
    if batch:
        args += ["--batch-size", str(batch)]
    return args


def prefill(jobs: int) -> None:
    from django_pgqueue import enqueue_many

    for start in range(0, jobs, 20_000):
        enqueue_many([(TYPE, {"t": 0})] * min(20_000, jobs - start), queue=QUEUE)


def wait_probe() -> None:
    """Enqueue a job ahead of any backlog and wait until a worker completed it."""
    from django_pgqueue import enqueue

    job = enqueue(TYPE, {"t": time.time()}, queue=QUEUE, priority=100)
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        done = sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job.id])
        if done and done[0][0] == "completed":
            return
        time.sleep(0.05)
    raise SystemExit("sustained: no worker picked up the probe job")


def sample() -> dict[str, Any]:
    dead, live = sql(
        "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relname = 'queue_job_state'"
    )[0]
    pending = sql("SELECT count(*) FROM queue_job_state WHERE status = 'pending'")[0][0]
    return {"t": time.time(), "dead_tuples": dead, "live_tuples": live, "pending": pending}


def commits() -> int:
    return sql("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0][0]


def run_phase(
    mode: str,
    rate: float,
    seconds: float,
    sizes: dict[str, float],
    *,
    backlog: int = 0,
    latency: bool = False,
    batch: int | None = None,
) -> dict[str, Any]:
    """One phase: fresh tables and processes, `rate` offered for warm-up + `seconds`."""
    truncate()
    if backlog:
        prefill(backlog)
        sql("VACUUM ANALYZE queue_job_state")
    window, warmup = sizes["window"], sizes["warmup"]
    starts = Starts() if latency else None
    total = warmup + seconds
    argv = [mode, str(rate), str(total), str(starts.port if starts else 0)]
    producer = subprocess.Popen(
        [sys.executable, __file__, "--child", *argv, *([str(batch)] if batch else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = None
    if mode != "inproc":
        worker = subprocess.Popen(
            worker_command(2 if mode == "processes2" else 1, batch), env=os.environ
        )
    try:
        assert producer.stdout
        assert producer.stdin
        if producer.stdout.readline().strip() != "ready":
            raise SystemExit("sustained: the producer did not start")
        wait_probe()
        load_before = os.getloadavg()
        go = time.time()
        producer.stdin.write("go\n")
        producer.stdin.flush()
        first = go + warmup
        time.sleep(max(0.0, first - time.time()))
        commits_before = commits()
        samples = []
        for k in range(1, round(seconds / window) + 1):
            time.sleep(max(0.0, first + k * window - time.time()))
            samples.append(sample())
        commits_after = commits()
        load_after = os.getloadavg()
        out, _ = producer.communicate(timeout=120)
        figures = json.loads(out.strip().splitlines()[-1])
    finally:
        if producer.poll() is None:
            producer.kill()
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
    measured = round(seconds / window) * window
    counts = windows(first, window, round(seconds / window))
    done = sum(counts)
    result: dict[str, Any] = {
        "offered_jobs_per_s": rate,
        "producer": figures,
        "produced_jobs_per_s": figures["jobs"] / figures["seconds"],
        "seconds": measured,
        "window_s": window,
        "completions_per_window": counts,
        "jobs_per_s": done / measured,
        "commits_per_job": (commits_after - commits_before) / done if done else None,
        "samples": samples,
        "dead_tuples_peak": max(s["dead_tuples"] for s in samples),
        "pending_at_end": samples[-1]["pending"],
        "load": {"before": load_before, "after": load_after},
        "batch_size": batch or "default",
    }
    if starts is not None:
        # Jobs enqueued after the warm-up; the latency is start minus enqueue time.
        lat = [(s - t) * 1000 for t, s in starts.close() if t >= first]
        result["latency"] = latency_figures(lat)
    return result


def windows(first: float, window: float, n: int) -> list[int]:
    """Attempts finished in each of `n` windows from epoch second `first`."""
    rows = sql(
        "SELECT floor((extract(epoch FROM finished_at) - %(t0)s) / %(w)s)::int, count(*) "
        "FROM queue_attempts WHERE status = 'succeeded' AND finished_at >= to_timestamp(%(t0)s) "
        "AND finished_at < to_timestamp(%(t1)s) GROUP BY 1",
        {"t0": first, "w": window, "t1": first + n * window},
    )
    counts = [0] * n
    for k, c in rows:
        if 0 <= k < n:
            counts[k] = c
    return counts


def latency_figures(lat: list[float]) -> dict[str, Any]:
    if not lat:
        return {"jobs": 0}
    return {
        "jobs": len(lat),
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat),
    }


def idle_phase(mode: str, jobs: int, sizes: dict[str, float]) -> dict[str, Any]:
    """Single enqueue() calls IDLE_GAP apart on an otherwise idle worker."""
    small = {**sizes, "warmup": 0.0, "window": jobs * IDLE_GAP}
    result = run_phase(mode, 1 / IDLE_GAP, jobs * IDLE_GAP, small, latency=True)
    return {
        "gap_ms": IDLE_GAP * 1000,
        "latency": result["latency"],
        "load": result["load"],
        "dead_tuples_peak": result["dead_tuples_peak"],
    }


def spread(counts: list[int]) -> dict[str, float]:
    median = statistics.median(counts)
    if not median:
        return {"median": 0, "low": -1.0, "high": -1.0, "worst": 1.0}
    low, high = min(counts) / median - 1, max(counts) / median - 1
    return {"median": median, "low": low, "high": high, "worst": max(-low, high)}


def run_mode(mode: str, sizes: dict[str, float]) -> dict[str, Any]:
    processes = 2 if mode == "processes2" else 1
    peak_s = sizes["peak"]
    backlog = int(BACKLOG_RATE * processes * (sizes["warmup"] + peak_s))
    peak = run_phase(mode, PEAK_BATCH / TICK, peak_s, sizes, backlog=backlog)
    rate = peak["jobs_per_s"]
    print(f"{mode}: peak {rate:,.0f} jobs/s", flush=True)
    overload = run_phase(mode, 2 * rate, sizes["overload"], sizes)
    overload["spread"] = spread(overload["completions_per_window"])
    print(
        f"{mode}: overload {overload['jobs_per_s']:,.0f} jobs/s, windows "
        f"{overload['completions_per_window']}",
        flush=True,
    )
    half = run_phase(mode, rate / 2, sizes["half"], sizes, latency=True)
    print(f"{mode}: half {half['latency']}", flush=True)
    idle = idle_phase(mode, int(sizes["idle_jobs"]), sizes)
    print(f"{mode}: idle {idle['latency']}", flush=True)
    return {
        "processes": processes,
        "peak": peak,
        "peak_per_process": rate / processes,
        "overload": overload,
        "half": half,
        "idle": idle,
    }


def ab_pairs(pairs: int, sizes: dict[str, float], mode: str = "inproc") -> dict[str, Any]:
    """Peak runs in `mode`, alternating --batch-size 10 (A) and the default (B)."""
    processes = 2 if mode == "processes2" else 1
    backlog = int(BACKLOG_RATE * processes * (sizes["warmup"] + sizes["peak"]))
    runs: dict[str, list[float]] = {"batch_10": [], "default": []}
    commits: dict[str, list[float]] = {"batch_10": [], "default": []}
    loads = []
    for _ in range(pairs):
        for key, batch in (("batch_10", OLD_BATCH), ("default", None)):
            r = run_phase(
                mode, PEAK_BATCH / TICK, sizes["peak"], sizes, backlog=backlog, batch=batch
            )
            runs[key].append(r["jobs_per_s"])
            commits[key].append(r["commits_per_job"])
            loads.append(r["load"]["before"][0])
            print(f"A/B {key}: {r['jobs_per_s']:,.0f} jobs/s", flush=True)
    a, b = statistics.median(runs["batch_10"]), statistics.median(runs["default"])
    return {
        "mode": mode,
        "pairs": pairs,
        "commits_per_job": commits,
        "runs": runs,
        "ratios": [y / x for x, y in zip(runs["batch_10"], runs["default"], strict=True)],
        "ratio": b / a,
        "load_1min": loads,
    }


# -- output --------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def targets(data: dict[str, Any]) -> list[list[str]]:
    """[figure, target, measured, met] for each mode."""
    rows = []
    for mode, m in data["modes"].items():
        ppp = m["peak_per_process"]
        rows.append(
            [
                f"{mode}: peak per process",
                f"≥ {TARGETS['peak_per_process']:,} jobs/s",
                f"{ppp:,.0f} jobs/s ({ppp / TARGETS['peak_per_process']:.2f}x)",
                verdict(ppp >= TARGETS["peak_per_process"]),
            ]
        )
        s = m["overload"]["spread"]
        rows.append(
            [
                f"{mode}: overload windows around the median",
                f"within ±{TARGETS['window_spread']:.0%}",
                f"{s['low']:+.0%} / {s['high']:+.0%} of {s['median']:,.0f} per "
                f"{m['overload']['window_s']:g} s",
                verdict(s["worst"] <= TARGETS["window_spread"]),
            ]
        )
        p99 = m["half"]["latency"].get("p99_ms", float("nan"))
        rows.append(
            [
                f"{mode}: pickup p99 at half the peak",
                f"≤ {TARGETS['half_p99_ms']:g} ms",
                f"{p99:.1f} ms ({p99 / TARGETS['half_p99_ms']:.2f}x)",
                verdict(p99 <= TARGETS["half_p99_ms"]),
            ]
        )
        p50 = m["idle"]["latency"].get("p50_ms", float("nan"))
        rows.append(
            [
                f"{mode}: idle pickup p50",
                f"≤ {TARGETS['idle_p50_ms']:g} ms",
                f"{p50:.2f} ms ({p50 / TARGETS['idle_p50_ms']:.2f}x)",
                verdict(p50 <= TARGETS["idle_p50_ms"]),
            ]
        )
    return rows


def table(data: dict[str, Any]) -> str:
    rows = []
    for mode, m in data["modes"].items():
        peak, over, half, idle = m["peak"], m["overload"], m["half"], m["idle"]
        lat, ilat = half["latency"], idle["latency"]
        rows.append(
            [
                mode,
                f"{peak['jobs_per_s']:,.0f} ({m['peak_per_process']:,.0f} per process)",
                f"{peak['commits_per_job']:.3f}" if peak["commits_per_job"] else "-",
                f"{over['offered_jobs_per_s']:,.0f} / {over['produced_jobs_per_s']:,.0f}",
                ", ".join(f"{c:,}" for c in over["completions_per_window"]),
                f"{over['spread']['low']:+.0%} / {over['spread']['high']:+.0%}",
                f"{lat.get('p50_ms', 0):.1f} / {lat.get('p95_ms', 0):.1f} / "
                f"{lat.get('p99_ms', 0):.1f}",
                f"{ilat.get('p50_ms', 0):.2f} / {ilat.get('p99_ms', 0):.2f}",
                f"{max(p['dead_tuples_peak'] for p in (peak, over, half)):,}",
                " / ".join(f"{p['load']['before'][0]:.1f}" for p in (peak, over, half, idle)),
            ]
        )
    headers = [
        "mode",
        "peak jobs/s",
        "commits per job at peak",
        "overload offered / produced jobs/s",
        f"completions per {data['window_s']:g} s window under overload",
        "windows vs median (min / max)",
        "pickup at half the peak, p50 / p95 / p99 ms",
        "idle pickup p50 / p99 ms",
        "dead tuples of queue_job_state, peak",
        "load (1 min) at peak / overload / half / idle",
    ]
    out = markdown_table(headers, rows) if rows else ""
    ab = data.get("ab")
    if ab:
        out += ("\n\n" if out else "") + markdown_table(
            [f"{ab.get('mode', 'inproc')} peak, alternating pairs", "jobs/s per run", "median"],
            [
                [
                    f"--batch-size {OLD_BATCH} (the former default)",
                    ", ".join(f"{v:,.0f}" for v in ab["runs"]["batch_10"]),
                    f"{statistics.median(ab['runs']['batch_10']):,.0f}",
                ],
                [
                    "default (claims follow the free slots)",
                    ", ".join(f"{v:,.0f}" for v in ab["runs"]["default"]),
                    f"{statistics.median(ab['runs']['default']):,.0f}",
                ],
                [
                    "ratio default / batch 10",
                    ", ".join(f"{r:.2f}" for r in ab["ratios"]),
                    f"{ab['ratio']:.2f}",
                ],
            ],
        )
    return out


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_sustained")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated: %(default)s")
    p.add_argument("--ab-pairs", type=int, help="A/B pairs of peak runs (default 2; smoke 1)")
    p.add_argument("--ab-mode", default="inproc", choices=MODES, help="mode of the A/B runs")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown modes: {', '.join(sorted(unknown))}")
    setup_django(args.database_url)
    sizes = {k: v[1 if args.smoke else 0] for k, v in SIZES.items()}
    data: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "runs": 1,
        "window_s": sizes["window"],
        "concurrency": CONCURRENCY,
        "targets": TARGETS,
        "autovacuum": sql("SELECT current_setting('autovacuum')")[0][0],
        "uptime_before": os.getloadavg(),
        "modes": {},
    }
    for mode in modes:
        data["modes"][mode] = run_mode(mode, sizes)
    pairs = args.ab_pairs if args.ab_pairs is not None else (1 if args.smoke else 2)
    if pairs:
        data["ab"] = ab_pairs(pairs, sizes, args.ab_mode)
    data["uptime_after"] = os.getloadavg()
    print(table(data))
    print()
    if data["modes"]:
        print(markdown_table(["figure", "target", "measured", ""], targets(data)))
    print(
        f"autovacuum = {data['autovacuum']} on this server: dead tuples of queue_job_state "
        "are what no vacuum reclaimed. Load before / after: "
        f"{data['uptime_before'][0]:.1f} / {data['uptime_after'][0]:.1f}"
    )
    print(f"results: {write_json(args.json_out, 'sustained', data)}")


if __name__ == "__main__":
    main()
