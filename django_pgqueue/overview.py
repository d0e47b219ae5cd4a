"""The figures of every queue database at once: one `stats.Snapshot` per alias.

With PGQUEUE["QUEUE_DATABASES"], queues live on several aliases; queue_stats, the
metrics and the admin read each one (from `read_database(alias)`: READ_DATABASE, a
replica, for DATABASE's queues when set) and show the figures side by side, a queue's
row naming its database. A database that cannot be read is reported as down with its
error, and the others are still shown.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError

from .conf import get_settings
from .stats import QueueFigures, Snapshot, collect

logger = logging.getLogger(__name__)


@dataclass
class DatabaseReading:
    """One queue database's figures, or why they could not be read (`error`)."""

    alias: str
    # The alias the figures were read from: `alias`, or its replica (READ_DATABASE).
    read_from: str
    snapshot: Snapshot | None = None
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.snapshot is not None


@dataclass
class Overview:
    readings: list[DatabaseReading] = field(default_factory=list)

    @property
    def snapshots(self) -> list[Snapshot]:
        return [reading.snapshot for reading in self.readings if reading.snapshot is not None]

    @property
    def queues(self) -> list[QueueFigures]:
        """Every queue of every database read, by database (in settings order), then name."""
        return [figures for snapshot in self.snapshots for figures in snapshot.queues]

    @property
    def completed_exact(self) -> bool:
        return all(snapshot.completed_exact for snapshot in self.snapshots)

    @property
    def jobs(self) -> int | None:
        counts = [snapshot.jobs for snapshot in self.snapshots]
        return None if not counts or None in counts else sum(c for c in counts if c is not None)

    @property
    def late_schedules(self) -> list[Any]:
        return [late for snapshot in self.snapshots for late in snapshot.late_schedules]

    @property
    def merged(self) -> Snapshot:
        """Every database read as one snapshot: their queues, jobs and late schedules."""
        return Snapshot(
            queues=self.queues,
            jobs=self.jobs,
            completed_exact=self.completed_exact,
            late_schedules=self.late_schedules,
        )

    @property
    def totals(self) -> QueueFigures:
        """The sum over every database read (an estimate of completed jobs if any is one)."""
        return self.merged.totals

    def as_dict(self) -> dict[str, Any]:
        """``queue_stats --json``: the single-database keys over all databases, plus a
        section per database."""
        return {
            **self.merged.as_dict(),
            "databases": {reading.alias: _section(reading) for reading in self.readings},
        }


def _section(reading: DatabaseReading) -> dict[str, Any]:
    section: dict[str, Any] = {"up": reading.up, "read_from": reading.read_from}
    if reading.snapshot is None:
        return {**section, "error": reading.error}
    data = reading.snapshot.as_dict()
    return {**section, "totals": data["totals"], "jobs": data["jobs"], "queues": data["queues"]}


def collect_all(databases: Sequence[str] | None = None, *, exact: bool = False) -> Overview:
    """Read the figures of each alias in `databases` (default: every queue database)."""
    conf = get_settings()
    overview = Overview()
    for alias in databases or conf.queue_databases:
        reading = DatabaseReading(alias, conf.read_database(alias))
        try:
            snapshot = collect(reading.read_from, exact=exact)
        except DatabaseError as exc:
            logger.warning("reading the queue figures of database %r failed: %s", alias, exc)
            reading.error = str(exc).strip() or type(exc).__name__
        else:
            for figures in snapshot.queues:
                figures.database = alias
            reading.snapshot = snapshot
        overview.readings.append(reading)
    return overview
