"""System checks for schedules: bad declarations fail at startup, not at the first tick.

- pgqueue.E030: a schedule declaration cannot be read (not a dict, unknown key ...).
- pgqueue.E031: invalid cron expression, interval or time zone, or another bad field.
- pgqueue.E032: a schedule for a job type no handler (or @task) serves.
- pgqueue.E033: two code schedules with one name.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from ..registry import registry
from .spec import ScheduleSpec, code_schedules


def schedule_problems(spec: ScheduleSpec) -> list[str]:
    """What is wrong with `spec`, its job type included (empty when nothing is)."""
    problems = spec.problems()
    if not problems and registry.find(spec.type) is None:
        problems.append(f"no handler serves the job type {spec.type!r}")
    return problems


@checks.register("pgqueue")  # django_pgqueue.checks.TAG: the checks a worker runs at start
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgqueue.E030-E033: every schedule declared in code must be valid and served."""
    declared = code_schedules()
    errors: list[checks.CheckMessage] = [
        checks.Error(f"Schedule declaration {error}.", id="pgqueue.E030")
        for error in declared.errors
    ]
    for spec in declared.specs:
        for problem in spec.problems():
            errors.append(
                checks.Error(
                    f"Schedule {spec.name!r} ({spec.origin}): {problem}.",
                    hint="Cron expressions have 5 fields (6 with seconds first); time "
                    "zones are IANA names such as 'Europe/Berlin'.",
                    id="pgqueue.E031",
                )
            )
        if not spec.problems() and registry.find(spec.type) is None:
            errors.append(
                checks.Error(
                    f"Schedule {spec.name!r} ({spec.origin}) enqueues the job type "
                    f"{spec.type!r}, which no handler serves.",
                    hint="Register it with @django_pgqueue.handler in an installed app's "
                    "jobs module, or name an existing @task function.",
                    id="pgqueue.E032",
                )
            )
    for name, origins in sorted(declared.duplicates().items()):
        errors.append(
            checks.Error(
                f"Two code schedules are named {name!r}: {' and '.join(origins)}.",
                hint="Give each schedule its own name.",
                id="pgqueue.E033",
            )
        )
    return errors
