"""The glob-keyed lookups of the PGQUEUE setting: `Routes` (ROUTES: a job type's queue)
and `QueueDatabases` (QUEUE_DATABASES: a queue's database alias).

Each holds the exact keys for a dict lookup and the globs in declared order; `conf`
validates the setting and builds them (and re-exports them).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Routes:
    """PGQUEUE["ROUTES"] split for lookup: exact types, then globs in declared order."""

    exact: dict[str, str]
    globs: tuple[tuple[str, str], ...]

    def queue(self, type_: str) -> str | None:
        """The queue of the exact route for `type_`, else of its first matching glob."""
        queue = self.exact.get(type_)
        if queue is not None or not self.globs:
            return queue
        for pattern, queue in self.globs:
            if fnmatchcase(type_, pattern):
                return queue
        return None


@dataclass(frozen=True)
class QueueDatabases:
    """PGQUEUE["QUEUE_DATABASES"] split for lookup: exact queue names, then globs in order."""

    exact: dict[str, str]
    globs: tuple[tuple[str, str], ...]

    def alias(self, queue: str, default: str) -> str:
        """The alias holding `queue`: its exact entry, else its first matching glob."""
        alias = self.exact.get(queue)
        if alias is not None:
            return alias
        for pattern, alias in self.globs:
            if fnmatchcase(queue, pattern):
                return alias
        return default

    def __bool__(self) -> bool:
        """True when any queue is routed: only then does enqueue look at other databases."""
        return bool(self.exact or self.globs)

    def aliases(self) -> tuple[str, ...]:
        """The aliases named, each once, in declared order."""
        named = [*self.exact.values(), *(alias for _, alias in self.globs)]
        return tuple(dict.fromkeys(named))
