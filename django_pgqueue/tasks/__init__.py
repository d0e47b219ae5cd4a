"""The bridge to Django's Tasks framework: ``@task`` functions run as queue jobs.

`api` imports the framework (``django.tasks``, or the ``django-tasks`` backport on
Django 5.2); `options` validates a backend's OPTIONS; `results` says what a task job
carries and reads a ``TaskResult`` back from its rows; `backend` is
`PgQueueBackend` (settings name it as ``django_pgqueue.backends.PgQueueBackend``);
`runner` runs a task's jobs in the worker and sends the task signals.
"""
