"""`make demo` end to end: both parts run and the summary agrees with the tables."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_run_demo_summary_matches_the_tables():
    out = StringIO()
    call_command("run_demo", stdout=out)
    text = out.getvalue()
    assert "MISMATCH" not in text, text
    assert "summary matches the tables: yes" in text
    assert "-> 409" in text  # the out-of-stock order
    assert "2 requests for 1 charge" in text  # the retried payment
