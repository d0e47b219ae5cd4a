"""Issue 11: the package stays in rooms a newcomer can read.

No module of django_pgqueue/ over MAX_MODULE lines, no class over MAX_CLASS.
"""

import ast
from pathlib import Path

import django_pgqueue

MAX_MODULE = 450
MAX_CLASS = 300
PACKAGE = Path(django_pgqueue.__file__).parent


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_over_the_limit():
    sizes = {path: len(path.read_text("utf-8").splitlines()) for path in _modules()}
    over = {str(path.relative_to(PACKAGE)): n for path, n in sizes.items() if n > MAX_MODULE}
    assert not over


def test_no_class_is_over_the_limit():
    over = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                size = node.end_lineno - first + 1
                if size > MAX_CLASS:
                    over[f"{path.relative_to(PACKAGE)}:{node.name}"] = size
    assert not over
