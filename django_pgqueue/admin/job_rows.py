"""The base of the read-only lists of rows that belong to jobs: Batches, Held sequences."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from ..models import Job
from .attempts import NoEditing, can
from .columns import EMPTY
from .databases import DatabaseFilter, database_choice


class JobRowsAdmin(NoEditing, admin.ModelAdmin):  # type: ignore[type-arg]
    """A list, titled `list_title`, of rows that belong to jobs, one queue database at a
    time (the database filter): nothing to add, change or delete on it, and whoever may
    view jobs may view it."""

    list_title = ""
    list_display_links = None
    empty_value_display = EMPTY
    list_filter = (DatabaseFilter,)
    show_full_result_count = False

    class Media:
        css = {"all": ("django_pgqueue/admin.css",)}

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        choice = database_choice(request, request.path)
        context = {"title": self.list_title, "database_choice": choice, **(extra_context or {})}
        return super().changelist_view(request, context)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may view jobs may view what they joined or hold back.
        return super().has_view_permission(request, obj) or can(request, Job, "view")
