"""Durable steps side by side with DBOS Transact (and django-absurd where it installs).

The same workloads for each system, interleaved run by run (ours, DBOS, django-absurd,
ours, ...), medians of --runs:

- drain: --runs-of-five runs (1,000) of five no-op steps each, drained by one worker
  process at a worker concurrency of --concurrency (8): ours `run_queue_worker --burst
  --concurrency 8` on the handler `bench.durable_five` (testproject/qa/durable_jobs.py);
  DBOS a workflow of five `@DBOS.step` calls on a queue of `worker_concurrency` 8,
  at its default queue polling interval (1 s) and at 0.05 s; runs/s and steps/s, timed
  on each system's own clock from the first run's start to the last run's end, and
  checked in its tables (every run done once, five checkpoints each);
- a step's cost over a plain call: one run of --overhead-steps (1,000) no-op steps in a
  real worker (ours, django-absurd) or a launched DBOS process, µs per step minus µs per
  plain call of the same function, timed inside the run; ours beside its floor, a bare
  INSERT of a checkpoint's row in its own autocommit transaction on the same connection,
  alternating with the steps. A step is a commit: on a disk whose WAL flush takes
  milliseconds, that is the figure; so each system's step is also timed with
  synchronous_commit = off (PGOPTIONS on every connection of that run), what it costs
  besides the flush;
- kill to resume: a run of five steps whose third step hangs on its first run; its
  worker is SIGKILLed there and a new worker started at once; seconds from the kill to
  the third step starting again. Ours is taken back when its lease runs out (workers
  here: --lease 2, heartbeat 0.5 s, sweep 0.5 s: the figure is about the lease; at the
  default LEASE of 30 s it is about 30 s). DBOS recovers the pending workflows of its
  executor id when a process with that id launches: at once, but only on a restart of
  that executor (another executor needs an operator or DBOS Conductor to take them).

Every system uses its own database on the same PostgreSQL: ours the --database-url one,
the peers the same name with _dbos or _django_absurd appended. The peers are installed,
pinned, into their own virtual environments (benchmarks/_peer_env.py) and driven by
benchmarks/peers/NAME_driver.py; one that does not install is reported as skipped, with
the reason, in the JSON and the table.

Targets: our steps/s >= 10x DBOS's (its faster polling setting), a step's overhead
<= 1 ms.

Run: python benchmarks/durable.py [--smoke] [--runs 3] [--runs-of-five 1000]
         [--concurrency 8] [--peers dbos]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import MANAGE, machine, markdown_table, parser, setup_django, sql, truncate, write_json
from _peer_env import DURABLE_PEERS, Peer, PeerFailed, call, prepare

OURS = "django-pgqueue"
QUEUE = "bench"
STEPS = 5
KILL_LEASE = ("--lease", "2", "--heartbeat-interval", "0.5", "--sweep-interval", "0.5")
DBOS_POLLING = {"dbos": 1.0, "dbos (0.05 s polling)": 0.05}
# (key, label, unit, higher is better)
FIGURES = (
    ("runs_per_s", "runs of 5 steps / s", "runs/s", True),
    ("steps_per_s", "steps / s", "steps/s", True),
    ("overhead_us", "a step's cost over a plain call", "µs", False),
    ("bare_insert_us", "floor: a bare INSERT of a checkpoint's row, autocommit", "µs", False),
    (
        "overhead_nosync_us",
        "a step's cost over a plain call, synchronous_commit = off",
        "µs",
        False,
    ),
    ("kill_resume_s", "SIGKILL of the worker to the run resuming", "s", False),
)
STEPS_TARGET = 10.0  # ours / DBOS, steps/s
OVERHEAD_TARGET_US = 1000.0


def sizes(smoke: bool, runs_of_five: int, overhead_steps: int) -> dict[str, int]:
    if smoke:
        return {"runs_of_five": 40, "overhead_steps": 100}
    return {"runs_of_five": runs_of_five, "overhead_steps": overhead_steps}


# -- ours -------------------------------------------------------------------------------


def worker(concurrency: int, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, str(MANAGE), "run_queue_worker", QUEUE, "-v", "0"]
    command += ["--concurrency", str(concurrency), *extra]
    return subprocess.Popen(command, env=os.environ)


def burst(concurrency: int) -> None:
    process = worker(concurrency, "--burst")
    if process.wait(900) != 0:
        raise SystemExit(f"worker exited with {process.returncode}")


def ours_drain(n: int, concurrency: int) -> dict[str, float]:
    from django_pgqueue import enqueue_many

    truncate()
    enqueue_many([("bench.durable_five", None)] * n, queue=QUEUE)
    sql("VACUUM ANALYZE queue_job_state")
    burst(concurrency)
    ((attempts, succeeded, seconds),) = sql(
        "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'),"
        " extract(epoch FROM max(finished_at) - min(started_at)) FROM queue_attempts"
    )
    ((steps, distinct),) = sql("SELECT count(*), count(DISTINCT job_id) FROM queue_job_steps")
    if not (attempts == succeeded == distinct == n and steps == n * STEPS):
        raise SystemExit(
            f"durable drain check failed: {n} runs, {attempts} attempts, {succeeded} "
            f"succeeded, {steps} checkpoints of {distinct} runs"
        )
    seconds = float(seconds)
    return {"runs_per_s": n / seconds, "steps_per_s": n * STEPS / seconds, "seconds": seconds}


def _result(job_id: int) -> Any:
    rows = sql(
        "SELECT result FROM queue_attempts WHERE job_id = %s AND status = 'succeeded'", [job_id]
    )
    if not rows:
        raise SystemExit(f"job #{job_id} did not succeed")
    result = rows[0][0]
    return json.loads(result) if isinstance(result, str) else result


def ours_overhead(n: int, concurrency: int) -> dict[str, float]:
    from django_pgqueue import enqueue

    truncate()
    enqueue("bench.durable_overhead", {"n": max(1, n // 10)}, queue=QUEUE)  # warm-up
    job = enqueue("bench.durable_overhead", {"n": n}, queue=QUEUE)
    burst(concurrency)
    result = _result(job.id)
    return {**result, "overhead_us": result["step_us"] - result["plain_us"]}


def ours_kill_resume(concurrency: int) -> dict[str, float]:
    from django_pgqueue import enqueue

    truncate()
    ready = Path(tempfile.mkdtemp(prefix="durable-bench-")) / "ready"
    job = enqueue("bench.durable_resumable", {"ready": str(ready)}, queue=QUEUE)
    first = worker(concurrency, *KILL_LEASE)
    second = None
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if time.monotonic() > deadline or first.poll() is not None:
                raise SystemExit("kill_resume: the run never reached its third step")
            time.sleep(0.01)
        killed = time.time()
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        second = worker(concurrency, *KILL_LEASE)
        deadline = time.monotonic() + 120
        while not sql(
            "SELECT 1 FROM queue_job_state WHERE job_id = %s AND status = 'completed'", [job.id]
        ):
            if time.monotonic() > deadline:
                raise SystemExit("kill_resume: the run did not finish within 120 s")
            time.sleep(0.05)
        return {"seconds": float(_result(job.id)) - killed}
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(60)
        ready.unlink(missing_ok=True)
        ready.parent.rmdir()


@contextmanager
def without_commit_flush() -> Iterator[None]:
    """Every connection opened meanwhile (the workers', the peers' drivers') commits
    without waiting for the WAL flush: what a step costs besides the disk."""
    os.environ["PGOPTIONS"] = "-c synchronous_commit=off"
    try:
        yield
    finally:
        del os.environ["PGOPTIONS"]


def no_flush(measure: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        with without_commit_flush():
            return measure()

    return run


def ours(size: dict[str, int], concurrency: int) -> dict[str, Callable[[], dict[str, float]]]:
    overhead = lambda: ours_overhead(size["overhead_steps"], concurrency)  # noqa: E731
    return {
        "drain": lambda: ours_drain(size["runs_of_five"], concurrency),
        "overhead": overhead,
        "overhead_nosync": no_flush(overhead),
        "kill_resume": lambda: ours_kill_resume(concurrency),
    }


# -- the peers --------------------------------------------------------------------------


def theirs(
    peer: Peer, url: str, size: dict[str, int], concurrency: int, polling: float | None
) -> dict[str, Callable[[], dict[str, Any]]]:
    """The peer's side of each workload, one driver command each (`polling`: DBOS's
    queue polling interval; the drain alone depends on it)."""
    common = {"url": url, "concurrency": concurrency}
    if polling is not None:
        common["polling"] = polling

    def kill_resume() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="durable-bench-") as tmp:
            return call(peer, "kill_resume", **common, ready=str(Path(tmp) / "ready"))

    workloads: dict[str, Callable[[], dict[str, Any]]] = {
        "drain": lambda: call(peer, "drain", **common, n=size["runs_of_five"]),
    }
    if polling is None or polling == min(DBOS_POLLING.values()):
        workloads["overhead"] = lambda: call(
            peer, "step_overhead", url=url, n=size["overhead_steps"]
        )
        workloads["overhead_nosync"] = no_flush(workloads["overhead"])
        workloads["kill_resume"] = kill_resume
    return workloads


def systems_of(
    size: dict[str, int], concurrency: int, runners: dict[str, tuple[Peer, str]]
) -> dict[str, dict[str, Callable[[], dict[str, Any]]]]:
    systems = {OURS: ours(size, concurrency)}
    for name, (peer, peer_url) in runners.items():
        if name == "dbos":
            for label, polling in DBOS_POLLING.items():
                systems[label] = theirs(peer, peer_url, size, concurrency, polling)
        else:
            systems[name] = theirs(peer, peer_url, size, concurrency, None)
    return systems


def measure(
    runs: int,
    systems: dict[str, dict[str, Callable[[], dict[str, Any]]]],
    failed: dict[str, dict[str, str]],
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every workload, every run, systems interleaved; a peer's failing workload is dropped."""
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in systems}
    for workload in ("overhead", "overhead_nosync", "drain", "kill_resume"):
        for run in range(runs):
            for name, workloads in systems.items():
                if workload not in workloads or workload in failed.get(name, {}):
                    continue
                try:
                    sample = workloads[workload]()
                except PeerFailed as exc:
                    failed.setdefault(name, {})[workload] = str(exc)
                    samples[name].pop(workload, None)
                    print(f"durable: dropping {name}'s {workload}: {exc}", flush=True)
                    continue
                samples[name].setdefault(workload, []).append(sample)
                shown = ", ".join(f"{k} {v:,.2f}" for k, v in sample.items())
                print(f"{workload} run {run + 1}: {name}: {shown}", flush=True)
    return samples


