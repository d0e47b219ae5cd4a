"""The sequences block of the multi-tenant how-to, run as written: its jobs run one at a
time, in enqueue order, on four handler threads."""

from __future__ import annotations

import re

import pytest

from django_pgqueue.registry import registry
from django_pgqueue.testing import run_due_jobs
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def sequences_block() -> str:
    page = (ROOT / "docs" / "howto" / "many-tenants.md").read_text("utf-8")
    section = page.split("## Sequences\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    return block


def test_the_sequences_block_runs_its_jobs_in_order(monkeypatch, capsys):
    monkeypatch.setattr(registry, "_handlers", dict(registry._handlers))  # its handler goes
    exec(compile(sequences_block(), "<many-tenants.md sequences>", "exec"), {"__name__": "b"})
    counts = run_due_jobs(["billing"], concurrency=4)
    assert counts["completed"] == 4
    assert capsys.readouterr().out.splitlines() == [
        "customer 42: invoice.created",
        "customer 42: invoice.paid",
        "customer 42: invoice.refunded",
        "customer 42: receipt.sent",
    ]
