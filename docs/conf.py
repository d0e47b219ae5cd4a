"""Sphinx configuration: MyST Markdown sources, the furo theme, autodoc of the public API.

`make docs` builds with warnings as errors and nitpicky references
(sphinx-build -W --keep-going -n). It needs no network and no database: Django is set
up with the test project's settings only so autodoc can import the models.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

import django  # noqa: E402

django.setup()

import django_pgqueue  # noqa: E402

project = "django-pgqueue"
author = "The django-pgqueue team"
copyright = "2026, the django-pgqueue team"
release = django_pgqueue.__version__
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"django-pgqueue {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False}
# Offline build: no intersphinx, so names from Python, Django and other libraries in
# signatures are left unlinked instead of reported.
nitpick_ignore_regex = [
    (r"py:.*", r"(datetime|dt|typing|collections|abc|types|random|threading|re|dataclasses)\..*"),
    (r"py:.*", r"(django|asgiref|psycopg)\..*"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Mapping|Sequence|F|T|P|Task|TaskResult)"),
    (r"py:.*", r"(TaskContext|BaseTaskBackend|Resolver|Outcome|FrameType)"),
    # Internals that appear in public signatures but are not documented on their own.
    (r"py:class", r"django_pgqueue\.(registry\.F|registry\.Registry|context\.Lease)"),
    # Documented in reference/python-api.md as plain Markdown, which makes no py: target.
    (r"py:class", r"django_pgqueue\.(context\.JobContext|enqueue\.EnqueuedJob|worker\.Worker)"),
]

# The admin guide's screenshots are made by the admin's own tooling and may be absent
# from a checkout (a branch without the admin). A figure naming one of them is then
# left out of the page instead of failing the build; every other image must exist.
OPTIONAL_IMAGES = {"images/admin-jobs-list.png", "images/admin-dead-job.png"}
_FIGURE = re.compile(r"```\{figure\} (?P<path>\S+)\n.*?\n```\n", re.DOTALL)


def _drop_absent_screenshots(app, docname, source) -> None:  # type: ignore[no-untyped-def]
    def keep_or_drop(match: re.Match[str]) -> str:
        path = match.group("path")
        if path in OPTIONAL_IMAGES and not (HERE / path).exists():
            return ""
        return match.group(0)

    source[0] = _FIGURE.sub(keep_or_drop, source[0])


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("source-read", _drop_absent_screenshots)
