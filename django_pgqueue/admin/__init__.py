"""The Django admin for the queue: jobs, dead jobs, their attempts, retry and cancel.

Everything here is read-only. The only writes are the two operator actions, which
run the fenced statements of `django_pgqueue.actions` (``job_retry_now``,
``job_cancel``) behind the ``django_pgqueue.operate_job`` permission; no state field is
ever saved by a form. The Workers page also makes requests to workers (stop, drain,
resume, concurrency) behind ``django_pgqueue.control_worker``: rows the workers take.

The rooms: `lists` keeps the list pages fast (the estimated count, the filters),
`columns` makes the read-only display columns, `operations` holds the two actions and
their confirmation page, `attempts` the inline of a job's attempts, and `jobs` the two
model admins. The features' pages: `controls` the Queues page (queue control),
`schedules` the Schedules page, `observability` the Charts page, `workers` the
Workers page (and its requests to workers, behind ``control_worker``),
`workflows` the Workflows pages and each workflow's graph, `batches` the Batches page,
`sequences` the Held sequences page (and the release of a held sequence, behind
``operate_job``).
Each module registers its admins on import; this package is an integration, so it may
import the features, and no feature imports it.
"""

from __future__ import annotations

from . import (  # noqa: F401  (register their pages)
    batches,
    controls,
    observability,
    schedules,
    sequences,
    workers,
    workflows,
)
from .jobs import DeadJobAdmin, JobAdmin

__all__ = ["DeadJobAdmin", "JobAdmin"]