def figures(samples: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Median of each figure per system: {figure: {system: {"value", "runs"}}}."""
    fields = {
        "runs_per_s": ("drain", "runs_per_s"),
        "steps_per_s": ("drain", "steps_per_s"),
        "overhead_us": ("overhead", "overhead_us"),
        "bare_insert_us": ("overhead", "bare_insert_us"),
        "overhead_nosync_us": ("overhead_nosync", "overhead_us"),
        "kill_resume_s": ("kill_resume", "seconds"),
    }
    out: dict[str, Any] = {}
    for key, (workload, field) in fields.items():
        out[key] = {}
        for name, by_workload in samples.items():
            values = [s[field] for s in by_workload.get(workload, []) if field in s]
            if values:
                out[key][name] = {"value": statistics.median(values), "runs": values}
    return out


def value_text(entry: dict[str, Any] | None, unit: str) -> str:
    if not entry:
        return "-"
    value = entry["value"]
    return f"{value:,.2f} {unit}" if unit == "s" else f"{value:,.0f} {unit}"


def table(results: dict[str, Any]) -> str:
    names = list(results["systems"])
    rows = []
    for key, label, unit, higher in FIGURES:
        figure = results["figures"].get(key, {})
        note = "" if higher else " (lower is better)"
        rows.append([f"{label}{note}", *(value_text(figure.get(n), unit) for n in names)])
    skipped = [
        f"{name} {p['version']}: skipped ({p['skipped']})"
        for name, p in results["peers"].items()
        if "skipped" in p
    ]
    text = markdown_table(["figure", *names], rows)
    return text + ("\n\n" + "; ".join(skipped) if skipped else "")


def round_ratios(results: dict[str, Any]) -> list[float]:
    """Our steps/s over DBOS's faster setting's, drain by drain (the same round: the
    machine's rate drifts more between minutes than between neighbours)."""
    ours = [s["steps_per_s"] for s in results["samples"].get(OURS, {}).get("drain", [])]
    theirs = [
        [s["steps_per_s"] for s in results["samples"].get(name, {}).get("drain", [])]
        for name in DBOS_POLLING
    ]
    best = [max(values) for values in zip(*theirs, strict=False)] if all(theirs) else []
    return [mine / other for mine, other in zip(ours, best, strict=False)]


def targets(results: dict[str, Any]) -> list[list[str]]:
    """The targets: [figure, wanted, measured, met]."""
    rows = []
    steps = results["figures"].get("steps_per_s", {})
    dbos = [steps[name]["value"] for name in DBOS_POLLING if name in steps]
    if OURS in steps and dbos:
        ratio = steps[OURS]["value"] / max(dbos)
        ratios = round_ratios(results)
        each = ", ".join(f"{r:.1f}x" for r in ratios)
        rows.append(
            [
                "steps/s, ours / DBOS (its faster setting)",
                f"≥ {STEPS_TARGET:g}x",
                f"{steps[OURS]['value']:,.0f} / {max(dbos):,.0f} = {ratio:.1f}x (drain by "
                f"drain: {each})",
                "met" if ratio >= STEPS_TARGET else "**missed**",
            ]
        )
    overhead = results["figures"].get("overhead_us", {}).get(OURS)
    if overhead:
        value = overhead["value"]
        rows.append(
            [
                "a step's cost over a plain call (ours)",
                f"≤ {OVERHEAD_TARGET_US:,.0f} µs",
                f"{value:,.0f} µs",
                "met" if value <= OVERHEAD_TARGET_US else "**missed**",
            ]
        )
        for workload, how in (("overhead", ""), ("overhead_nosync", ", synchronous_commit = off")):
            runs = results["samples"].get(OURS, {}).get(workload, [])
            above = [run["overhead_us"] - run["bare_insert_us"] for run in runs]
            if not above:
                continue
            each = ", ".join(f"{value:,.0f}" for value in above)
            rows.append(
                [
                    f"a step's cost less its floor (a bare INSERT of the row and its commit, "
                    f"alternating with the steps){how}: what the package adds",
                    "(to read the line above)",
                    f"{statistics.median(above):,.0f} µs (run by run: {each})",
                    "",
                ]
            )
    return rows


def section(results: dict[str, Any]) -> str:
    """The README's results: the setup, the figures, the targets."""
    m = results["machine"]
    peers = "; ".join(
        f"{name} {p['version']} ({', '.join(p['requirements'])})"
        + (f": skipped ({p['skipped']})" if "skipped" in p else "")
        for name, p in results["peers"].items()
    )
    size = results["sizes"]
    load = f"{results['load_before'][0]:.1f} → {results['load_after'][0]:.1f}"
    return "\n".join(
        [
            f"Commit `{m['commit']}`, {m['cpus']} CPUs, PostgreSQL {m['postgresql']} "
            f"(synchronous_commit {m['pg_settings'].get('synchronous_commit')}), yardstick "
            f"{m.get('calibration_ms', float('nan')):.0f} ms, load average {load}; {peers}. "
            f"Drains of {size['runs_of_five']:,} runs of 5 no-op steps, one worker process "
            f"at concurrency {results['concurrency']}; a step's cost from one run of "
            f"{size['overhead_steps']:,} steps; median of {results['runs']}, systems "
            "interleaved.",
            "",
            table(results),
            "",
            markdown_table(["target", "wanted", "measured", ""], targets(results)),
            "",
        ]
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_durable")
    p.add_argument("--runs-of-five", type=int, default=1_000, help="runs per drain")
    p.add_argument("--overhead-steps", type=int, default=1_000, help="steps of the cost run")
    p.add_argument("--concurrency", type=int, default=8, help="worker concurrency, every system")
    p.add_argument("--peers", help="comma-separated peers to run (default: all)")
    args = p.parse_args()
    setup_django(args.database_url)
    runs = 1 if args.smoke else args.runs
    size = sizes(args.smoke, args.runs_of_five, args.overhead_steps)
    results: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "runs": runs,
        "sizes": size,
        "concurrency": args.concurrency,
        "kill_resume_worker": list(KILL_LEASE),
        "load_before": os.getloadavg(),
    }
    results["peers"], runners = prepare(DURABLE_PEERS, args.database_url, args.peers, "durable")
    systems = systems_of(size, args.concurrency, runners)
    results["systems"] = list(systems)
    failed: dict[str, dict[str, str]] = {}
    samples = measure(runs, systems, failed)
    for name, workloads in failed.items():
        results["peers"].get(name.split(" ")[0], {}).setdefault("failed", {}).update(workloads)
    results["figures"] = figures(samples)
    results["samples"] = samples
    results["load_after"] = os.getloadavg()
    print(section(results))
    print(f"results: {write_json(args.json_out, 'durable', results)}")


if __name__ == "__main__":
    sys.exit(main())
