"""Turn DATABASE_URL (postgres://user:password@host:port/name?option=value) into a
Django DATABASES entry. Small on purpose: the project needs nothing more."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pgqueue"


def database_from_url(url: str | None = None) -> dict[str, Any]:
    url = url or os.environ.get("DATABASE_URL") or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError(f"DATABASE_URL must be a postgres:// URL, got scheme {parts.scheme!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # Numbers as numbers: psycopg wants an int for prepare_threshold (libpq
        # options such as connect_timeout take either).
        "OPTIONS": {
            key: int(value) if value.isdigit() else value for key, value in parse_qsl(parts.query)
        },
        "TEST": {"NAME": os.environ.get("PGQUEUE_TEST_DATABASE") or None},
    }


def describe(db: dict[str, Any]) -> str:
    """The database as a log line shows it, without the password."""
    user = f"{db['USER']}@" if db["USER"] else ""
    return f"postgresql://{user}{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
