"""The admin's Workers page: each worker (a supervisor and its children, or a process
run alone) with its processes, and the operators' requests to them.

Read from the small registry table: each process's figures come from its last report
(one reading: its running jobs and their count from the same beat); the jobs still
leased to a gone process are read through the running-rows index. Gone workers, and
the gone processes of a live one (a restart's predecessor), are folded away unless
``?gone=1`` asks for them.

Requests (stop, drain, resume, concurrency) are POSTed to the page, for one worker (a
supervisor's id reaches all its children) or every worker serving a queue, behind the
``django_pgqueue.control_worker`` permission; each live process takes its request at
its next beat. A worker gone is refused with a message, and nothing is asked.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern

from ..conf import get_settings
from ..models import WorkerRecord
from ..models.observability import WORKER_ACTIONS as ACTIONS
from ..observability import fleet, workers
from ..validators import MAX_CONCURRENCY
from . import feed
from .databases import DatabaseRow, several_databases, staleness
from .observability import ReadOnlyPage

# The latest requests the page lists.
REQUESTS_SHOWN = 10


@admin.register(WorkerRecord)
class WorkersAdmin(ReadOnlyPage):
    def get_urls(self) -> list[URLPattern]:
        return [*feed.urls(self), *super().get_urls()]

    def has_control_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_pgqueue.control_worker")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """The workers of every queue database in one table (alive first), each read
        where that database's lists are read; a database out of reach is named. A POST
        makes a request to workers, then shows the page again."""
        if request.method == "POST":
            return self.ask(request)
        conf = get_settings()
        several = several_databases()
        found: list[workers.WorkerInfo] = []
        databases = []  # with several: each one's row (read from, how stale, or why not)
        for alias in conf.queue_databases:
            read_from = conf.read_database(alias)
            try:
                found += workers.list_workers(read_from, database=alias)
            except DatabaseError as exc:
                if not several:
                    raise
                why = f"not read: {str(exc).strip() or type(exc).__name__}"
                databases.append(DatabaseRow(alias, read_from, False, why))
            else:
                if several:
                    databases.append(DatabaseRow(alias, read_from, True, staleness(read_from)))
        show_gone = request.GET.get("gone") == "1"
        grouped = fleet.group(found)
        shown = grouped if show_gone else [w for w in grouped if w.alive]
        alive = [w for w in grouped if w.alive]
        return self.page(
            request,
            "admin/django_pgqueue/workers.html",
            workers=[_row(w, show_gone) for w in shown],
            alive=len(alive),
            processes=sum(len(w.live) for w in alive),
            gone=len(grouped) - len(alive),
            show_gone=show_gone,
            several_databases=several,
            databases=databases,
            can_control=self.has_control_permission(request),
            queues=sorted({q for w in alive for q in w.queues}),
            requests=_recent_requests(conf.queue_databases),
        )

    def ask(self, request: HttpRequest) -> HttpResponse:
        """Make the request the POST names; a message says what was asked or refused."""
        if not self.has_control_permission(request):
            raise PermissionDenied("Controlling workers needs the control_worker permission.")
        post = request.POST
        action = post.get("action", "")
        if action not in ACTIONS:
            raise BadRequest(f"action must be one of {', '.join(ACTIONS)}.")
        concurrency = None
        if action == "concurrency":
            raw = post.get("concurrency", "")
            if not raw.isdigit() or not 1 <= int(raw) <= MAX_CONCURRENCY:
                self.message_user(
                    request,
                    f"Concurrency: give a whole number from 1 to {MAX_CONCURRENCY} "
                    f"(got {raw[:20]!r}); nothing was asked.",
                    messages.ERROR,
                )
                return HttpResponseRedirect(request.get_full_path())
            concurrency = int(raw)
        worker, queue = post.get("worker") or None, post.get("queue") or None
        if worker is None and queue is None:
            raise BadRequest("Name a worker or a queue.")
        conf = get_settings()
        alias = post.get("database") or conf.DATABASE
        if alias not in conf.queue_databases:
            raise BadRequest(f"{alias!r} is not a queue database.")
        who = f"{request.user.get_username()} (admin)"
        try:
            made = fleet.ask(
                alias,
                action,
                workers=[worker] if worker else [],
                queue=queue,
                concurrency=concurrency,
                requested_by=who,
                known=workers.list_workers(alias, with_jobs=False),
            )
        except fleet.RequestRefused as exc:
            self.message_user(request, f"Refused: {exc}", messages.ERROR)
        else:
            what = action if concurrency is None else f"{action} {concurrency}"
            target = worker or f"the workers serving {queue}"
            self.message_user(
                request,
                f"Asked {target} to {what} ({len(made)} process(es)); each takes it at its "
                "next beat (within seconds).",
                messages.SUCCESS,
            )
        return HttpResponseRedirect(request.get_full_path())


def _row(worker: fleet.Worker, show_gone: bool) -> dict[str, Any]:
    """What the page shows of a worker: its figures, and its processes (gone ones only
    with `show_gone`, or when none is alive)."""
    processes = worker.processes if show_gone or not worker.alive else worker.live
    return {
        "worker": worker,
        "processes": [_process(p) for p in processes],
        "gone_hidden": 0 if show_gone else len(worker.processes) - len(processes),
    }


def _process(process: workers.WorkerInfo) -> dict[str, Any]:
    report = process.report or {}
    return {
        "info": process,
        "report": report,
        "running": report.get("running_count", process.running),
        "concurrency": report.get("concurrency", process.concurrency),
        "rss_mib": None if report.get("rss_bytes") is None else report["rss_bytes"] / 2**20,
        # A live process's jobs from its report; a gone one's still leased to it.
        "jobs": report.get("running", []) if process.alive else [],
        "leased": [] if process.alive else process.jobs,
    }


def _recent_requests(databases: tuple[str, ...]) -> list[fleet.Asked]:
    found: list[fleet.Asked] = []
    for alias in databases:
        try:
            found += fleet.requests(alias, limit=REQUESTS_SHOWN)
        except DatabaseError:
            continue
    return sorted(found, key=lambda a: a.requested_at, reverse=True)[:REQUESTS_SHOWN]
