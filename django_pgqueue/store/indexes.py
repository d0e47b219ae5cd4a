"""The hot indexes' upkeep statements: their sizes, their live entries, their rebuild.

Run on a session of their own (a worker's upkeep thread, or a caller's `Session`):
REINDEX CONCURRENTLY and DROP INDEX CONCURRENTLY cannot run inside a transaction
block and take as long as the index is large, so they never share the connection that
claims and completes jobs.
"""

from __future__ import annotations

from typing import NamedTuple

from psycopg import sql

from ..sql import QUERIES
from .session import Session

# The hot partial indexes of queue_job_state, by the key index_live_entries counts them.
HOT_INDEXES = (
    "queue_job_state_claim_idx",
    "queue_job_state_running_idx",
    "queue_job_state_live_key_unique",
    "queue_job_state_run_key_idx",
)
_PREFIX = "queue_job_state_"


class IndexSize(NamedTuple):
    """One hot index (or a leftover copy of one) as index_sizes sees it."""

    name: str
    pages: int
    valid: bool
    # Some index of queue_job_state is being built right now (by anyone).
    building: bool

    @property
    def leftover(self) -> bool:
        """A copy an interrupted REINDEX CONCURRENTLY left (<name>_ccnew, <name>_ccold)."""
        return self.name not in HOT_INDEXES


def sizes(session: Session) -> list[IndexSize]:
    """The hot indexes' pages, and any leftover copies of them."""
    return [IndexSize(*row) for row in session.run("index_sizes", {})]


def live_entries(session: Session, caps: dict[str, int]) -> dict[str, int]:
    """Each hot index's live entries, counted through the index up to its cap."""
    params = {name.removeprefix(_PREFIX): int(caps.get(name, 0)) for name in HOT_INDEXES}
    with (
        session.holding("index_live_entries") as conn,
        conn.transaction(),
        conn.cursor() as cursor,
    ):
        cursor.execute(QUERIES["index_walk_forced"], {})
        cursor.execute(QUERIES["index_live_entries"], params)
        row = cursor.fetchone()
    assert row is not None
    return dict(zip(HOT_INDEXES, (int(n) for n in row), strict=True))


def rebuild(session: Session, name: str) -> None:
    """REINDEX INDEX CONCURRENTLY one hot index (as long as building it takes)."""
    _ddl(session, "index_rebuild", _known(name, leftover=False))


def drop_leftover(session: Session, name: str) -> None:
    """DROP INDEX CONCURRENTLY an invalid copy left by an interrupted rebuild."""
    _ddl(session, "index_drop_leftover", _known(name, leftover=True))


def _known(name: str, *, leftover: bool) -> str:
    """`name`, refused unless it is a hot index (or, with leftover, a copy of one)."""
    base = name.rstrip("0123456789").removesuffix("_ccnew").removesuffix("_ccold")
    is_copy = base != name
    if base not in HOT_INDEXES or is_copy != leftover:
        raise ValueError(f"{name!r} is not a {'leftover copy of a ' if leftover else ''}hot index")
    return name


def _ddl(session: Session, statement: str, index: str) -> None:
    text = sql.SQL(QUERIES[statement]).format(index=sql.Identifier(index))  # type: ignore[arg-type]
    with session.holding(statement) as conn, conn.cursor() as cursor:
        cursor.execute(text)
