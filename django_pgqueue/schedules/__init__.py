"""Recurring jobs: schedules declared in code or in the admin, fired by the workers.

- `ticks`: when a schedule ticks (cron in a time zone, or an interval); pure.
- `spec`: declarations in code, read and checked.
- `firing`: `fire_due`, which any worker serving a schedule's queue calls each poll
  cycle (one statement per tick: exactly one job per tick), and the sync of code
  schedules into ``queue_schedules`` at worker start.
- `operations`: run now and late schedules, for the admin and ``queue_stats``.
- `checks`: the system checks.

The tables are `django_pgqueue.models.schedules`; the Schedules page is
`django_pgqueue.admin.schedules`.
"""
