"""manage.py control_queue_workers stop|drain|resume|concurrency [N] (--worker ID | --queue Q).

Asks live workers (a process, every child of a supervisor, or every process serving a
queue) through the database; each takes the request at its next beat and records its
answer (`django_pgqueue.observability.fleet`). `--wait` waits for the answers.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgqueue.management.options import add_database_option, database_option
from django_pgqueue.observability import fleet
from django_pgqueue.observability.workers import list_workers
from django_pgqueue.worker.controls import ACTIONS, check_request

# Seconds between two looks at whether the workers took a request (--wait).
WAIT_STEP = 0.2


class Command(BaseCommand):
    help = (
        "Ask live workers to stop gracefully, to stop taking jobs (drain), to take jobs "
        "again (resume), or to run N handler threads (concurrency N). Each takes the "
        "request at its next beat; a worker gone is refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS)
        parser.add_argument("value", nargs="?", help="concurrency: the number of handler threads.")
        parser.add_argument(
            "--worker",
            action="append",
            default=[],
            metavar="ID",
            help="A worker process's id, or a supervisor's (all its children); repeatable.",
        )
        parser.add_argument("--queue", help="Every live worker process serving this queue.")
        parser.add_argument(
            "--wait",
            type=float,
            nargs="?",
            const=30.0,
            metavar="SECONDS",
            help="Wait up to SECONDS (default 30) for the workers' answers.",
        )
        add_database_option(parser, "Only the workers of this database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        concurrency = _concurrency(action, options["value"])
        if not options["worker"] and options["queue"] is None:
            raise CommandError("Name the workers (--worker ID) or a queue (--queue NAME).")
        try:
            check_request(action, concurrency)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        who = f"{_user()}@{socket.gethostname()} (control_queue_workers)"
        made: dict[str, list[tuple[int, str]]] = {}
        refusals = []
        for alias in database_option(options["database"]):
            try:
                made[alias] = fleet.ask(
                    alias,
                    action,
                    workers=options["worker"],
                    queue=options["queue"],
                    concurrency=concurrency,
                    requested_by=who,
                    known=list_workers(alias, with_jobs=False),
                )
            except fleet.RequestRefused as exc:
                refusals.append(str(exc))
        if not made:
            raise CommandError(" ".join(dict.fromkeys(refusals)))
        for alias, requests in made.items():
            for request_id, worker_id in requests:
                self.stdout.write(f"asked {worker_id} to {action} (request {request_id}, {alias})")
        if options["wait"] is not None:
            self._wait(made, options["wait"])

    def _wait(self, made: dict[str, list[tuple[int, str]]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for alias, requests in made.items():
            ids = [request_id for request_id, _ in requests]
            while True:
                asked = fleet.requests(alias, ids)
                if all(a.answer is not None for a in asked) or time.monotonic() >= deadline:
                    break
                time.sleep(WAIT_STEP)
            for a in asked:
                self.stdout.write(a.describe())
            if any(a.answer is None for a in asked):
                raise CommandError(f"Not every worker answered within {timeout:g}s.")


def _user() -> str:
    """Who runs the command, for the request's log (a container may know no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


def _concurrency(action: str, value: str | None) -> int | None:
    if value is None:
        return None
    if action != "concurrency":
        raise CommandError(f"{action} takes no value (got {value!r}).")
    try:
        return int(value)
    except ValueError:
        raise CommandError(f"concurrency: expected a whole number, got {value!r}.") from None
