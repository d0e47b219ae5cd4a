# Two rules, each written once as a function that every statement needing it calls:
# pgqueue_holds_unique_key (whether a state row holds its unique key now) and
# pgqueue_end_event_waits (end the event waits of the jobs given). pgqueue_enqueue_unique
# and pgqueue_emit call them; job_retry_now in sql/core.sql and event_wait_timeout in
# sql/durable.sql too.
#
# The squashed migration creates all four (their text and why they are so is there);
# this one runs that same text again (CREATE OR REPLACE) for a database the old files
# took to 0029, whose pgqueue_enqueue_unique and pgqueue_emit wrote both rules out
# inline and which has neither function. A fresh database has them already, as does
# one taken back to 0029: nothing to undo.

import importlib

from django.db import migrations

SQUASHED = importlib.import_module(
    "django_pgqueue.migrations.0001_squashed_0029_enqueue_statement_work"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0029_enqueue_statement_work")]

    operations = [
        migrations.RunSQL(
            sql=[
                SQUASHED.HOLDS_UNIQUE_KEY,
                SQUASHED.END_EVENT_WAITS,
                SQUASHED.ENQUEUE_UNIQUE,
                SQUASHED.EMIT,
            ],
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
