"""The QA handlers' ledger: each execution's start and end, as qa_ledger rows on the
job's own database, so tests can count executions and their overlaps."""

from __future__ import annotations

import os

from django.db import DEFAULT_DB_ALIAS, connections

from django_pgqueue import JobContext


def ledger_start(ctx: JobContext) -> tuple[str, int]:
    # On the job's own database: job ids are counted per database.
    alias = ctx.database or DEFAULT_DB_ALIAS
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "INSERT INTO qa_ledger (job_id, lease_version, attempt, pid, worker_id, started_at) "
            "VALUES (%s, %s, %s, %s, %s, clock_timestamp()) RETURNING id",
            [ctx.job_id, ctx.lease_version, ctx.attempt, os.getpid(), ctx.worker_id],
        )
        return alias, cursor.fetchone()[0]


def ledger_end(entry: tuple[str, int]) -> None:
    alias, ident = entry
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE qa_ledger SET finished_at = clock_timestamp() WHERE id = %s", [ident]
        )
