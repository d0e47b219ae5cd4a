"""The statements of django_pgqueue/sql/: one file per feature, each statement written
whole in its file, each name defined once, and every name the store runs defined.

The loader only splits the files into blocks: every statement sent is a run of lines
of one file, so none is assembled from another's text. The store is the only code that
runs them (tests/unit/test_layers.py), so its calls name every statement in use.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import django_pgqueue
from django_pgqueue.sql import QUERIES, load, load_folder

PACKAGE = Path(django_pgqueue.__file__).parent
SQL = PACKAGE / "sql"
STORE = PACKAGE / "store"
FEATURES = {
    "core",
    "control",
    "workflows",
    "schedules",
    "observability",
    "admin",
    "durable",
    "fair",
    "sequences",
}
# DDL takes no parameters: these statements name their index with a psycopg.sql
# placeholder, {index}, filled with sql.Identifier (store/indexes.py).
IDENTIFIERS = {"index_rebuild": ["{index}"], "index_drop_leftover": ["{index}"]}
# A format placeholder: what str.format or psycopg.sql would fill in.
PLACEHOLDER = re.compile(r"\{[A-Za-z_]\w*\}")
# How the store names the statement it runs: QUERIES[name], session.run(name, ...), the
# Django-connection helpers, the DDL helper (argument positions of the name).
RUNNERS = {
    "run": (0,),
    "fetch_all": (1,),
    "fetch_after": (1, 2),
    "_ddl": (1,),
    "_pipeline": (3, 5),
    "_fair_statement": (1,),
    "_insert_one": (1,),
}


def _files() -> dict[str, str]:
    return {path.stem: path.read_text("utf-8") for path in sorted(SQL.glob("*.sql"))}


def test_one_file_per_feature():
    assert set(_files()) == FEATURES


def test_the_loader_only_splits_the_files_into_blocks():
    assert load_folder(SQL) == QUERIES
    defined = {name: feature for feature, text in _files().items() for name in load(text)}
    assert set(defined) == set(QUERIES)
    for name, statement in QUERIES.items():
        header, _, body = statement.partition("\n")
        # The name line, then the statement as its file has it, line for line: only the
        # describing comment lines between them are left out.
        assert header == f"-- name: {name}"
        text = _files()[defined[name]]
        assert f"{header}\n" in text, name
        assert f"\n{body};\n" in text, name


def test_no_statement_holds_a_mark_or_a_placeholder():
    """What text replacement would need: a comment naming another statement where its
    text goes, or a format placeholder (but the DDL's identifiers)."""
    for name, statement in QUERIES.items():
        body = statement.partition("\n")[2]
        for line in body.splitlines():
            comment = line.partition("--")[2].strip()
            mark = comment.split(":", 1)[0]
            assert not (":" in comment and mark in QUERIES), f"{name}: {line.strip()}"
        assert PLACEHOLDER.findall(body) == IDENTIFIERS.get(name, []), name


def test_a_name_defined_twice_is_refused(tmp_path):
    with pytest.raises(ValueError, match="twice"):
        load("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")
    (tmp_path / "one.sql").write_text("-- name: a\nSELECT 1;\n")
    (tmp_path / "two.sql").write_text(
        "-- about b\n\n-- name: b\nSELECT 2;\n-- name: a\nSELECT 3;\n"
    )
    with pytest.raises(ValueError, match=r"two\.sql defines 'a', which one\.sql defines"):
        load_folder(tmp_path)


def test_only_comments_stand_outside_a_block():
    with pytest.raises(ValueError, match="before the first block"):
        load("SELECT 0;\n-- name: a\nSELECT 1;")
    with pytest.raises(ValueError, match="must end with"):
        load("-- name: a\nSELECT 1;\nSELECT 2\n-- name: b\nSELECT 3;")


def _names_run(tree: ast.AST) -> set[str]:
    """The statement names a module of the store runs or returns to be run."""

    def text(node: ast.AST) -> str | None:
        return (
            node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        )

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "QUERIES":
            found.add(text(node.slice) or "")
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            for position in RUNNERS.get(called, ()):
                if position < len(node.args):
                    argument = node.args[position]
                    # One of two statements, chosen by a condition: both are run.
                    choices = (
                        [argument.body, argument.orelse]
                        if isinstance(argument, ast.IfExp)
                        else [argument]
                    )
                    found.update(name for choice in choices if (name := text(choice)))
        elif (
            isinstance(node, ast.Return)
            and isinstance(node.value, ast.Tuple)
            and node.value.elts
            and (name := text(node.value.elts[0]))
        ):
            found.add(name)  # a statement chosen for the caller to run: return name, params
    found.discard("")
    return found


def test_every_statement_the_store_runs_is_defined_and_every_one_defined_is_run():
    used: set[str] = set()
    for path in sorted(STORE.glob("*.py")):
        used |= _names_run(ast.parse(path.read_text("utf-8")))
    assert used - set(QUERIES) == set(), "run but not defined"
    assert set(QUERIES) - used == set(), "defined but never run"
