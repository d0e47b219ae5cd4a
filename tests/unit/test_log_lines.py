"""Every log line about a job carries its facts as structured fields: a log shipper can
filter on `extra={"job_id": ..., "queue": ..., "attempt": ..., "worker_id": ...}`
without parsing the message."""

from __future__ import annotations

import ast
from pathlib import Path

import django_pgqueue

PACKAGE = Path(django_pgqueue.__file__).parent
LEVELS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def _names_a_job(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "job_id":
            return True
        if isinstance(sub, ast.Name) and sub.id == "job_id":
            return True
    return False


def test_every_log_line_about_a_job_has_its_extra_fields():
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LEVELS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "logger"
            ):
                continue
            if any(_names_a_job(arg) for arg in node.args[1:]) and not any(
                keyword.arg == "extra" for keyword in node.keywords
            ):
                bare.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert bare == []
