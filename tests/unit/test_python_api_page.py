"""docs/reference/python-api.md against the code, as the settings table is.

The page is plain Markdown, readable on the repository's page as in Sphinx: each public
object is a ``### `dotted.path``` heading, its signature in a ``python`` block and the
first paragraph of its docstring; a class's members are bullets,
``- `name(signature)`: first line of its docstring``. Every section must say what the
code says today, and every name of ``django_pgqueue.__all__`` must have one.
``python tests/unit/test_python_api_page.py`` rewrites the checked parts of the page
from the code (the prose between them is kept).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "python-api.md"
WIDTH = 88
HEADING = re.compile(r"^### `(?P<path>[\w.]+)`\n", re.MULTILINE)
SECTION = re.compile(
    r"^### `(?P<path>[\w.]+)`\n\n```python\n(?P<signature>.*?)\n```\n\n(?P<summary>.*?)\n\n"
    r"(?P<members>(?:- `[^\n]*\n(?:  [^\n]*\n)*)*)",
    re.MULTILINE | re.DOTALL,
)
MEMBER = re.compile(r"^- `(?P<name>\w+)[(:`]", re.MULTILINE)


def resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    return value if isinstance(value, str) else inspect.formatannotation(value)


def _parameters(func: Any, *, drop_self: bool) -> tuple[list[str], str]:
    signature = inspect.signature(func)
    parts: list[str] = []
    star_done = False
    params = list(signature.parameters.values())
    if drop_self and params and params[0].name in {"self", "cls"}:
        params = params[1:]
    for param in params:
        if param.kind is param.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if param.kind is param.VAR_POSITIONAL:
            star_done = True
            text = f"*{param.name}"
        elif param.kind is param.VAR_KEYWORD:
            text = f"**{param.name}"
        else:
            text = param.name
        annotation = _annotation(param.annotation)
        if annotation:
            text += f": {annotation}"
        if param.default is not param.empty:
            # A default without a literal form (a dataclass's default_factory) is "...".
            value = repr(param.default)
            value = "..." if value.startswith("<") else value
            if isinstance(param.default, str) and not set('"\\') & set(param.default):
                value = f'"{param.default}"'  # as ruff formats the page's blocks
            text += f" = {value}" if annotation else f"={value}"
        parts.append(text)
    return parts, _annotation(signature.return_annotation)


def signature_of(
    name: str, func: Any, *, drop_self: bool = False, prefix: str = "", suffix: str = ""
) -> str:
    """`name(params) -> return`, wrapped one parameter a line past WIDTH, as black does."""
    parts, returns = _parameters(func, drop_self=drop_self)
    tail = (f" -> {returns}" if returns else "") + suffix
    one_line = f"{prefix}{name}({', '.join(parts)}){tail}"
    if len(one_line) <= WIDTH:
        return one_line
    indent = " " * (len(prefix) - len(prefix.lstrip()) + 4)
    lines = "".join(f"{indent}{part},\n" for part in parts)
    return f"{prefix}{name}(\n{lines}{indent[:-4]}){tail}"


def summary_of(obj: Any) -> str:
    """The docstring's first paragraph, on one line (a class's own, never inherited)."""
    doc = inspect.cleandoc(vars(obj).get("__doc__") or "") if inspect.isclass(obj) else None
    if doc is None:
        doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _own_init(cls: type) -> Any:
    """The __init__ the class's signature comes from; None for a builtin's or a Protocol's."""
    if getattr(cls, "_is_protocol", False):
        return None  # typing puts its own __init__ on a Protocol class
    for klass in cls.__mro__:
        if klass.__module__ in {"builtins", "typing"}:
            return None
        if "__init__" in vars(klass):
            return klass.__init__
    return None


def _bases(cls: type) -> str:
    names = [base.__name__ for base in cls.__bases__ if base is not object]
    names = ["Protocol" if name == "Generic" else name for name in names]
    return f"({', '.join(dict.fromkeys(names))})" if names else ""


