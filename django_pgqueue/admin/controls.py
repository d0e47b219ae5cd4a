"""The admin's Queues page: pause, resume and limit queues at run time.

Registered by one import in ``django_pgqueue/admin/__init__.py``; the controls
themselves are the `django_pgqueue.control` feature's. Viewing needs the
view permission on jobs; every change (the pause and resume actions, the form, the
Pause button of a queue without controls) needs ``django_pgqueue.operate_job``, like
retrying and cancelling jobs. Below the controlled queues the page lists every other
known queue (`lists.known_queues`), active, each with a Pause button. A form never saves
the row through the ORM: `save_model` runs ``queue_control_update``, which leaves the
rate window (written by claims under the queue's lock) alone.

With queues on several databases (PGQUEUE["QUEUE_DATABASES"]) the other known queues
are those of every queue database, each naming its own; the controlled queues are
Django's list of one database at a time (``?database=ALIAS``, DATABASE by default);
every change is written on the queue's own database (`database_for`), never on a
replica, and the page lists the databases with how stale each one's figures are.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, reverse
from django.utils.text import Truncator

from .. import stats
from ..conf import get_settings
from ..control import store
from ..exceptions import ConfigurationError
from ..limits import check_limit, describe_type, parse_rate
from ..models import Job, JobState, QueueControl, QueueTypeControl, Status
from ..validators import queue_name
from .columns import EMPTY, column, when
from .databases import (
    DatabaseFilter,
    admin_database,
    database_rows,
    overview,
    several_databases,
)
from .fair_keys import fair_keys_view
from .lists import known_queues
from .observability import breadcrumbs_as_list
from .operations import operation_urls

OPERATE_PERMISSION = "django_pgqueue.operate_job"


class QueueControlForm(forms.ModelForm):
    """The editable controls; the rate is one field ('100/s'), empty for none.

    A new row is for one of the known queues that has none yet (a choice, not free
    text: `QueueControlAdmin.get_form` gives the choices), the one asked for in the URL
    (``?queue=``) included.
    """

    rate = forms.CharField(
        required=False,
        help_text="At most N starts per period: '100/s', '5/m', '10/2.5s'. Empty: no limit.",
    )
    key_limit = forms.IntegerField(
        required=False,
        min_value=1,
        initial=1,
        label="Key limit",
        help_text="Most running jobs sharing one concurrency key. Empty: 1.",
    )
    # The queues a new row may be for (set by QueueControlAdmin.get_form).
    queue_choices: list[str] = []

    class Meta:
        model = QueueControl
        fields = ("queue", "paused", "concurrency_limit", "key_limit")
        help_texts = {
            "concurrency_limit": "Most running jobs of the queue across all workers. "
            "Empty: no limit.",
            "key_limit": "Most running jobs sharing one concurrency key.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.rate_count is not None:
            self.initial["rate"] = f"{self.instance.rate_count}/{self.instance.rate_period:g}s"
        if "queue" in self.fields:
            self.fields["queue"] = forms.ChoiceField(
                choices=[("", "---------")] + [(q, q) for q in self.queue_choices],
                help_text="A known queue that has no limits yet.",
            )

    def clean_queue(self) -> str:
        try:
            return queue_name(self.cleaned_data.get("queue"))
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("key_limit") is None:
            data["key_limit"] = 1
        try:
            data["concurrency_limit"] = check_limit(data.get("concurrency_limit"), "limit")
            check_limit(data.get("key_limit"), "key limit", low=1)
            data["parsed_rate"] = parse_rate(data.get("rate") or None)
        except ConfigurationError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


@admin.register(QueueControl)
class QueueControlAdmin(admin.ModelAdmin):
    form = QueueControlForm
    list_display = (
        "queue",
        "state_display",
        "limit_display",
        "key_limit",
        "rate_display",
        "running",
        "updated",
    )
    list_display_links = ("queue",)
    ordering = ("queue",)
    # Offered once queues live on several databases: whose controls the list shows.
    list_filter = (DatabaseFilter,)
    actions = ("pause_selected", "resume_selected")
    readonly_fields = ("type_limits", "configured", "updated")
    empty_value_display = EMPTY
    change_list_template = "admin/django_pgqueue/queuecontrol/change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[QueueControl]:
        conf = get_settings()
        alias = admin_database(request)  # ?database=, or that of the list it came from
        running = (
            JobState.objects.filter(queue=OuterRef("queue"), status=Status.RUNNING)
            .order_by()
            .values("queue")
            .annotate(n=Count("pk"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .using(conf.read_database(alias))
            .defer("rate_starts")
            .annotate(running=Coalesce(Subquery(running, output_field=IntegerField()), Value(0)))
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        conf = get_settings()
        selected = admin_database(request)
        controlled = controlled_queues()
        read = overview(request)
        figures = {(f.database, f.queue): f for f in read.queues}
        names = set(known_queues(request)) | {queue for _, queue in figures}
        others = [
            _other_queue(queue, alias, figures.get((alias, queue)))
            for queue in sorted(names)
            if (alias := conf.database_for(queue), queue) not in controlled
        ]
        context = {
            "pgqueue_other_queues": others,
            "pgqueue_counts_capped": any(
                q.get("pending_capped") or q.get("dead_capped") for q in others
            ),
            "pgqueue_count_cap": stats.COUNT_CAP,
            "pgqueue_can_operate": self.has_operate_permission(request),
            "pgqueue_fair_queues": sorted(conf.FAIR_QUEUES),
            "pgqueue_several_databases": several_databases(),
            "pgqueue_databases": database_rows(request) if several_databases() else [],
            "pgqueue_database": selected,
            "title": "Queues",
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    def get_urls(self) -> list[URLPattern]:
        pause = ("set-paused/", self.set_paused_view, "django_pgqueue_queuecontrol_set_paused")
        keys = ("fair-keys/", self.fair_keys_view, "django_pgqueue_queuecontrol_fair_keys")
        return [*operation_urls(self, [pause, keys]), *super().get_urls()]

    def fair_keys_view(self, request: HttpRequest) -> HttpResponse:
        """A fair queue's keys with their backlog and share (`?queue=`, `?after=`)."""
        return fair_keys_view(self, request)

    def set_paused_view(self, request: HttpRequest) -> HttpResponse:
        """Pause or resume one queue by name (a POST of queue, paused=1|0), then list them."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied("Pausing and resuming queues needs the operate_job permission.")
        paused = request.POST.get("paused")
        if paused not in ("0", "1"):
            raise BadRequest(
                f"paused must be 1 (pause) or 0 (resume); got {Truncator(repr(paused)).chars(40)}."
            )
        try:
            queue = queue_name(request.POST.get("queue"))
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        self._set_paused_queues(request, [queue], paused == "1")
        return HttpResponseRedirect(reverse("admin:django_pgqueue_queuecontrol_changelist"))

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False,
                 **kwargs: Any) -> Any:  # fmt: skip
        form = super().get_form(request, obj, change, **kwargs)
        if obj is not None:
            return form
        conf = get_settings()
        controlled = controlled_queues()
        choices = {q for q in known_queues(request) if (conf.database_for(q), q) not in controlled}
        wanted = request.GET.get("queue") or request.POST.get("queue")
        if wanted:
            choices.add(wanted)  # validated as a queue name by the form
        return type(form.__name__, (form,), {"queue_choices": sorted(choices)})

    def add_view(self, request: HttpRequest, form_url: str = "",
                 extra_context: dict[str, Any] | None = None) -> HttpResponse:  # fmt: skip
        context = {
            "title": "Set limits on a queue",
            "breadcrumbs_as_list": breadcrumbs_as_list(),
            **(extra_context or {}),
        }
        return super().add_view(request, form_url, context)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = list(super().get_fields(request, obj))
        if obj is None:  # a queue without limits yet has no per-type limits or history
            fields = [name for name in fields if name not in self.readonly_fields]
        return fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return (*self.readonly_fields, "queue") if obj is not None else self.readonly_fields

    # -- permissions: operate_job for every change ------------------------------------

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(OPERATE_PERMISSION)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        opts = Job._meta
        return request.user.has_perm(f"{opts.app_label}.view_job") or self.has_operate_permission(
            request
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_operate_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_operate_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    # -- columns ----------------------------------------------------------------------

    @admin.display(description="state")
    def state_display(self, control: QueueControl) -> str:
        return "paused" if control.paused else "active"

    @admin.display(description="limit")
    def limit_display(self, control: QueueControl) -> str:
        return EMPTY if control.concurrency_limit is None else str(control.concurrency_limit)

    @admin.display(description="rate")
    def rate_display(self, control: QueueControl) -> str:
        if control.rate_count is None:
            return EMPTY
        return f"{control.rate_count} / {control.rate_period:g}s"

    @admin.display(description="per-type limits")
    def type_limits(self, control: QueueControl) -> str:
        """Read only here: set with `queue_control key-limit|rate --type` or the Python API."""
        conf = get_settings()
        alias = conf.read_database(conf.database_for(control.queue))
        rows = QueueTypeControl.objects.using(alias).filter(queue=control.queue).order_by("type")
        return "; ".join(describe_type(row) for row in rows.values()) or EMPTY

    updated = column("updated", "updated_at", when)

    @admin.display(description="running")
    def running(self, control: QueueControl) -> int:
        return control.running  # type: ignore[attr-defined]

    # -- writes -----------------------------------------------------------------------

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        data = form.cleaned_data
        store.update_control(
            get_settings().database_for(obj.queue),  # the queue's own database
            obj.queue,
            paused=data["paused"],
            concurrency_limit=data["concurrency_limit"],
            key_limit=data["key_limit"],
            rate=data["parsed_rate"],
        )

    def _set_paused(
        self, request: HttpRequest, queryset: QuerySet[QueueControl], paused: bool
    ) -> None:
        self._set_paused_queues(request, sorted(queryset.values_list("queue", flat=True)), paused)

    def _set_paused_queues(self, request: HttpRequest, queues: list[str], paused: bool) -> None:
        for queue in queues:
            store.update_control(get_settings().database_for(queue), queue, paused=paused)
        verb = "Paused" if paused else "Resumed"
        self.message_user(
            request,
            f"{verb} {len(queues)} queue(s): {', '.join(queues)}. Workers follow within one "
            "poll interval.",
            messages.SUCCESS,
        )

    @admin.action(description="Pause selected queues", permissions=["operate"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> None:
        self._set_paused(request, queryset, True)

    @admin.action(description="Resume selected queues", permissions=["operate"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> None:
        self._set_paused(request, queryset, False)


def _other_queue(queue: str, database: str, figures: Any) -> dict[str, Any]:
    """A row of the other known queues: its counts, each with whether it stopped at the cap."""
    if figures is None:
        return {"queue": queue, "database": database, "pending": 0, "running": 0, "dead": 0}
    return {
        "queue": queue,
        "database": database,
        "pending": figures.pending,
        "pending_capped": figures.pending_capped,
        "running": figures.running,
        "dead": figures.dead,
        "dead_capped": figures.dead_capped,
    }


def controlled_queues() -> set[tuple[str, str]]:
    """(database alias, queue) of every queue with a controls row, on every queue database."""
    conf = get_settings()
    return {
        (alias, queue)
        for alias in conf.queue_databases
        for queue in QueueControl.objects.using(conf.read_database(alias)).values_list(
            "queue", flat=True
        )
    }
