"""manage.py queue_control pause|resume|limit|key-limit|rate|show [QUEUE] [VALUE] [--type T]."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgqueue.control import api
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.limits import describe_type

ACTIONS = ("pause", "resume", "limit", "key-limit", "rate", "show")
NONE = ("none", "off", "-")


def _limit(value: str | None, what: str) -> int | None:
    if value is None:
        raise CommandError(f"{what}: give a number, or 'none' to remove the limit.")
    if value.lower() in NONE:
        return None
    try:
        return int(value)
    except ValueError:
        raise CommandError(f"{what}: expected a whole number or 'none', got {value!r}.") from None


def describe(row: dict[str, Any]) -> str:
    """One line for a queue's controls."""
    rate = "-"
    if row.get("rate_count") is not None:
        rate = f"{row['rate_count']}/{row['rate_period']:g}s"
    limit = "-" if row.get("concurrency_limit") is None else row["concurrency_limit"]
    parts = [
        f"{row['queue']}:",
        "PAUSED" if row["paused"] else "active",
        f"limit={limit}",
        f"key_limit={row['key_limit']}",
        f"rate={rate}",
    ]
    if "running" in row:
        parts.append(f"running={row['running']}")
    lines = [" ".join(parts)]
    for limits in row.get("types", []):
        lines.append(f"  {describe_type(limits)}")
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Pause or resume a queue, or set its limits at run time (every worker follows "
        "within one poll interval); show lists every controlled queue."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS, help="What to do.")
        parser.add_argument("queue", nargs="?", help="The queue (show: all if omitted).")
        parser.add_argument(
            "value",
            nargs="?",
            help="limit and key-limit: a number ('none' removes a limit); rate: '100/s', "
            "'5/m', '10/2.5s' or 'none'.",
        )
        parser.add_argument(
            "--type",
            dest="job_type",
            help="key-limit and rate: set them for this job type's jobs in the queue "
            "('none' falls back to the queue's key limit, or removes the type's rate).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action, queue, value = options["action"], options["queue"], options["value"]
        job_type = options.get("job_type")
        if job_type is not None and action not in ("key-limit", "rate"):
            raise CommandError(f"--type applies to key-limit and rate, not {action}.")
        if action == "show":
            rows = api.queue_controls()
            rows = [row for row in rows if queue is None or row["queue"] == queue]
            for row in rows:
                self.stdout.write(describe(row))
            if not rows:
                self.stdout.write("no controlled queue" + (f" named {queue!r}" if queue else ""))
            return
        if queue is None:
            raise CommandError(f"{action}: give the queue's name.")
        if action in ("pause", "resume") and value is not None:
            raise CommandError(f"{action} takes no value, got {value!r}.")
        try:
            if action == "pause":
                row = api.pause_queue(queue)
            elif action == "resume":
                row = api.resume_queue(queue)
            elif action == "limit":
                row = api.set_queue_limit(queue, _limit(value, "limit"))
            elif action == "key-limit":
                key_limit = _limit(value, "key-limit")
                if key_limit is None and job_type is None:
                    raise CommandError("key-limit: a key limit cannot be removed; give >= 1.")
                row = api.set_key_limit(queue, key_limit, type=job_type)
            else:
                if value is None:
                    raise CommandError("rate: give a rate like '100/s', or 'none'.")
                rate = None if value.lower() in NONE else value
                row = api.set_queue_rate(queue, rate, type=job_type)
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(describe_type(row) if job_type is not None else describe(row))
