"""A big workflow's statement: written without JIT compilation, the caller's setting kept."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from django_pgqueue import chain, group, step
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

Q = "wf"


@pytest.mark.slow
def test_a_big_workflow_is_written_without_compiling_its_statement():
    """The planner prices a workflow of 10,000 steps high enough to JIT-compile
    its statement, which takes longer than running it: it is sent with JIT off, and
    the caller's transaction keeps its own setting."""
    flow = group(*[chain(*[step("qa.noop", queue=Q)] * 100) for _ in range(100)])
    plans: list[str] = []
    connection.ensure_connection()
    connection.connection.add_notice_handler(lambda diag: plans.append(diag.message_primary))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for setting in ("log_min_duration = 0", "log_level = notice", "log_analyze = on"):
            cursor.execute(f"SET LOCAL auto_explain.{setting}")
        cursor.execute("SET LOCAL jit_above_cost = 100000")  # the default, whatever the server's
        run = flow.enqueue()
        cursor.execute("SELECT current_setting('jit')")
        assert cursor.fetchone()[0] == "on"
    inserts = [plan for plan in plans if "INSERT INTO queue_workflows" in plan]
    assert len(inserts) == 1, plans
    assert "JIT:" not in inserts[0], inserts[0][-2000:]
    assert len(run.jobs) == 10_000
    assert sql("SELECT count(*) FROM queue_job_deps")[0][0] == 9_900
