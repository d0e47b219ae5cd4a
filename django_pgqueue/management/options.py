"""Options the maintenance commands share: how much one statement does, a dry run, and
which queue database they work on."""

from __future__ import annotations

from django.core.management.base import CommandError, CommandParser

from django_pgqueue.conf import get_settings


def add_batch_options(parser: CommandParser, default: int, batch: str, dry_run: str) -> None:
    """Add --batch-size (`batch` says what one batch is) and --dry-run (`dry_run` what it does)."""
    parser.add_argument(
        "--batch-size", type=int, default=default, help=f"{batch} (default: {default})."
    )
    parser.add_argument("--dry-run", action="store_true", help=dry_run)


def add_database_option(parser: CommandParser, what: str) -> None:
    """Add --database ALIAS (`what` says what the command then does on that alias only)."""
    parser.add_argument(
        "--database", metavar="ALIAS", help=f"{what} (default: every queue database)."
    )


def database_option(alias: str | None) -> list[str]:
    """The aliases --database selects: every queue database (DATABASE first), or that one."""
    known = get_settings().queue_databases
    if alias is None:
        return list(known)
    if alias not in known:
        raise CommandError(
            f"--database: {alias!r} holds no queues; the queue databases are "
            f"{', '.join(known)} (PGQUEUE['DATABASE'] and PGQUEUE['QUEUE_DATABASES'])."
        )
    return [alias]
