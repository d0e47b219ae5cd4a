"""Create the project's database if it does not exist yet, and say which one is used."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from psycopg import sql
from testproject.dburl import database_from_url, describe


def main() -> int:
    db = database_from_url()
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
                print(f"created database {describe(db)}")
    except psycopg.OperationalError as exc:
        print(f"error: cannot reach PostgreSQL at {describe(db)}: {exc}", file=sys.stderr)
        print(
            "       start it, or set DATABASE_URL=postgres://user@host:port/name", file=sys.stderr
        )
        return 1
    print(f"database: {describe(db)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
