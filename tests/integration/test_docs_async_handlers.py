"""docs/howto/async-handlers.md: its Python blocks run as written, and the handlers it
shows do what the page says in a real worker."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import threading
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_pgqueue import enqueue
from django_pgqueue.models import JobState
from django_pgqueue.registry import registry
from tests.conftest import ROOT
from tests.integration.test_worker import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = (ROOT / "docs" / "howto" / "async-handlers.md").read_text("utf-8")
BLOCKS = re.findall(r"```python\n(.*?)\n```", PAGE, re.DOTALL)


@pytest.fixture(scope="module")
def page_namespace() -> dict[str, Any]:
    """Every block of the page run in order in one namespace, as one module would be."""
    namespace: dict[str, Any] = {"__name__": "docs_async_handlers"}
    for block in BLOCKS:
        if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the backport
            block = block.replace("from django.tasks import", "from django_tasks import")
        exec(compile(block, "docs/howto/async-handlers.md", "exec"), namespace)
    return namespace


def test_the_page_has_its_blocks():
    assert len(BLOCKS) == 5


def test_the_page_registers_async_handlers(page_namespace):
    for type_ in ("accounts.greet", "accounts.welcome", "invoices.render", "webhooks.deliver"):
        handler = registry.find(type_)
        assert handler is not None, type_
        assert handler.coroutine is not None, type_
    task = page_namespace["send_welcome"]
    assert asyncio.iscoroutinefunction(task.func)


def test_the_page_handlers_run_on_the_event_loop(page_namespace, run_worker):
    user = User.objects.create(username="ada")
    port, served = _line_server()
    jobs = [
        enqueue("accounts.greet", {"user_id": user.pk}, queue="docs_async"),
        enqueue("invoices.render", {"order_id": 7}, queue="docs_async"),
        enqueue(
            "webhooks.deliver",
            {"host": "127.0.0.1", "port": port, "body": "paid"},
            queue="docs_async",
        ),
    ]
    worker = run_worker(["docs_async"], poll_interval=0.1)
    for job in jobs:
        wait_until(lambda job=job: JobState.objects.get(pk=job.id).status == "completed", 60)
    assert worker.worker.event_loop.started
    assert served == [b"paid\n"]


def _line_server() -> tuple[int, list[bytes]]:
    """A local server that answers each line with itself; the lines it got."""
    import socket

    served: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            line = conn.makefile("rb").readline()
            served.append(line)
            conn.sendall(line)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], served


def test_the_page_enqueues_from_an_async_handler(page_namespace, run_worker):
    from django_pgqueue.models import Job

    user = User.objects.create(username="bo", is_active=False)
    job = enqueue("accounts.welcome", {"user_id": user.pk}, queue="docs_async")
    run_worker(["docs_async", "default"], burst=True).join()  # greet: the default queue
    assert JobState.objects.get(pk=job.id).status == "completed"
    user.refresh_from_db()
    assert user.is_active
    greets = Job.objects.filter(type="accounts.greet", payload={"user_id": user.pk})
    states = sorted(JobState.objects.filter(pk__in=greets).values_list("status", flat=True))
    # The one enqueued with the update ran; the reminder waits for its week.
    assert states == ["completed", "pending"]
