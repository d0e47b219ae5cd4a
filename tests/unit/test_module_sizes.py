"""The package stays in rooms a newcomer can read: the sizes are an alarm, not a law.

A module over MAX_MODULE lines, or a class over MAX_CLASS, is either cut where its
concepts part, or listed in LARGER with the reason its one concept needs the lines
(and the most it may grow to, so the alarm rings again past that).
"""

import ast
from pathlib import Path

import django_pgqueue

MAX_MODULE = 450
MAX_CLASS = 300
PACKAGE = Path(django_pgqueue.__file__).parent

# Modules and classes that hold one concept in more lines: (most lines, why).
LARGER: dict[str, tuple[int, str]] = {
    "migrations/0001_squashed_0029_enqueue_statement_work.py": (
        2150,
        "the whole schema as one frozen migration: its tables and the text of its "
        "PL/pgSQL functions, never edited once released",
    ),
    "migrations/0001_squashed_0029_enqueue_statement_work.py:Migration": (
        870,
        "the operations that create every table, each with its columns, indexes and "
        "constraints, then the SQL they do not declare",
    ),
    "worker/lifecycle.py:Worker": (
        340,
        "a worker process's life: the parts it wires, its start and shutdown (the hold "
        "included), and what it answers its supervisor and its operators (the state it "
        "starts in and the listen turn it shares with its siblings included)",
    ),
    "worker/dispatcher.py:Dispatcher": (
        325,
        "one claim cycle and its hand-offs: what to claim with the room it has, the "
        "claims and their fencing, the listen turn given up when it is full, and the "
        "sleep until the next job or NOTIFY (the controls' view read before it)",
    ),
    "worker/aio.py:AsyncPool": (
        360,
        "the event loop's whole side of the hold: starting tasks within the limit, "
        "their cancellation for four reasons, and reporting each job once its task "
        "ended; cut in two, both halves would share the same lock and task table",
    ),
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _over(name: str, size: int, limit: int) -> bool:
    allowed, _why = LARGER.get(name, (limit, ""))
    return size > allowed


def test_no_module_is_over_the_limit():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text("utf-8").splitlines())
        for path in _modules()
    }
    over = {name: n for name, n in sizes.items() if _over(name, n, MAX_MODULE)}
    assert not over


def test_no_class_is_over_the_limit():
    over = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                size = node.end_lineno - first + 1
                name = f"{path.relative_to(PACKAGE)}:{node.name}"
                if _over(name, size, MAX_CLASS):
                    over[name] = size
    assert not over


def test_every_larger_entry_is_still_needed():
    # An entry whose room shrank back under the limit goes: the list stays honest.
    names = {str(path.relative_to(PACKAGE)) for path in _modules()}
    sizes: dict[str, int] = {}
    for path in _modules():
        rel = str(path.relative_to(PACKAGE))
        sizes[rel] = len(path.read_text("utf-8").splitlines())
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                sizes[f"{rel}:{node.name}"] = node.end_lineno - first + 1
    stale = [
        name
        for name in LARGER
        if name.split(":")[0] not in names
        or sizes.get(name, 0) <= (MAX_CLASS if ":" in name else MAX_MODULE)
    ]
    assert not stale
