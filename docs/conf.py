"""Sphinx configuration: MyST Markdown sources, the furo theme.

`make docs` builds with warnings as errors and nitpicky references
(sphinx-build -W --keep-going -n). It needs no network and no database.

The pages are written in the Markdown GitHub renders too, since most readers follow the
README's links on the repository's page (tests/unit/test_docs_pages.py keeps them so):
links between pages are `[text](page.md#heading)` (MyST resolves them, and checks the
heading anchors, slugged as GitHub slugs them), a warning is GitHub's `> [!WARNING]`,
and the navigation is built from docs/index.md's lists of links instead of toctree
directives, which GitHub would show as text.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import django_pgqueue  # noqa: E402

project = "django-pgqueue"
author = "The django-pgqueue team"
copyright = "2026, the django-pgqueue team"
release = django_pgqueue.__version__
version = release

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["alert"]
# Every heading gets its anchor, as on GitHub, so a link may point at any section.
myst_heading_anchors = 6
myst_heading_slug_func = "github"

html_theme = "furo"
html_title = f"django-pgqueue {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]

# docs/index.md: a `## Caption` heading, then a list of links to pages.
_SECTION = re.compile(
    r"^## (?P<caption>[^\n]+)\n\n(?P<items>(?:- \[[^\n]*\]\([^)\n]+\.md\)\n?)+)", re.M
)
_PAGE = re.compile(r"\]\((?P<page>[^)\n]+)\.md\)")


def _navigation_from_links(app, docname, source) -> None:  # type: ignore[no-untyped-def]
    """Give the root page a hidden toctree per list of links, with the list's heading as
    its caption: the sidebar then lists what the page lists, in the same order."""
    if docname != app.config.root_doc:
        return
    trees = [
        "```{toctree}\n:hidden:\n:caption: "
        + match.group("caption")
        + "\n\n"
        + "\n".join(_PAGE.findall(match.group("items")))
        + "\n```\n"
        for match in _SECTION.finditer(source[0])
    ]
    source[0] += "\n" + "\n".join(trees)


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("source-read", _navigation_from_links)
