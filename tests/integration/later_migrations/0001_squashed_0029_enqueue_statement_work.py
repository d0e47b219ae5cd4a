"""The app's squashed migration, as it stands in django_pgqueue/migrations."""

import importlib

Migration = importlib.import_module(
    "django_pgqueue.migrations.0001_squashed_0029_enqueue_statement_work"
).Migration
