"""The sequences block of the multi-tenant how-to, run as written: its jobs run one at a
time, in enqueue order, on four handler threads."""

from __future__ import annotations

import re

import pytest

from django_pgqueue.registry import registry
from django_pgqueue.testing import run_due_jobs
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def sequences_blocks() -> list[str]:
    page = (ROOT / "docs" / "howto" / "many-tenants.md").read_text("utf-8")
    section = page.split("## Sequences\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)


def test_the_sequences_blocks_run_their_jobs_in_order(monkeypatch, capsys):
    monkeypatch.setattr(registry, "_handlers", dict(registry._handlers))  # its handler goes
    blocks = sequences_blocks()
    assert len(blocks) == 2  # enqueue(), then enqueue_many()
    namespace = {"__name__": "b"}
    for block in blocks:
        exec(compile(block, "<many-tenants.md sequences>", "exec"), namespace)
    counts = run_due_jobs(["billing"], concurrency=4)
    assert counts["completed"] == 7
    lines = capsys.readouterr().out.splitlines()
    # Each customer's sequence in its order (the two sequences' jobs may interleave).
    assert [line for line in lines if line.startswith("customer 42:")] == [
        "customer 42: invoice.created",
        "customer 42: invoice.paid",
        "customer 42: invoice.refunded",
        "customer 42: receipt.sent",
    ]
    assert [line for line in lines if line.startswith("customer 7:")] == [
        "customer 7: invoice.created",
        "customer 7: invoice.paid",
        "customer 7: invoice.refunded",
    ]
