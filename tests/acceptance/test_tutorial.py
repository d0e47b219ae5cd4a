"""docs/tutorial.md followed literally in an empty directory ends with a job done.

The project is built from the page's own code blocks (a Python block whose first line is
a comment naming a file is that file; "(add at the end)" appends to it) and the page's
own commands, run
in a temporary directory with this test's interpreter. Departures from typing them by
hand, and only these: the database is a fresh one named by PGDATABASE (which the page's
settings read), `createdb` is done with psycopg, `createsuperuser` gets --noinput and its
answers in the environment, and the POST that `curl` makes is made with urllib.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

PAGE = (ROOT / "docs" / "tutorial.md").read_text("utf-8")
BLOCK = re.compile(r"```python\n# (?P<caption>[^\n]+)\n(?P<code>.*?)\n```", re.DOTALL)
COMMANDS = [
    "django-admin startproject mysite .",
    "python manage.py startapp shop",
    "python manage.py makemigrations shop",
    "python manage.py migrate",
    "python manage.py createsuperuser",
    "python manage.py runserver",
    "python manage.py run_queue_worker default emails --burst",
]


def blocks() -> dict[str, tuple[str, bool]]:
    """Caption (the first line's comment) -> (code, appended) of every Python block of
    the page that opens with a comment."""
    found = {}
    for match in BLOCK.finditer(PAGE):
        caption = match.group("caption")
        appended = caption.endswith("(add at the end)")
        found[caption.removesuffix("(add at the end)").strip()] = (match.group("code"), appended)
    return found


def test_the_page_shows_every_command_the_test_runs():
    for command in COMMANDS:
        assert command in PAGE, command
    assert set(blocks()) == {
        "mysite/settings.py",
        "shop/models.py",
        "shop/tasks.py",
        "shop/jobs.py",
        "shop/views.py",
        "mysite/urls.py",
        "python manage.py shell",
    }


@pytest.fixture
def database() -> str:
    name = f"pgqueue_tutorial_{uuid.uuid4().hex[:8]}"
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params["dbname"] = "postgres"
    with psycopg.connect(autocommit=True, **params) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(autocommit=True, **params) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_tutorial_ends_with_its_jobs_done(tmp_path: Path, database: str):
    settings = connection.settings_dict
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PG"))},
        "PGDATABASE": database,
        "PGHOST": settings["HOST"] or "127.0.0.1",
        "PGPORT": str(settings["PORT"] or 5432),
        "PGUSER": settings["USER"] or "postgres",
        "PGPASSWORD": settings["PASSWORD"] or "",
        "DJANGO_SUPERUSER_USERNAME": "admin",
        "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
        "DJANGO_SUPERUSER_PASSWORD": "tutorial-password",
        "PYTHONPATH": "",
    }
    bin_dir = Path(sys.executable).parent

    def run(command: str, *extra: str, timeout: float = 120) -> str:
        args = command.split()
        program = [sys.executable] if args[0] == "python" else [str(bin_dir / args[0])]
        done = subprocess.run(
            [*program, *args[1:], *extra],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    run(COMMANDS[0])
    run(COMMANDS[1])
    for caption, (code, appended) in blocks().items():
        if "/" not in caption:
            continue  # the shell session, run below
        path = tmp_path / caption
        with path.open("a" if appended else "w", encoding="utf-8") as handle:
            handle.write(("\n" if appended else "") + code + "\n")
    run(COMMANDS[2])
    run(COMMANDS[3])
    run(COMMANDS[4], "--noinput")

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/checkout/", data=b"email=ada%40example.com"
                ) as response:
                    answer = json.loads(response.read())
                break
            except OSError:
                assert time.monotonic() < deadline, "runserver did not answer"
                time.sleep(0.3)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert f"It answers `{json.dumps(answer)}`" in PAGE, answer  # a fresh database

    log = run(COMMANDS[6])
    assert "stopped: {'claimed': 2, 'completed': 2}" in log, log
    assert "stopped: {'claimed': 2, 'completed': 2}" in PAGE

    shell = blocks()["python manage.py shell"][0]
    out = run("python manage.py shell", "-c", shell)
    assert out.strip().splitlines()[-1] == "SUCCESSFUL ada@example.com True", out