def render_signature(path: str) -> str:
    """A stub of the object that is valid Python: `def f(...) -> R: ...`, or a class
    line with its bases and, when it has its own, its __init__."""
    obj = resolve(path)
    name = path.rpartition(".")[2]
    if inspect.isclass(obj):
        init = _own_init(obj)
        if init is None:
            return f"class {name}{_bases(obj)}: ..."
        init_line = signature_of("__init__", init, prefix="    def ", suffix=": ...")
        return f"class {name}{_bases(obj)}:\n{init_line}"
    prefix = "async def " if inspect.iscoroutinefunction(obj) else "def "
    return signature_of(name, obj, prefix=prefix, suffix=": ...")


def render_member(cls: type, name: str) -> str:
    member = inspect.getattr_static(cls, name)
    if isinstance(member, property):
        returns = _annotation(inspect.signature(member.fget).return_annotation)
        text = f"- `{name}: {returns}`" if returns else f"- `{name}`"
        doc = summary_of(member.fget)
    else:
        func = member.__func__ if isinstance(member, staticmethod | classmethod) else member
        drop = not isinstance(member, staticmethod)
        text = f"- `{signature_of(name, func, drop_self=drop).replace(chr(10), ' ')}`"
        text = re.sub(r",\s*\)", ")", re.sub(r"\(\s+", "(", text).replace("    ", ""))
        doc = summary_of(func)
    return f"{text}: {doc}" if doc else text


def render_section(path: str, members: list[str]) -> str:
    obj = resolve(path)
    lines = [f"### `{path}`", "", "```python", render_signature(path), "```", ""]
    lines += [summary_of(obj), ""]
    lines += [render_member(obj, name) for name in members]
    return "\n".join(lines) + ("\n" if members else "")


def sections(text: str) -> list[re.Match[str]]:
    return list(SECTION.finditer(text))


def member_names(block: str) -> list[str]:
    return MEMBER.findall(block)


def test_the_page_is_markdown_without_autodoc():
    text = PAGE.read_text("utf-8")
    assert "eval-rst" not in text
    assert len(HEADING.findall(text)) == len(sections(text)) >= 31


def test_every_public_name_has_a_section():
    import django_pgqueue

    documented = {match.group("path") for match in sections(PAGE.read_text("utf-8"))}
    missing = [
        name for name in django_pgqueue.__all__ if f"django_pgqueue.{name}" not in documented
    ]
    assert not missing, f"python-api.md has no section for: {missing}"
    assert "django_pgqueue.backends.PgQueueBackend" in documented


def test_every_section_says_what_the_code_says():
    stale = []
    for match in sections(PAGE.read_text("utf-8")):
        bullets = re.findall(r"^- ", match.group("members"), re.MULTILINE)
        assert len(bullets) == len(member_names(match.group("members"))), match.group("path")
        expected = render_section(match.group("path"), member_names(match.group("members")))
        if match.group(0).rstrip("\n") != expected.rstrip("\n"):
            stale.append(f"{match.group(0)}\n--- the code says ---\n{expected}")
    assert not stale, (
        "python-api.md is out of date (python tests/unit/test_python_api_page.py "
        "rewrites it):\n\n" + "\n\n".join(stale)
    )


def test_a_changed_signature_or_docstring_fails_the_check():
    section = render_section("django_pgqueue.enqueue", [])
    (match,) = sections(section + "\n")
    assert match.group("signature").startswith("def enqueue(\n    type: str,")
    drifted = section.replace("queue: str | None = None", "queue: str = 'default'")
    (changed,) = sections(drifted + "\n")
    assert changed.group(0).rstrip("\n") != section.rstrip("\n")


def rewrite() -> None:
    text = PAGE.read_text("utf-8")
    for match in reversed(sections(text)):
        fresh = render_section(match.group("path"), member_names(match.group("members")))
        text = text[: match.start()] + fresh.rstrip("\n") + "\n\n" + text[match.end() :]
    PAGE.write_text(re.sub(r"\n{3,}", "\n\n", text), "utf-8")


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    rewrite()
