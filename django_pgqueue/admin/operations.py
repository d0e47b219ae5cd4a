"""The operator actions, retry now and cancel, with their confirmation page.

Both run the fenced statements of `django_pgqueue.actions` behind the
``django_pgqueue.operate_job`` permission, checked here on every POST, whatever the
admin shows or hides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import Truncator

from .. import actions
from ..models import JobState, Status
from .databases import admin_database, read_alias, with_database

OPERATE_PERMISSION = "django_pgqueue.operate_job"
# Most jobs one action takes, so a "select all" over a million rows cannot lock them
# all in one statement. requeue_dead and prune_queue_jobs handle bulk work in batches.
ACTION_LIMIT = 10_000
try:  # Django 6.1 runs actions from a job's own page too; Django 5.2 from the list only.
    from django.contrib.admin import ActionLocation
except ImportError:  # pragma: no cover - Django 5.2
    ActionLocation = None
# The POST field that carries an action chosen on a job's page (Django 6.1).
FORM_ACTION_FIELD = f"{ActionLocation.CHANGE_FORM.value}-action" if ActionLocation else None
# The confirmation page posts the selected ids in this one field ("12,15,16"): one
# field per job would pass Django's DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000) long before
# ACTION_LIMIT, and Django refuses such a POST with TooManyFieldsSent.
IDS_FIELD = "pgqueue_ids"


@dataclass(frozen=True)
class OperatorAction:
    """What the confirmation page and the message say about one action, and what it runs.

    Its name is that of the function it runs, which names the admin action too
    (retry_now, cancel). The confirmation page explains it with the template
    ``admin/django_pgqueue/explain_<name>.html`` (a project may override it).
    """

    title: str
    button: str
    allowed: frozenset[str]
    run: Callable[..., actions.ActionReport]  # (job ids, alias=...)

    @property
    def name(self) -> str:
        return self.run.__name__

    @property
    def explanation_template(self) -> str:
        return f"admin/django_pgqueue/explain_{self.name}.html"


RETRY = OperatorAction(
    title="Retry now",
    button="Yes, retry now",
    allowed=actions.RETRYABLE,
    run=actions.retry_now,
)
CANCEL = OperatorAction(
    title="Cancel",
    button="Yes, cancel them",
    allowed=actions.CANCELLABLE,
    run=actions.cancel,
)
OPERATOR_ACTIONS = frozenset({RETRY.name, CANCEL.name})


def operator_action(spec: OperatorAction) -> Any:
    """Declare retry or cancel: guarded by the permission, on the list and the job's page."""
    options: dict[str, Any] = {"permissions": ["operate"], "description": spec.title}
    if ActionLocation is not None:
        options["location"] = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]
    return admin.action(**options)


def parse_ids(raw: str) -> list[int]:
    """Read the confirmation page's id list ("12,15,16"); BadRequest naming what is wrong."""
    ids: list[int] = []
    for part in raw.split(","):
        if not (part.isascii() and part.isdigit() and 0 < int(part) < 2**63):
            raise BadRequest(
                f"{IDS_FIELD} must be job ids (positive integers) separated by commas; "
                f"got {Truncator(repr(part)).chars(40)} in {Truncator(repr(raw)).chars(80)}."
            )
        ids.append(int(part))
        if len(ids) > ACTION_LIMIT:
            break  # enough to refuse the whole selection as too large, as a list would be
    return ids


