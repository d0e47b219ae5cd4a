"""Every Python block of the workflow pages runs, in order, against the real database."""

from __future__ import annotations

import re

import pytest

from django_pgqueue.registry import registry
from tests.conftest import ROOT, sql

pytestmark = pytest.mark.django_db(transaction=True)

PAGES = ["docs/howto/replace-celery-canvas.md", "docs/concepts/workflows.md"]
BLOCK = re.compile(r"```python\n(.*?)\n```", re.DOTALL)


def test_the_canvas_how_to_runs_and_writes_each_workflow():
    text = (ROOT / PAGES[0]).read_text("utf-8")
    blocks = BLOCK.findall(text)
    assert len(blocks) == 12
    namespace: dict = {}
    before = 0
    written = []
    for code in blocks:
        exec(compile(code, PAGES[0], "exec"), namespace)  # the page's own code
        now = sql("SELECT count(*) FROM queue_workflows")[0][0]
        written.append(now - before)
        before = now
    # The two step() lines and the handlers write nothing; the rolled-back one neither;
    # the batch writes its callbacks' workflow; the rates chord is named.
    assert written == [0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0]
    assert registry.find("feeds.parse") is not None
    assert registry.find("imports.report") is not None
    assert sql("SELECT name, size FROM queue_batches") == [("import 12", 4)]
    steps = dict(
        sql(
            "SELECT w.name, count(*) FROM queue_workflows w "
            "JOIN queue_workflow_steps s ON s.workflow_id = w.id GROUP BY w.name"
        )
    )
    # chains: the feed (3), the chain of groups (5), the charge with its alert (3).
    assert steps == {
        "chain": 3 + 5 + 3,
        "group": 3,
        "chord": 3,
        "rates": 3,
        "nightly": 4,
        "import 12": 3,
    }


def test_the_concepts_page_has_no_code_to_run():
    assert BLOCK.findall((ROOT / PAGES[1]).read_text("utf-8")) == []
