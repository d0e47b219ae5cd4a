"""manage.py prune_queue_jobs --older-than 7d [--status S] [--database ALIAS] [--dry-run]."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgqueue import validators
from django_pgqueue.durations import counted, parse_duration
from django_pgqueue.maintenance import DEFAULT_PRUNE_BATCH, check_prunable, prune
from django_pgqueue.management.options import (
    add_batch_options,
    add_database_option,
    database_option,
)
from django_pgqueue.models import FINISHED_STATUSES


class Command(BaseCommand):
    help = (
        "Delete finished jobs (completed, dead, cancelled) that finished longer ago than "
        "--older-than, with their state and attempts, in short batches. Pending and "
        "running jobs are never deleted; a workflow's or a batch's jobs go together, "
        "once all of them qualify."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="AGE",
            help=(
                "Delete jobs that finished longer ago than this: 7d, 12h, 30m, 90s, 1h30m; "
                "0s deletes every finished job."
            ),
        )
        parser.add_argument(
            "--status",
            action="append",
            default=[],
            metavar="STATUS",
            help=(
                "Only jobs in this finished status; repeat it or separate with commas "
                f"(default: {', '.join(FINISHED_STATUSES)})."
            ),
        )
        add_batch_options(
            parser,
            DEFAULT_PRUNE_BATCH,
            "Most jobs one DELETE removes (a larger workflow or batch goes whole, alone)",
            "Count what would be deleted; delete nothing.",
        )
        add_database_option(parser, "Only prune the jobs of this database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            older_than = parse_duration(options["older_than"], allow_zero=True)
        except ValueError as exc:
            raise CommandError(f"--older-than: {exc}") from None
        statuses = [s.strip() for arg in options["status"] for s in arg.split(",") if s.strip()]
        try:
            statuses = check_prunable(statuses)
        except ValueError as exc:
            raise CommandError(f"--status: {exc}") from None
        validators.count(options["batch_size"], "--batch-size", error=CommandError)

        def progress(count: int) -> None:
            if options["verbosity"] >= 2:
                self.stdout.write(f"  deleted a batch of {counted(count, 'job')}")

        databases = database_option(options["database"])
        for alias in databases:
            # Each database reported on its own line once queues live on several.
            where = f"{alias}: " if len(databases) > 1 or options["database"] else ""
            self._prune(alias, where, older_than, statuses, options, progress)

    def _prune(
        self,
        alias: str,
        where: str,
        older_than: dt.timedelta,
        statuses: list[str],
        options: dict[str, Any],
        progress: Callable[[int], None],
    ) -> None:
        result = prune(
            older_than,
            statuses=statuses,
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
            on_batch=progress,
            alias=alias,
        )
        by_status = ", ".join(f"{s}: {result.jobs.get(s, 0)}" for s in result.statuses)
        cutoff = result.cutoff.isoformat(sep=" ", timespec="seconds")
        if result.dry_run:
            self.stdout.write(
                f"{where}Dry run: would delete {counted(result.total, 'job')} that finished "
                f"before {cutoff} "
                f"({by_status})"
                + (
                    f" and {counted(result.events, 'event')} emitted before it"
                    if result.events
                    else ""
                )
                + ". Nothing was deleted."
            )
        else:
            self.stdout.write(
                f"{where}Deleted {counted(result.total, 'job')} that finished before {cutoff} "
                f"({by_status}) in {counted(len(result.batches), 'batch', 'batches')} of at "
                f"most {options['batch_size']}."
                + (
                    f" Deleted {counted(result.workflows, 'workflow')} whose steps were all gone."
                    if result.workflows
                    else ""
                )
                + (
                    f" Deleted {counted(result.batches_deleted, 'batch', 'batches')} (batch() "
                    "rows) whose members and callbacks were all gone."
                    if result.batches_deleted
                    else ""
                )
                + (
                    f" Deleted {counted(result.sequences, 'sequence')} with no job left (rows)."
                    if result.sequences
                    else ""
                )
                + (
                    f" Deleted {counted(result.events, 'event')} emitted before {cutoff}."
                    if result.events
                    else ""
                )
            )
