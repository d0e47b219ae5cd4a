from django.apps import AppConfig


class PgQueueConfig(AppConfig):
    name = "django_pgqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .registry import registry
        from .schedules import checks as schedule_checks  # noqa: F401 - and the schedules'

        try:
            from .tasks import api  # noqa: F401
        except ImportError:
            return  # Django 5.2 without the django-tasks backport: handlers only
        from .tasks.runner import resolve_task

        # Jobs enqueued by PgQueueBackend have a task's module path as their type.
        registry.add_resolver(resolve_task)
