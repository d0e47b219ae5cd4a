"""What the operator commands print: counts in the right number, marks that are explained,
a zero age for prune, and one clear line instead of a traceback when the database is wrong."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from tests.conftest import MANAGE, sql
from tests.factories import job_exists as exists
from tests.factories import make_job
from tests.factories import run_command as run

pytestmark = pytest.mark.django_db


def test_prune_older_than_zero_deletes_every_finished_job():
    finished = [make_job(status, finished_ago="1 second") for status in ("completed", "dead")]
    unfinished = [make_job("pending"), make_job("running")]
    out = run("prune_queue_jobs", "--older-than", "0s")
    assert out.startswith("Deleted 2 jobs that finished before "), out
    assert not any(exists(job_id) for job_id in finished)
    assert all(exists(job_id) for job_id in unfinished)


def test_commands_count_one_job_in_the_singular():
    make_job("completed", finished_ago="10 days")
    dry = run("prune_queue_jobs", "--older-than", "7d", "--dry-run")
    assert "would delete 1 job that finished" in dry, dry
    out = run("prune_queue_jobs", "--older-than", "7d")
    assert "Deleted 1 job that finished" in out, out
    assert "in 1 batch of at most" in out, out

    make_job("dead")
    assert "Dry run: 1 dead job matches;" in run("requeue_dead", "--dry-run")
    assert run("requeue_dead").startswith("1 dead job matched.")


def _completed_column_and_footnotes(out: str) -> tuple[list[str], dict[str, str]]:
    """The completed cells of the table (queues, then totals) and the footnotes by mark."""
    lines = out.split("\n\n")[0].splitlines()  # the table and its footnotes; workers follow
    notes = {line[0]: line for line in lines if line.startswith(("~", "—"))}
    rows = [
        re.split(r"\s{2,}", line.strip())  # columns are two spaces apart, cells have one
        for line in lines
        if line.strip() and not set(line) <= {"-", " "} and line[0] not in notes
    ]
    index = rows[0].index("completed")
    return [row[index] for row in rows[1:]], notes


@pytest.mark.parametrize("analyzed", [False, True])
def test_queue_stats_explains_every_mark_it_shows_and_no_other(analyzed):
    make_job("completed", queue="mail")
    make_job("pending", queue="mail")
    make_job("dead", queue="billing")
    if analyzed:
        sql("ANALYZE queue_jobs")
        sql("ANALYZE queue_job_state")
    cells, notes = _completed_column_and_footnotes(run("queue_stats"))
    shown = {cell[0] for cell in cells if cell[0] in "~—"}
    assert shown == set(notes), (cells, notes)
    exact_cells, exact_notes = _completed_column_and_footnotes(run("queue_stats", "--exact"))
    assert exact_notes == {}
    assert exact_cells == ["0", "1", "1"]  # billing, mail, all queues


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("url", "command", "message"),
    [
        ("sqlite:///tmp/db.sqlite3", "check", "error: DATABASE_URL must be a postgres:// URL"),
        ("FREE_PORT", "run_demo", "CommandError: cannot reach PostgreSQL at postgresql://"),
    ],
)
def test_a_wrong_database_is_one_clear_line_not_a_traceback(url, command, message):
    url = url.replace("FREE_PORT", f"postgres://postgres@127.0.0.1:{_free_port()}/nowhere")
    done = subprocess.run(
        [sys.executable, str(MANAGE), command],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert re.search(re.escape(message), done.stderr), done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
