"""Durable execution inside a plain handler: steps that run once per job, atomic steps
whose database writes commit with their checkpoint, sleeps and event waits that give
the job back without holding a thread, a slot or a lease.

Importing it gives `JobContext` its durable methods (`step`, `atomic_step`, `sleep`,
`sleep_until`, `wait_for_event`); the package's ``__init__`` imports it.
"""

from __future__ import annotations

from .. import context
from .events import emit_event
from .run import DurableRun, StepMismatch

context.durable_run_factory = DurableRun

__all__ = ["DurableRun", "StepMismatch", "emit_event"]
