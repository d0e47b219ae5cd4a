"""The Python blocks of the many-tenants how-to, run as written, in page order, the
settings block given to Django first."""

from __future__ import annotations

import re
from typing import Any

import pytest

from django_pgqueue.registry import registry
from tests.conftest import ROOT, sql

pytestmark = pytest.mark.django_db(transaction=True)
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_the_many_tenants_blocks_run(settings: Any, capsys: Any, monkeypatch: Any) -> None:
    # The blocks' handlers are registered for this test only (another test runs a block).
    monkeypatch.setattr(registry, "_handlers", dict(registry._handlers))
    page = (ROOT / "docs" / "howto" / "many-tenants.md").read_text("utf-8")
    blocks = BLOCK.findall(page)
    assert len(blocks) >= 5
    for code in blocks:
        namespace: dict[str, Any] = {"__name__": "docs_block"}
        exec(compile(code, "<docs block>", "exec"), namespace)
        if "PGQUEUE" in namespace:  # the settings block: the project's settings
            settings.PGQUEUE = {**getattr(settings, "PGQUEUE", {}), **namespace["PGQUEUE"]}
    keys = dict(sql("SELECT fair_key, count(*) FROM queue_job_state GROUP BY fair_key"))
    assert keys["tenant-7"] == 100_000
    assert keys["tenant-42"] == 1
    # The refusal of the charge block: no exception escaped, the message was printed.
    assert "already charging" not in capsys.readouterr().out
