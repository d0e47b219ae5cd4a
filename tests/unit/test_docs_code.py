"""Every Python block of the README and docs/ as a reader copies it.

A page is read top to bottom, so its blocks are taken together, in order: each block
must compile, every name a block uses must be imported or defined by it or an earlier
block of the page (or be one of `READER_NAMES`, the reader's own code the examples
call), every import of django_pgqueue or Django must import, and every ``PGQUEUE``
dict a block writes must validate. Every ``pip install`` line must name this
distribution (with extras it declares) or a path, never another project of a similar
name. docs/howto/coming-from-celery.md is also run, block after block
(tests/integration/test_celery_page.py).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import shlex
from pathlib import Path

import pytest
import tomllib

import django_pgqueue
from django_pgqueue import backends, testing
from django_pgqueue.conf import validate
from django_pgqueue.exceptions import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
PAGES = [page for page in PAGES if "_build" not in page.parts]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?:python|py)[ \t]*\n(?P<code>.*?)^(?P=indent)```",
    re.DOTALL | re.MULTILINE,
)
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
DISTRIBUTION = PROJECT["name"]
EXTRAS = set(PROJECT["optional-dependencies"])

# Names that stand for the reader's own code, which no page can import for them: their
# models, services and values in scope where the example runs (a view's request, the
# order being paid). A public name of django_pgqueue or Django is never one of these.
READER_NAMES = {
    "alert",  # the reader's paging function
    "chunks",  # and their import's helpers
    "load",
    "client",  # pytest-django's test client fixture
    "order",  # the order a view or test has at hand
    "orders",
    "provider",  # an SMS provider's client
    "result_id",  # a task result's id, kept from its enqueue
}
# Names a page may use from Django or the stdlib without showing the import: none.
PUBLIC = (
    set(django_pgqueue.__all__)
    | set(getattr(backends, "__all__", ()))
    | set(getattr(testing, "__all__", ()))
    | {"task", "transaction", "settings", "timezone", "handler", "JobSpec", "idempotency_key"}
)


def blocks(page: Path) -> list[tuple[int, str]]:
    """(line, code) of each Python block of `page`, dedented."""
    text = page.read_text("utf-8")
    found = []
    for match in FENCE.finditer(text):
        lines = match.group("code").splitlines()
        indent = len(match.group("indent"))
        code = "\n".join(line[indent:] for line in lines)
        found.append((text.count("\n", 0, match.start()) + 2, code))
    return found


def pages_with_code() -> list[Path]:
    return [page for page in PAGES if blocks(page)]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


class Names(ast.NodeVisitor):
    """The names a module binds (anywhere in it) and the names it reads."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.used: dict[str, int] = {}
        self.imports: list[tuple[str, str | None, int]] = []

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.used.setdefault(node.id, node.lineno)
        else:
            self.bound.add(node.id)

    def visit_arg(self, node: ast.arg) -> None:
        self.bound.add(node.arg)
        self.generic_visit(node)

    def _definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.bound.add(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _definition

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.bound.add((alias.asname or alias.name).split(".")[0])
            self.imports.append((alias.name, None, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.bound.add(alias.asname or alias.name)
            self.imports.append((node.module or "", alias.name, node.lineno))

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.bound.update(node.names)


def parse(page: Path) -> list[tuple[int, ast.Module]]:
    parsed = []
    for line, code in blocks(page):
        try:
            parsed.append((line, ast.parse(code)))
        except SyntaxError as exc:
            pytest.fail(f"{page_id(page)}:{line + (exc.lineno or 1) - 1}: {exc.msg}")
    return parsed


def test_the_pages_have_python_blocks_to_check():
    assert len(pages_with_code()) >= 12
    assert sum(len(blocks(page)) for page in PAGES) >= 45
    assert not READER_NAMES & PUBLIC


# The Python API reference's blocks are signatures (stubs), not code to copy: they
# compile, and tests/unit/test_python_api_page.py checks them against the code.
STUBS = {ROOT / "docs" / "reference" / "python-api.md"}


@pytest.mark.parametrize(
    "page", [page for page in pages_with_code() if page not in STUBS], ids=page_id
)
def test_every_name_a_block_uses_is_imported_or_defined_on_its_page(page):
    known = set(dir(builtins)) | READER_NAMES | {"__name__", "__file__"}
    missing = []
    for line, tree in parse(page):
        names = Names()
        names.visit(tree)
        known |= names.bound
        missing += [
            f"{page_id(page)}:{line + offset - 1}: {name}"
            for name, offset in names.used.items()
            if name not in known
        ]
    assert not missing, "names used without an import or definition: " + ", ".join(missing)


def for_this_django(module: str) -> str:
    """`module`, or on Django 5.2 the django-tasks backport that stands in for the
    django.tasks the docs are written for (Django 6)."""
    if module != "django.tasks" and not module.startswith("django.tasks."):
        return module
    try:
        importlib.import_module("django.tasks")
    except ImportError:
        return "django_tasks" + module.removeprefix("django.tasks")
    return module


@pytest.mark.parametrize("page", pages_with_code(), ids=page_id)
def test_every_import_of_the_queue_or_django_imports(page):
    broken = []
    for line, tree in parse(page):
        names = Names()
        names.visit(tree)
        for module, name, offset in names.imports:
            if module.split(".")[0] not in {"django_pgqueue", "django"}:
                continue
            where = f"{page_id(page)}:{line + offset - 1}"
            module = for_this_django(module)
            try:
                imported = importlib.import_module(module)
            except ImportError as exc:
                broken.append(f"{where}: {exc}")
                continue
            if name is not None and name != "*" and not hasattr(imported, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    broken.append(f"{where}: {module} has no {name}")
    assert not broken, broken


@pytest.mark.parametrize("page", pages_with_code(), ids=page_id)
def test_every_pgqueue_setting_a_block_writes_validates(page):
    for line, tree in parse(page):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "PGQUEUE" for t in node.targets
            ):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue  # built from names (the tutorial's os.environ): not a literal
                # SCHEDULES entries are checked by their own system checks, at startup.
                try:
                    validate(value)
                except ConfigurationError as exc:
                    pytest.fail(f"{page_id(page)}:{line + node.lineno - 1}: {exc}")


PIP = re.compile(r"pip install ([^`\n#]+)")


def wrong_installs(text: str) -> tuple[int, list[str]]:
    """(how many packages the text's pip install lines name, those not this distribution
    or naming an extra it does not declare), each wrong one with its line."""
    seen, wrong = 0, []
    for match in PIP.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for word in shlex.split(match.group(1).strip().rstrip(")").rstrip(",;")):
            if word.startswith("-") or "/" in word or word.endswith(".whl"):
                continue  # an option, a checkout or a wheel
            seen += 1
            name, _, extras = word.partition("[")
            unknown = set(extras.rstrip("]").split(",")) - EXTRAS if extras else set()
            if re.split(r"[<>=!~]", name)[0] != DISTRIBUTION or unknown:
                wrong.append(f"{line}: {word}")
    return seen, wrong


def test_the_pip_check_refuses_another_distribution_or_an_unknown_extra():
    text = 'pip install "django-pgqueue[prometheus]"\npip install django-pgqueue-jobs[nope]\n'
    assert wrong_installs(text) == (
        2,
        ["1: django-pgqueue[prometheus]", "2: django-pgqueue-jobs[nope]"],
    )
    assert wrong_installs("python -m pip install -U django-pgqueue-jobs /path/to/it") == (1, [])


def test_every_pip_install_line_names_this_distribution():
    total, wrong = 0, []
    for page in PAGES:
        seen, found = wrong_installs(page.read_text("utf-8"))
        total += seen
        wrong += [f"{page_id(page)}:{item}" for item in found]
    assert total >= 5
    assert not wrong, f"pip install lines not naming {DISTRIBUTION} (or its extras): {wrong}"
