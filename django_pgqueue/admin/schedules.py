"""The Schedules admin page: next and last run, enable/disable, run now, edit.

Schedules created here (source "database") are edited here. Schedules declared in
code are read-only: the workers sync them from code at start, so an edit would be
undone; they can still be disabled and enabled, and run now. Enabling a schedule
starts it at its next tick (the time it was off is not caught up). "Run now"
enqueues one job keyed by the schedule, so a double click (or two operators) while
that job is pending or running does not make a second one; it needs the
``django_pgqueue.run_schedule`` permission.

With several queue databases a schedule lives on its queue's database (whose workers
fire it): the list shows one database at a time (the database filter), read from its
replica if it has one; a schedule's page, its edits and the actions are read and
written on that database itself, and a new schedule is written on its queue's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, reverse
from django.utils.html import format_html, format_html_join

from ..conf import get_settings
from ..durations import format_seconds
from ..models import JobState, Schedule, ScheduleTick, Source
from ..registry import registry
from ..schedules.operations import LATE_POLL_INTERVALS, run_now
from ..schedules.spec import ScheduleSpec
from ..schedules.ticks import describe_cron
from .columns import EMPTY, badge, breakable, column, when, when_short
from .databases import (
    DatabaseFilter,
    admin_database,
    database_choice,
    preserved_filters,
    read_alias,
    with_database,
)
from .operations import operation_urls

TIMING_FIELDS = ("cron", "every", "timezone")
RECENT_TICKS = 10


def describe_timing(obj: Schedule) -> str:
    """Say when a schedule runs, as the list and its page both show it: 'every 1m', or a
    cron expression read out in words with its zone, the expression itself below."""
    if obj.cron:
        return format_html(
            '<span class="pgqueue-cron-words">{} ({})</span> <code class="pgqueue-cron">{}</code>',
            describe_cron(obj.cron),
            obj.timezone,
            obj.cron,
        )
    seconds = int(obj.every.total_seconds()) if obj.every else 0
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds and seconds % size == 0:
            return format_html(
                '<span class="pgqueue-nowrap">every {}{}</span>', seconds // size, unit
            )
    return format_html('<span class="pgqueue-nowrap">every {}s</span>', seconds)


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ["name", "type", "queue", "cron", "every", "timezone", "catch_up", "payload",
                  "priority", "max_attempts", "enabled"]  # fmt: skip

    # The queue database of the page (ScheduleAdmin.get_form sets it): an existing
    # schedule's, where it is read and written.
    database: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "timezone" in self.fields and not self.initial.get("timezone"):
            self.initial["timezone"] = settings.TIME_ZONE or "UTC"

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        data["cron"] = (data.get("cron") or "").strip() or None
        spec = ScheduleSpec(
            name=data.get("name") or getattr(self.instance, "name", ""),
            type=data.get("type") or "",
            cron=data["cron"],
            every=data.get("every"),
            queue=data.get("queue"),
            payload=data.get("payload"),
            timezone=data.get("timezone"),
            catch_up=data.get("catch_up") or "once",
            priority=data.get("priority") or 0,
            max_attempts=data.get("max_attempts"),
        )
        problems = spec.problems()
        if problems:
            raise forms.ValidationError([f"{problem}." for problem in problems])
        self.check_database(spec.name, data.get("queue") or self.instance.queue)
        registry.autodiscover()
        if registry.find(spec.type) is None:
            raise forms.ValidationError(
                f"No handler serves the job type {spec.type!r}; known types: "
                f"{', '.join(registry.types()) or 'none'}."
            )
        return data

    def check_database(self, name: str, queue: str) -> None:
        """A schedule stays on its queue's database (its workers fire it there), and its
        name is unique there (the model's own check reads DATABASE only)."""
        alias = get_settings().database_for(queue)
        if self.instance._state.adding:
            if Schedule.objects.using(alias).filter(pk=name).exists():
                raise forms.ValidationError(
                    f"A schedule named {name!r} exists already on the database {alias!r}."
                )
        elif alias != self.database:
            raise forms.ValidationError(
                f"The queue {queue!r} lives on the database {alias!r}, and this schedule on "
                f"{self.database!r}, whose workers could not fire it: add it anew with that "
                "queue, then delete this one."
            )

    def validate_unique(self) -> None:
        # The name is checked on the schedule's database (check_database), not DATABASE's.
        exclude = {*self._get_validation_exclusions(), "name"}
        try:
            self.instance.validate_unique(exclude=exclude)
        except forms.ValidationError as exc:
            self._update_errors(exc)


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    # Fits a 1366-1400 px laptop with the sidebar open (about 720 px for the table):
    # names break after a dot or an underscore, times put the time under the date.
    list_display = ("name_column", "type_column", "queue", "timing", "enabled", "source",
                    "next_run", "last_run", "late")  # fmt: skip
    list_filter = (DatabaseFilter, "enabled", "source", "queue")
    search_fields = ("name", "type")
    actions = ("enable", "disable", "run_now_action")
    readonly_fields = ("source", "timing", "next_run_at", "last_run_at", "recent_runs")
    empty_value_display = EMPTY
    change_form_template = "admin/django_pgqueue/schedule/change_form.html"

    class Media:
        css = {"all": ("django_pgqueue/admin.css",)}

    fieldsets = (
        (None, {"fields": ("name", "type", "queue", "payload", "enabled", "source")}),
        ("When", {"fields": ("cron", "every", "timezone", "catch_up")}),
        ("Jobs", {"fields": ("priority", "max_attempts")}),
        ("Runs", {"fields": (("next_run_at", "last_run_at"), "recent_runs")}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and obj.source != Source.DB:
            fields = [f.name for f in Schedule._meta.concrete_fields]
            return [*fields, "timing", "next_run_at", "last_run_at", "recent_runs"]
        if obj is not None:
            return (*self.readonly_fields, "name")
        return self.readonly_fields

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return self.fieldsets
        # An existing schedule's page says when it runs as the list does ("every 1m");
        # a read-only one (declared in code) shows only that, not the raw interval.
        timing = ("timing", "timezone", "catch_up")
        if obj.source == Source.DB:
            timing = ("timing", "cron", "every", "timezone", "catch_up")
        return tuple(
            (name, {"fields": timing}) if name == "When" else (name, options)
            for name, options in self.fieldsets
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.source != Source.DB:
            return False  # declared in code: the workers' sync would undo an edit
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.source == Source.CODE:
            return False
        return super().has_delete_permission(request, obj)

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_pgqueue.run_schedule")

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False,
                 **kwargs: Any) -> Any:  # fmt: skip
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"database": admin_database(request)})

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        obj.source = Source.DB
        if not change or any(name in form.changed_data for name in (*TIMING_FIELDS, "enabled")):
            obj.next_tick = None  # the next worker to fire it starts it at its next tick
        obj.updated_at = Now()
        # An existing one where it was read (the page's database); a new one on its queue's.
        obj.save(
            using=admin_database(request) if change else get_settings().database_for(obj.queue)
        )

    def get_preserved_filters(self, request: HttpRequest) -> str:
        return preserved_filters(request, super().get_preserved_filters(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        queryset.using(admin_database(request)).delete()  # the list's own database

    def response_post_save_add(self, request: HttpRequest, obj: Schedule) -> HttpResponse:
        # The list of the database the new schedule was written on.
        response = super().response_post_save_add(request, obj)
        if obj._state.db != admin_database(request) and self.has_view_permission(request):
            url = reverse("admin:django_pgqueue_schedule_changelist")
            return HttpResponseRedirect(with_database(url, obj._state.db or ""))
        return response

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        request._pgqueue_listing = True  # type: ignore[attr-defined]  # read from the replica
        choice = database_choice(request, request.path)
        # "Schedules", not Django's "Select schedule to change": most are read-only.
        context = {"database_choice": choice, "title": "Schedules", **(extra_context or {})}
        return super().changelist_view(request, context)

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any
    ) -> HttpResponse:
        schedule = kwargs.get("obj")  # None on the add page
        context["pgqueue_buttons"] = [] if schedule is None else self.buttons(request, schedule)
        return super().render_change_form(request, context, *args, **kwargs)

    def buttons(self, request: HttpRequest, schedule: Schedule) -> list[dict[str, str]]:
        """The schedule page's buttons the user may press: Run now, then Enable or Disable."""
        found = []
        alias = admin_database(request)
        if self.has_run_permission(request):
            found.append({"label": "Run now", "verb": "run-now", "help": "enqueue one job now"})
        # Model-wide change permission: code schedules too are enabled and disabled.
        if super().has_change_permission(request) and schedule.source != Source.REMOVED:
            if schedule.enabled:
                found.append({"label": "Disable", "verb": "disable", "help": "no more ticks"})
            else:
                found.append({"label": "Enable", "verb": "enable", "help": "from its next tick on"})
        for button in found:
            url = reverse(f"admin:django_pgqueue_schedule_{button['verb'].replace('-', '_')}",
                          args=[quote(schedule.pk)])  # fmt: skip
            button["url"] = with_database(url, alias)
        return found

    def get_urls(self) -> list[URLPattern]:
        verbs = (("run-now", self.run_now_view), ("enable", self.enable_view),
                 ("disable", self.disable_view))  # fmt: skip
        own = [
            (f"<path:object_id>/{verb}/", view, f"django_pgqueue_schedule_{verb.replace('-', '_')}")
            for verb, view in verbs
        ]
        return [*operation_urls(self, own), *super().get_urls()]

    def _button(
        self, request: HttpRequest, object_id: str, allowed: bool, act: Any
    ) -> HttpResponse:
        """Run one of the page's buttons (a POST) on its schedule, then show its page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not allowed:
            raise PermissionDenied
        alias = admin_database(request)  # the schedule's database itself, never a replica
        name = unquote(object_id)  # the admin's quoting of a primary key in a URL
        queryset = Schedule.objects.using(alias).filter(pk=name)
        if not queryset.exists():
            raise Http404(f"No schedule named {name!r} on the database {alias!r}.")
        act(request, queryset)
        page = reverse("admin:django_pgqueue_schedule_change", args=[quote(name)])
        return HttpResponseRedirect(with_database(page, alias))

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._button(request, object_id, self.has_run_permission(request),
                            self.run_now_action)  # fmt: skip

    def enable_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._button(request, object_id, super().has_change_permission(request),
                            self.enable)  # fmt: skip

    def disable_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._button(request, object_id, super().has_change_permission(request),
                            self.disable)  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        # The list reads the page's database's replica, if it has one; a schedule's page,
        # its edits and the actions its database itself.
        listing = getattr(request, "_pgqueue_listing", False)
        alias = read_alias(request) if listing else admin_database(request)
        # How late each schedule is, by the database's clock (the rule of schedule_late).
        seconds = LATE_POLL_INTERVALS * get_settings().POLL_INTERVAL
        return (
            super()
            .get_queryset(request)
            .using(alias)
            .annotate(
                late_seconds=RawSQL(
                    "CASE WHEN enabled AND coalesce(next_tick, updated_at)"
                    " < now() - make_interval(secs => %s)"
                    " THEN extract(epoch FROM now() - coalesce(next_tick, updated_at)) END",
                    (seconds,),
                )
            )
        )

    # -- columns ------------------------------------------------------------------------

    name_column = column("name", "name", breakable, ordering="name")
    type_column = column("type", "type", breakable, ordering="type")

    @admin.display(description="when")
    def timing(self, obj: Schedule) -> str:
        return describe_timing(obj)

    @admin.display(description="next run", ordering="next_tick")
    def next_run(self, obj: Schedule) -> str:
        return _next_run(obj, when_short)

    @admin.display(description="next run")
    def next_run_at(self, obj: Schedule) -> str:
        return _next_run(obj, when)

    last_run_at = column("last run", "last_tick", when)
    last_run = column("last run", "last_tick", when_short, ordering="last_tick")

    @admin.display(description="late")
    def late(self, obj: Schedule) -> str:
        late = getattr(obj, "late_seconds", None)
        if late is None:
            return ""
        return format_html('<span class="pgqueue-late">{}</span>', format_seconds(late))

    @admin.display(description="recent runs")
    def recent_runs(self, obj: Schedule) -> str:
        alias = obj._state.db or get_settings().DATABASE  # the schedule's database
        ticks = list(
            ScheduleTick.objects.using(alias)
            .filter(schedule=obj)
            .order_by("-tick_at")[:RECENT_TICKS]
        )
        # Each run's outcome is its job's status now (one query for the ticks shown).
        statuses = dict(
            JobState.objects.using(alias)
            .filter(pk__in=[tick.job_id for tick in ticks])
            .values_list("pk", "status")
        )
        rows = [
            (
                when(tick.tick_at),
                with_database(
                    reverse("admin:django_pgqueue_job_change", args=[tick.job_id]), alias
                ),
                tick.job_id,
                badge(statuses[tick.job_id]) if tick.job_id in statuses else "(pruned)",
                f" (catching up {tick.missed} missed ticks)" if tick.missed else "",
            )
            for tick in ticks
        ]
        if not rows:
            return "none yet"
        return format_html(
            '<ul class="pgqueue-runs">{}</ul>',
            format_html_join("", '<li>{}: <a href="{}">job #{}</a> {}{}</li>', rows),
        )

    # -- actions ------------------------------------------------------------------------

    @admin.action(description="Enable (from the next tick)", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        queryset = queryset.using(admin_database(request))  # never the list's replica
        changed = queryset.filter(enabled=False).exclude(source=Source.REMOVED)
        count = changed.update(enabled=True, next_tick=None, updated_at=Now())
        self.message_user(request, f"Enabled {count} schedule(s).", messages.SUCCESS)

    @admin.action(description="Disable", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        queryset = queryset.using(admin_database(request))  # never the list's replica
        count = queryset.filter(enabled=True).update(enabled=False, updated_at=Now())
        self.message_user(request, f"Disabled {count} schedule(s).", messages.SUCCESS)

    @admin.action(description="Run now (one job each)", permissions=["run"])
    def run_now_action(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        alias = admin_database(request)
        for schedule in queryset.using(alias):  # as the database itself has it now
            job = run_now(schedule, using=alias)  # its queue's database: the schedule's
            url = with_database(reverse("admin:django_pgqueue_job_change", args=[job.id]), alias)
            # "Schedule" first: the admin capitalises a message's first letter, and a
            # schedule's name is shown as written.
            if job.created:
                text = "Schedule {}: enqueued job #{} now."
            else:
                text = (
                    "Schedule {}: job #{} from an earlier \u201crun now\u201d is still waiting "
                    "or running."
                )
            self.message_user(
                request,
                format_html(
                    text.replace("#{}", '<a href="{}">#{}</a>'), schedule.name, url, job.id
                ),
                messages.SUCCESS if job.created else messages.WARNING,
            )


def _next_run(schedule: Schedule, say: Callable[[Any], str]) -> str:
    """When `schedule` runs next, its time said by `say` (when, or when_short)."""
    if not schedule.enabled:
        return f"{EMPTY} (disabled)"
    return say(schedule.next_tick) if schedule.next_tick else "at its next tick"
