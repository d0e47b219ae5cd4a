"""Options the maintenance commands share: how much one statement does, and a dry run."""

from __future__ import annotations

from django.core.management.base import CommandParser


def add_batch_options(parser: CommandParser, default: int, batch: str, dry_run: str) -> None:
    """Add --batch-size (`batch` says what one batch is) and --dry-run (`dry_run` what it does)."""
    parser.add_argument(
        "--batch-size", type=int, default=default, help=f"{batch} (default: {default})."
    )
    parser.add_argument("--dry-run", action="store_true", help=dry_run)
