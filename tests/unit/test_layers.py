"""The package's floors: each room imports only rooms on its own floor or below, and no
two rooms import each other, directly or round a loop.

A room is a top-level module or subpackage of django_pgqueue/. Every import counts:
module level, inside a function, and under TYPE_CHECKING. docs/architecture.md draws
the floors; a new room must be given one here.
"""

from __future__ import annotations

import ast
import pickle
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import tomllib

import django_pgqueue

PACKAGE = Path(django_pgqueue.__file__).parent
ROOT = PACKAGE.parent

FOUNDATIONS, DATA, CORE, FEATURES, WORKER, INTEGRATIONS = range(6)
FLOORS = {
    # Foundations: no database connection, no settings.
    "validators": FOUNDATIONS,
    "durations": FOUNDATIONS,
    "exceptions": FOUNDATIONS,
    "encoding": FOUNDATIONS,
    "validation": FOUNDATIONS,
    "sql": FOUNDATIONS,
    "models": FOUNDATIONS,
    "outcomes": FOUNDATIONS,
    "context": FOUNDATIONS,
    "signals": FOUNDATIONS,
    "version": FOUNDATIONS,
    "prune_policy": FOUNDATIONS,
    "unique": FOUNDATIONS,
    # The data layer: the only code that runs the SQL.
    "store": DATA,
    # Core services, and the seam the features plug into.
    "conf": CORE,
    "queue_routes": CORE,
    "limits": CORE,
    "worker_config": CORE,
    "registry": CORE,
    "retry": CORE,
    "executor": CORE,
    "claimed": CORE,
    "extensions": CORE,
    "enqueue": CORE,
    "sequences": CORE,
    "enqueue_types": CORE,
    "aenqueue": CORE,
    "enqueue_scope": CORE,
    "actions": CORE,
    "maintenance": CORE,
    "index_upkeep": CORE,
    "lifecycle_signals": CORE,
    "task_paths": CORE,
    "waiting": CORE,
    "job_refs": CORE,
    "durable": CORE,
    # Features: they import the core, and nothing below the worker imports them.
    "control": FEATURES,
    "schedules": FEATURES,
    "workflows": FEATURES,
    "observability": FEATURES,
    "worker": WORKER,
    "supervisor": WORKER,
    # Integrations: Django's admin, the Tasks backend, commands, metrics, app loading.
    "admin": INTEGRATIONS,
    "tasks": INTEGRATIONS,
    "backends": INTEGRATIONS,
    "management": INTEGRATIONS,
    "metrics": INTEGRATIONS,
    "checks": INTEGRATIONS,
    "stats": INTEGRATIONS,
    "overview": INTEGRATIONS,
    "testing": INTEGRATIONS,
    "startup": INTEGRATIONS,
    "apps": INTEGRATIONS,
    "jobs": INTEGRATIONS,
    "__init__": INTEGRATIONS,
}
MAX_LOCAL_IMPORTS = 5
# Rooms that may execute SQL: the store runs it, sql/ loads it (migrations are not rooms).
RUNS_SQL = {"store", "sql"}
# Calls that execute SQL or hand out what does: a cursor's or connection's execute, a
# cursor, a session's raw connection, pipeline or hold, the ORM's raw SQL.
EXECUTING_CALLS = {"execute", "executemany", "cursor", "raw", "holding", "pipelined"}
# The store's own helpers that run a statement given by name on Django's connection.
STORE_HELPERS = {"django_cursor", "fetch_all", "fetch_one", "fetch_after"}
ISSUE_REFERENCE = re.compile(r"#.*\bissue \d+|\(issue \d+\)", re.IGNORECASE)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _parse(path: Path) -> ast.Module:
    """The module's syntax tree. CPython 3.11.7 can raise SystemError ("AST constructor
    recursion depth mismatch") in a process whose earlier tests left its recursion
    bookkeeping off; a fresh interpreter then parses the same file."""
    try:
        return ast.parse(path.read_text("utf-8"))
    except SystemError:
        code = (
            "import ast, pickle, sys; "
            "sys.stdout.buffer.write(pickle.dumps(ast.parse(open(sys.argv[1]).read())))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, check=True
        )
        return pickle.loads(done.stdout)


