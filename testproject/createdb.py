"""Create the project's database if missing, say which one it is, and maybe run a command.

`createdb.py` alone prints the line naming the database; `createdb.py -- CMD ARGS...`
then runs CMD with DATABASE_URL set to it, which is how the Makefile's targets reach an
embedded server (testproject/embedded_pg.py picks the database).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from embedded_pg import EmbeddedError, choose
from psycopg import sql
from testproject.dburl import database_from_url, describe


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    try:
        choice = choose()
        db = database_from_url(choice.url)
    except (EmbeddedError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    params = {
        "host": db["HOST"] or None,
        "port": db["PORT"] or None,
        "user": db["USER"] or None,
        "password": db["PASSWORD"] or None,
        **db["OPTIONS"],
    }
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
    except psycopg.OperationalError as exc:
        print(f"error: cannot reach PostgreSQL at {describe(db)}: {exc}", file=sys.stderr)
        print(
            "       start it, or set DATABASE_URL=postgres://user@host:port/name", file=sys.stderr
        )
        return 1
    created = "" if exists else " (created)"
    print(f"database: {describe(db)}{created}: {choice.origin}")
    sys.stdout.flush()
    if command:
        os.execvpe(command[0], command, {**os.environ, "DATABASE_URL": choice.url})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
