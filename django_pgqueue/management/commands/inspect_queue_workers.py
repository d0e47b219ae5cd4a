"""manage.py inspect_queue_workers [WORKER ...] [--json] [--all]: what each live worker
and each of its processes runs, has claimed, serves, registered, counted, uses and is.

Read from the worker registry, where each process writes its report at every beat
(`django_pgqueue.observability.fleet`): no worker is asked anything, and the answer is
at most one beat old (its age is shown).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError

from django_pgqueue.conf import get_settings
from django_pgqueue.control import api as control
from django_pgqueue.management.options import add_database_option, database_option
from django_pgqueue.observability import fleet
from django_pgqueue.observability.workers import WorkerInfo, list_workers


def read_workers(databases: list[str], *, with_gone: bool) -> list[fleet.Worker]:
    """The registered workers of `databases`, grouped (`fleet.group`); the gone ones
    only with `with_gone`."""
    conf = get_settings()
    processes: list[WorkerInfo] = []
    for alias in databases:
        processes += list_workers(conf.read_database(alias), with_jobs=False, database=alias)
    workers = fleet.group(processes)
    return workers if with_gone else [w for w in workers if w.alive]


def queue_limits(databases: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each queue's controls (pause, limits), by (database, queue); none if unread."""
    limits = {}
    for alias in databases:
        try:
            rows = control.queue_controls(alias=alias)
        except DatabaseError:
            continue
        for row in rows:
            limits[(alias, row["queue"])] = row
    return limits


def job_line(job: dict[str, Any], seen: dt.datetime, running: bool) -> str:
    """One job of a report: id, type, queue, attempt, and since when it runs."""
    line = (
        f"#{job['job_id']} {job['type']} on {job['queue']}, "
        f"attempt {job['attempt']}/{job['max_attempts']}"
    )
    if running:
        since = seen - dt.timedelta(seconds=job["running_seconds"])
        line += f", running {job['running_seconds']:.1f}s (since {since:%H:%M:%S})"
    return line


def mebibytes(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**20:.1f} MiB"


class Command(BaseCommand):
    help = (
        "Show what each live worker and each of its processes runs now, has claimed and "
        "not started, the queues it serves (weights, limits), the handlers it registered, "
        "its counters, memory and code (as of its last beat)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "workers", nargs="*", metavar="WORKER", help="Only these workers (id or prefix)."
        )
        parser.add_argument("--json", action="store_true", help="Print it as JSON.")
        parser.add_argument("--all", action="store_true", help="Gone workers too.")
        add_database_option(parser, "Only the workers of this database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        databases = database_option(options["database"])
        workers = read_workers(databases, with_gone=options["all"])
        if options["workers"]:
            wanted = options["workers"]
            workers = [
                w
                for w in workers
                if any(w.id.startswith(name) or _has_process(w, name) for name in wanted)
            ]
        limits = queue_limits(databases)
        if options["json"]:
            data = []
            for worker in workers:
                entry = worker.as_dict()
                entry["queue_controls"] = {
                    queue: limits.get((worker.database, queue)) for queue in worker.queues
                }
                data.append(entry)
            self.stdout.write(json.dumps({"workers": data}, indent=2, default=str))
            return
        if not workers:
            self.stdout.write(
                "No live worker." + ("" if options["all"] else " (--all: gone ones too)")
            )
            return
        for worker in workers:
            self._worker(worker, limits)

    def _worker(self, worker: fleet.Worker, limits: dict[tuple[str, str], dict[str, Any]]) -> None:
        out = self.stdout.write
        kind = (
            f"supervisor of {len(worker.live)} live process(es)"
            if worker.supervised
            else "one process"
        )
        state = "alive" if worker.alive else "gone"
        if worker.draining:
            state += ", draining"
        out(self.style.MIGRATE_HEADING(f"worker {worker.id} ({kind}) on {worker.host}: {state}"))
        out(
            f"  running {worker.running}/{worker.concurrency}, claimed not started "
            f"{worker.claimed}; processed {worker.processed}, failed {worker.failed}; "
            f"version {', '.join(worker.versions)}, code {', '.join(worker.codes) or '?'}"
        )
        for queue in worker.queues:
            controls = limits.get((worker.database, queue))
            out(f"  queue {queue}: {_queue_line(queue, worker, controls)}")
        for process in worker.processes:
            self._process(process)

    def _process(self, process: WorkerInfo) -> None:
        out = self.stdout.write
        report = process.report or {}
        state = "alive" if process.alive else "gone"
        if report.get("draining"):
            state += ", draining"
        if report.get("stopping"):
            state += ", stopping"
        out(
            f"  process {process.id} (pid {process.pid}): {state}, seen {process.seen_ago} ago, "
            f"rss {mebibytes(report.get('rss_bytes'))}"
        )
        if not report:
            out("    (no report: a worker of an older version)")
            return
        out(
            f"    running {report['running_count']}/{report['concurrency']}, "
            f"claimed not started {report['claimed_count']}, counters "
            + (", ".join(f"{k}={v}" for k, v in sorted(report["counters"].items())) or "none")
        )
        for job in report["running"]:
            out("    running " + job_line(job, process.last_seen_at, True))
        for job in report["claimed"]:
            out("    claimed " + job_line(job, process.last_seen_at, False))
        out(f"    handlers: {', '.join(report['handlers']) or 'none'}")
        out(f"    version {report['version']}, code {report['code']}, python {report['python']}")


def _has_process(worker: fleet.Worker, name: str) -> bool:
    return any(p.id.startswith(name) for p in worker.processes)


def _queue_line(queue: str, worker: fleet.Worker, controls: dict[str, Any] | None) -> str:
    weights = {
        q["name"]: q["weight"]
        for p in worker.live or worker.processes
        for q in (p.report or {}).get("queues", [])
    }
    parts = [f"weight {weights.get(queue, 1)}"]
    if controls:
        if controls.get("paused"):
            parts.append("PAUSED")
        if controls.get("concurrency_limit") is not None:
            parts.append(f"limit {controls['concurrency_limit']}")
        if controls.get("key_limit") is not None:
            parts.append(f"key limit {controls['key_limit']}")
        if controls.get("rate_count") is not None:
            parts.append(f"rate {controls['rate_count']}/{controls['rate_period']:g}s")
    if len(parts) == 1:
        parts.append("no limits")
    return ", ".join(parts)