def _imports(path: Path, root: Path = ROOT) -> list[tuple[str, ast.stmt, bool]]:
    """(target module, statement, inside a function) for each own-package import."""
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    package = module.split(".")[:-1]
    tree = _parse(path)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    local = {id(node) for f in functions for node in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{target}.{a.name}" for a in node.names] if not node.module else [target]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found += [(t, node, id(node) in local) for t in targets if t.startswith("django_pgqueue.")]
    return found


def _edges() -> dict[str, dict[str, str]]:
    """room -> {room it imports: where (path:line)}."""
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for path in _sources():
        room = _room(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for target, node, _ in _imports(path):
            other = _room(target)
            if other not in (room, "__init__"):
                edges[room].setdefault(other, f"{path.relative_to(ROOT)}:{node.lineno}")
    return edges


def _cycle(edges: dict[str, dict[str, str]]) -> list[str] | None:
    """One loop of imports between rooms, as the rooms in order, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(room: str) -> list[str] | None:
        state[room] = 1
        path.append(room)
        for other in sorted(edges.get(room, {})):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (loop := visit(other)):
                return loop
        path.pop()
        state[room] = 2
        return None

    for room in sorted(edges):
        if room not in state and (loop := visit(room)):
            return loop
    return None


def test_every_room_has_a_floor():
    rooms = {_room(".".join(p.relative_to(ROOT).with_suffix("").parts)) for p in _sources()}
    assert rooms - set(FLOORS) == set(), "give each new room a floor in FLOORS"


def test_no_room_imports_a_room_above_its_floor():
    upward = [
        f"{room} -> {other} ({where})"
        for room, targets in _edges().items()
        for other, where in targets.items()
        if FLOORS[other] > FLOORS[room]
    ]
    assert upward == []


def test_no_import_cycle_between_rooms():
    loop = _cycle(_edges())
    assert loop is None, " -> ".join(loop or [])


def test_the_cycle_check_finds_a_loop():
    assert _cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b": ""}, "b": {}, "c": {"a": ""}}) is None


def _sql_executions(path: Path, root: Path = ROOT) -> list[str]:
    """Where the module at `path` executes SQL itself, as 'module:line what'."""
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    found = []
    for target, node, _ in _imports(path, root):
        # The statements (django_pgqueue.sql.QUERIES) or the store's cursor helpers.
        if _room(target) == "sql" or target.startswith("django_pgqueue.store.cursors"):
            found.append((node.lineno, f"imports {target}"))
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Attribute) and node.attr in {"raw", "introspection"}:
            found.append((node.lineno, f".{node.attr}"))  # a raw connection, a query
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0] if node.args else None
        by_name = isinstance(first, ast.Constant) and isinstance(first.value, str)
        if name in EXECUTING_CALLS - {"raw"} or name in STORE_HELPERS:
            found.append((node.lineno, f"{name}()"))
        elif name == "run" and by_name:
            found.append((node.lineno, f"run({first.value!r})"))  # a session's statement
    return [f"{module}:{line} {what}" for line, what in sorted(set(found))]


def test_only_the_store_executes_sql():
    """A module outside store/ runs no statement itself: it calls the store."""
    outside = [
        place
        for path in _sources()
        if _room(".".join(path.relative_to(ROOT).with_suffix("").parts)) not in RUNS_SQL
        for place in _sql_executions(path)
    ]
    assert outside == []


def test_the_sql_check_finds_each_way_of_running_sql(tmp_path):
    module = tmp_path / "django_pgqueue" / "probe.py"
    module.parent.mkdir()
    module.write_text(
        "from .sql import QUERIES\n"
        "from .store.cursors import fetch_all\n"
        "def f(conn, store, connection):\n"
        "    conn.execute(QUERIES['job_claim'])\n"
        "    store.run('job_claim', {})\n"
        "    connection.cursor()\n"
        "    store.raw\n"
        "    fetch_all('default', 'names_known')\n"
        "    worker.run()\n",  # a worker's run loop is not SQL
        "utf-8",
    )
    found = [place.split(" ", 1)[1] for place in _sql_executions(module, tmp_path)]
    assert found == [
        "imports django_pgqueue.sql",
        "imports django_pgqueue.store.cursors",
        "execute()",
        "run('job_claim')",
        "cursor()",
        ".raw",
        "fetch_all()",
    ]


def test_local_imports_are_few_and_say_why():
    local = []
    for path in _sources():
        lines = path.read_text("utf-8").splitlines()
        for _, node, inside in _imports(path):
            if not inside:
                continue
            above = " ".join(lines[max(0, node.lineno - 4) : node.lineno])
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            assert "# Local:" in above, f"{where}: say why this import must be local"
            local.append(where)
    assert len(set(local)) <= MAX_LOCAL_IMPORTS, local


def test_no_comment_names_an_issue():
    named = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _sources()
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if ISSUE_REFERENCE.search(line)
    ]
    assert named == []


def test_the_version_is_the_distributions():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert django_pgqueue.__version__ == project["version"]


def test_the_architecture_page_names_every_room_and_every_part_of_the_worker():
    """docs/architecture.md stays true to the code: every room stands on its floor
    there, and every module of worker/ has its row in the worker's table."""
    page = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    floors = page.split("## The floors", 1)[1].split("## ", 1)[0]
    missing_rooms = [
        room
        for room in FLOORS
        if room not in ("__init__", "apps")
        and not re.search(rf"\b{re.escape(room)}(/|\.py)", floors)
    ]
    assert missing_rooms == [], "rooms missing from the floors drawing"
    parts = sorted(p.stem for p in (PACKAGE / "worker").glob("*.py") if p.stem != "__init__")
    missing_parts = [part for part in parts if f"| `{part}.py` |" not in page]
    assert missing_parts == [], "worker modules missing from the worker's table"