class OperatorActionsMixin:
    """Retry now and cancel for a job ModelAdmin, each confirmed on a page of its own."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(OPERATE_PERMISSION)

    def prepare_action_post(self, request: HttpRequest, field: str) -> None:
        """Check a POST that may carry an operator action (`field` names the action).

        A user without the permission gets 403. The confirmation page's one field of
        ids becomes the selection Django's action handling reads.
        """
        if request.method != "POST":
            return
        if not self.has_operate_permission(request) and (
            set(request.POST.getlist(field)) & OPERATOR_ACTIONS
        ):
            raise PermissionDenied("Retrying and cancelling jobs needs the operate_job permission.")
        if IDS_FIELD in request.POST:
            post = request.POST.copy()
            ids = parse_ids(post.pop(IDS_FIELD)[-1])
            post.setlist(helpers.ACTION_CHECKBOX_NAME, [str(job_id) for job_id in ids])
            request.POST = post  # type: ignore[misc]

    @operator_action(RETRY)
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._operate(request, queryset, RETRY)

    @operator_action(CANCEL)
    def cancel(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._operate(request, queryset, CANCEL)

    def _operate(
        self, request: HttpRequest, queryset: QuerySet[Any], spec: OperatorAction
    ) -> HttpResponse | None:
        if not self.has_operate_permission(request):
            raise PermissionDenied  # the admin filters actions too; never rely on that alone
        ids = list(queryset.order_by().values_list("pk", flat=True)[: ACTION_LIMIT + 1])
        if len(ids) > ACTION_LIMIT:
            self.message_user(  # type: ignore[attr-defined]
                request,
                f"{spec.title}: more than {ACTION_LIMIT:,} jobs selected; nothing was changed. "
                "Narrow the selection with the filters, or use the requeue_dead command.",
                messages.ERROR,
            )
            return None
        from_form = FORM_ACTION_FIELD is not None and FORM_ACTION_FIELD in request.POST
        if request.POST.get("post") != "yes":
            return self._confirmation(request, ids, spec, from_form)

        # Written on the list's database itself, never on its replica.
        alias = admin_database(request)
        report = spec.run(ids, alias=alias)
        select_across = request.POST.get("select_across") == "1"
        if not select_across:
            listed = set(ids)
            for raw in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                if raw.isdigit() and int(raw) not in listed:
                    report.skip(actions.NOT_LISTED, int(raw))
        if report.changed and not report.skipped_count:
            level = messages.SUCCESS
        else:
            level = messages.WARNING
        self.message_user(request, report.message(), level)  # type: ignore[attr-defined]
        if from_form and len(ids) == 1:
            # The job may have left this list (a retried dead job is not dead any more):
            # show it where it always is.
            page = reverse("admin:django_pgqueue_job_change", args=[ids[0]])
            return HttpResponseRedirect(with_database(page, alias))
        return None

    def _confirmation(
        self, request: HttpRequest, ids: list[int], spec: OperatorAction, from_form: bool
    ) -> HttpResponse:
        alias = read_alias(request)
        by_status = {
            row["status"]: row["jobs"]
            for row in JobState.objects.using(alias)
            .filter(pk__in=ids)
            .values("status")
            .annotate(jobs=Count("pk"))
            .order_by()
        }
        groups = [
            {
                "status": status,
                "jobs": by_status[status],
                "applies": status in spec.allowed,
            }
            for status in Status.values
            if by_status.get(status)
        ]
        model_admin: Any = self
        context = {
            **model_admin.admin_site.each_context(request),
            "title": f"{spec.title}: are you sure?",
            "opts": model_admin.opts,
            "spec": spec,
            "ids": ids,
            "groups": groups,
            "will_change": sum(g["jobs"] for g in groups if g["applies"]),
            "will_skip": sum(g["jobs"] for g in groups if not g["applies"]),
            "preview": model_admin.get_queryset(request).filter(pk__in=ids[:20]).order_by("-id"),
            "more": max(0, len(ids) - 20),
            "action_field": (FORM_ACTION_FIELD if from_form else "action"),
            "ids_field": IDS_FIELD,
            "ids_value": ",".join(map(str, ids)),
            "media": model_admin.media,
        }
        return TemplateResponse(request, "admin/django_pgqueue/action_confirmation.html", context)


def operation_urls(
    model_admin: admin.ModelAdmin, views: list[tuple[str, Callable[..., HttpResponse], str]]
) -> list[URLPattern]:
    """The URLs of a model admin's operation views, (route, view, URL name) each, behind
    the admin site's login check: its get_urls puts them before Django's."""
    return [
        path(route, model_admin.admin_site.admin_view(view), name=name)
        for route, view, name in views
    ]
