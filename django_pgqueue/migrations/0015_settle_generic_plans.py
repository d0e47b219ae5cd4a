# The settle functions plan their statements once per connection. PostgreSQL re-plans
# a PL/pgSQL statement at every call while its custom plans look cheaper than the
# generic one, and with the one-element arrays of a single job's completion they always
# do: completing one member of a chord spent more time planning pgqueue_settle's two
# statements than running them (0.50 ms against 0.28 ms for the whole completion with
# the generic plans, at 49-member chords). The generic plans are the index probes
# already: the functions run with sequential scans off (0011).

from django.db import migrations

FUNCTIONS = ("pgqueue_settle(bigint[], bigint[])", "pgqueue_unsettle(bigint[])")


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0014_settle_wakes_waiters"),
    ]

    operations = [
        migrations.RunSQL(
            sql=[f"ALTER FUNCTION {f} SET plan_cache_mode = force_generic_plan" for f in FUNCTIONS],
            reverse_sql=[f"ALTER FUNCTION {f} RESET plan_cache_mode" for f in FUNCTIONS],
        ),
    ]
