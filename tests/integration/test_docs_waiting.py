"""The Python blocks of the waiting how-to and of the testing how-to's helpers, run as written.

Each block runs in a namespace of its own; the functions a block defines (a test, an
async helper) are then called the way the page says to call them.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from qa.tasks import add

from django_pgqueue.registry import registry
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def blocks(page: str) -> list[str]:
    return BLOCK.findall((ROOT / "docs" / "howto" / page).read_text("utf-8"))


def run(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "docs_block"}
    exec(compile(code, "<docs block>", "exec"), namespace)
    return namespace


@pytest.fixture(autouse=True)
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The handlers the blocks register are gone after the test."""
    monkeypatch.setattr(registry, "_handlers", dict(registry._handlers))


def test_the_waiting_page_runs_as_written(run_worker):
    wait_block, async_block, tasks_block = blocks("wait-for-results.md")
    run_worker(["default", "qa-tasks"])

    assert run(wait_block)["result"] == {"total": 42}

    total_of = run(async_block)["total_of"]

    async def script() -> int:
        try:
            return await total_of([1, 2, 3])  # aenqueue, then wait_async
        finally:
            # aenqueue's connection is asgiref's own thread's, in a script run by
            # asyncio.run (as the async ORM's would be): close it before the test ends.
            await sync_to_async(connections.close_all)()

    assert asyncio.run(script()) == 6

    receipt_address = run(tasks_block)["receipt_address"]
    assert receipt_address(add.enqueue(2, 3)) == 5


def test_the_testing_pages_helper_blocks_run_as_written():
    helpers = [
        code for code in blocks("testing.md") if "make_context" in code or "fire_tick" in code
    ]
    assert len(helpers) == 4
    for code in helpers:
        namespace = run(code)
        tests = [value for name, value in namespace.items() if name.startswith("test_")]
        assert tests, "each block shows a test"
        for test in tests:
            test()
