"""manage.py requeue_dead [--queue Q] [--type T] [--since 2h] [--database ALIAS] [--dry-run]."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from django_pgqueue import validators
from django_pgqueue.durations import counted, parse_duration
from django_pgqueue.maintenance import DEFAULT_REQUEUE_BATCH, requeue_dead
from django_pgqueue.management.options import (
    add_batch_options,
    add_database_option,
    database_option,
)


def parse_since(text: str) -> dt.datetime | dt.timedelta:
    """A duration back from now ('2h'), or an ISO date or date-time ('2026-11-29T03:00')."""
    try:
        return parse_duration(text)
    except ValueError:
        pass
    try:
        moment = parse_datetime(text)
        if moment is None and (day := parse_date(text)) is not None:
            moment = dt.datetime.combine(day, dt.time.min)
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(
            f"--since: {text!r} is neither a duration (2h, 1d, 30m) nor an ISO date or "
            "date-time (2026-11-29, 2026-11-29T03:00)."
        )
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


class Command(BaseCommand):
    help = (
        "Retry now every dead job matching the filters: back to pending, due now, with "
        "fresh attempts (the history is kept). The same statement as the admin's action."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", help="Only dead jobs of this queue.")
        parser.add_argument("--type", help="Only dead jobs of this type (task name).")
        parser.add_argument(
            "--since",
            help="Only jobs that died since then: a duration back from now (2h, 1d) or an "
            "ISO date or date-time.",
        )
        add_batch_options(
            parser,
            DEFAULT_REQUEUE_BATCH,
            "Jobs retried per statement",
            "Count the matching dead jobs; change nothing.",
        )
        add_database_option(parser, "Only the dead jobs of this database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        queue, type_ = options["queue"], options["type"]
        if queue is not None:
            validators.queue_name(queue, "--queue:", error=CommandError)
        if type_ is not None:
            validators.type_name(type_, "--type:", error=CommandError)
        since = parse_since(options["since"]) if options["since"] else None
        validators.count(options["batch_size"], "--batch-size", error=CommandError)
        databases = database_option(options["database"])
        for alias in databases:
            matched, report = requeue_dead(
                queue=queue,
                type=type_,
                since=since,
                batch_size=options["batch_size"],
                dry_run=options["dry_run"],
                alias=alias,
            )
            # Each database reported on its own line once queues live on several.
            where = f"{alias}: " if len(databases) > 1 or options["database"] else ""
            if options["dry_run"]:
                verb = "matches" if matched == 1 else "match"
                self.stdout.write(
                    f"{where}Dry run: {counted(matched, 'dead job')} {verb}; nothing was changed."
                )
            else:
                self.stdout.write(
                    f"{where}{counted(matched, 'dead job')} matched. {report.message()}"
                )
