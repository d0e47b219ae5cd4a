"""manage.py queue_stats [--json] [--exact] [--database ALIAS]: the admin's figures, per queue.

With PGQUEUE["QUEUE_DATABASES"], every queue database is read (or the one --database
names): the table gains a database column, the JSON a section per database.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_pgqueue import stats
from django_pgqueue.conf import get_settings
from django_pgqueue.durations import format_seconds
from django_pgqueue.management.options import add_database_option, database_option
from django_pgqueue.observability.workers import WorkerInfo, list_workers
from django_pgqueue.overview import Overview, collect_all
from django_pgqueue.stats import QueueFigures, Stranded, stranded_jobs

COLUMNS = (
    ("queue", "queue"),
    ("pending", "pending"),
    ("due", "due"),
    ("running", "running"),
    ("expired_leases", "expired leases"),
    ("dead", "dead"),
    ("cancelled", "cancelled"),
    ("waiting", "waiting"),
    ("sleeping", "sleeping"),
    ("awaiting_event", "awaiting event"),
    ("completed", "completed"),
    ("oldest_due_seconds", "oldest due"),
)
COMPLETED = [key for key, _ in COLUMNS].index("completed")
FOOTNOTES = {
    "~": "estimated from the table statistics; --exact counts them.",
    "—": "not estimated per queue, nor before the table is first analyzed; --exact counts them.",
}


class Command(BaseCommand):
    help = (
        "Show the job counts of every queue by status, the running jobs whose lease "
        "expired, and how long the oldest due pending job has waited."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
        parser.add_argument(
            "--exact",
            action="store_true",
            help="Count completed jobs exactly (reads the whole table) instead of estimating.",
        )
        add_database_option(parser, "Only the queues of this database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        conf = get_settings()
        databases = database_option(options["database"])
        snapshot = collect_all(databases, exact=options["exact"])
        # The database column shows once queues can live on more than one database.
        several = bool(options["database"]) or len(conf.queue_databases) > 1
        registered: list[WorkerInfo] = []
        stranded: list[Stranded] = []
        for reading in snapshot.readings:
            if not reading.up:
                continue
            workers = list_workers(reading.read_from, database=reading.alias)
            served = {queue for worker in workers if worker.alive for queue in worker.queues}
            registered += workers
            stranded += stranded_jobs(reading.read_from, served)
        if options["json"]:
            data = snapshot.as_dict()
            data["workers"] = [worker.as_dict() for worker in registered]
            data["stranded"] = [vars(item) for item in stranded]
            self.stdout.write(json.dumps(data, indent=2))
            return
        self._table(snapshot, several)
        for reading in snapshot.readings:
            if not reading.up:
                self.stderr.write(f"database {reading.alias}: not read: {reading.error}")
        if stranded:  # a block of its own, after the table's
            self.stdout.write("")
        for item in stranded:
            self.stdout.write(self.style.WARNING(_stranded_line(item)))
        self._workers(registered)

    def _table(self, snapshot: Overview, several: bool) -> None:
        completed_mark = "" if snapshot.completed_exact else "~"
        rows = [_row(figures, completed_mark) for figures in [*snapshot.queues, snapshot.totals]]
        header = [title for _, title in COLUMNS]
        completed = COMPLETED
        if several:  # the alias of each queue's database, first
            header = ["database", *header]
            rows = [
                [figures.database, *row]
                for figures, row in zip([*snapshot.queues, snapshot.totals], rows, strict=True)
            ]
            completed += 1
        columns = zip(header, *rows, strict=True)
        widths = [max(len(cell) for cell in column) for column in columns]

        lead = 2 if several else 1  # the names, left-aligned; the figures, right-aligned

        def line(cells: list[str]) -> str:
            names = (cell.ljust(width) for cell, width in zip(cells[:lead], widths, strict=False))
            rest = (
                cell.rjust(width) for cell, width in zip(cells[lead:], widths[lead:], strict=True)
            )
            return "  ".join([*names, *rest])

        self.stdout.write(line(header))
        for index, row in enumerate(rows):
            if index == len(rows) - 1:
                self.stdout.write("  ".join("-" * width for width in widths))
            self.stdout.write(line(row))
        # A footnote for each mark the completed column shows, and only for those.
        marks = {row[completed][0] for row in rows if row[completed][0] in FOOTNOTES}
        for mark, note in FOOTNOTES.items():
            if mark in marks:
                self.stdout.write(f"{mark} completed: {note}")
        if snapshot.totals.capped:
            self.stdout.write(
                f"+ at least: counting stops at {stats.COUNT_CAP} jobs per queue and status; "
                "--exact counts them all."
            )
        for late in snapshot.late_schedules:
            self.stdout.write(
                f"late schedule {late.name} (queue {late.queue}): due "
                f"{format_seconds(late.late_seconds)} ago, not fired"
            )

    def _workers(self, registered: list[WorkerInfo]) -> None:
        """List the registered workers, alive first, with the jobs each runs."""
        alive = sum(1 for worker in registered if worker.alive)
        self.stdout.write("")
        self.stdout.write(f"workers: {alive} alive, {len(registered) - alive} gone")
        for worker in registered:
            state = "alive" if worker.alive else "gone "
            jobs = ", ".join(f"#{job.job_id} {job.type}" for job in worker.jobs[:10])
            more = f" (+{len(worker.jobs) - 10} more)" if len(worker.jobs) > 10 else ""
            self.stdout.write(
                f"  {state}  {worker.id}  queues={','.join(worker.queues)}  "
                f"running={worker.running}/{worker.concurrency}  "
                f"seen {format_seconds(worker.seen_seconds_ago)} ago"
                + (f"  jobs: {jobs}{more}" if jobs else "")
            )


def _stranded_line(item: Stranded) -> str:
    why = []
    if item.unknown_type:
        why.append("no handler or task in this project knows its type")
    if item.unserved_queue:
        why.append("no live worker serves its queue")
    jobs = f"{item.jobs}+" if item.at_least else str(item.jobs)  # "+": more not read
    where = f"{jobs} pending {item.type} job(s) in queue {item.queue}"
    return f"stranded: {where}: {' and '.join(why)}"


def _row(figures: QueueFigures, completed_mark: str) -> list[str]:
    cells = []
    for key, _ in COLUMNS:
        value = getattr(figures, key)
        if key == "queue":
            cells.append(value)
        elif key == "oldest_due_seconds":
            cells.append(format_seconds(value))
        elif key == "completed":
            cells.append("—" if value is None else f"{completed_mark}{value}")
        else:
            capped = getattr(figures, f"{key}_capped", False)
            cells.append(f"{value}+" if capped else str(value))  # at least that many
    return cells
