from django.apps import AppConfig


class PgQueueConfig(AppConfig):
    name = "django_pgqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Local: Django's app loading. The checks and the task resolver import models,
        # which only load once the app registry is ready.
        from .startup import connect

        connect()
