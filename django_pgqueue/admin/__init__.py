"""The Django admin for the queue: jobs, dead jobs, their attempts, retry and cancel.

Everything here is read-only. The only writes are the two operator actions, which
run the fenced statements of `django_pgqueue.actions` (``job_retry_now``,
``job_cancel``) behind the ``django_pgqueue.operate_job`` permission; no state field is
ever saved by a form.

The rooms: `lists` keeps the list pages fast (the estimated count, the filters),
`columns` makes the read-only display columns, `operations` holds the two actions and
their confirmation page, `attempts` the inline of a job's attempts, and `jobs` the two
model admins, registered on import.
"""

from __future__ import annotations

from ..control import admin as control_admin  # noqa: F401  (issue 14: the Queues page)
from ..observability import admin as observability_admin  # noqa: F401  (Workers, Charts)
from ..schedules import admin as schedules_admin  # noqa: F401  (registers the Schedules page)
from .jobs import DeadJobAdmin, JobAdmin

__all__ = ["DeadJobAdmin", "JobAdmin"]
