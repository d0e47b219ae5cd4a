"""Every page of the docs reads right on the repository's page, as GitHub renders it.

Most readers open the README's links on GitHub, whose Markdown knows nothing of MyST:
it shows a role, a directive and a target as written, and a copied block brings its
``:caption:`` line along. So the pages (the README and every page under docs/, each of
them reached from the README through links) use only Markdown that GitHub and Sphinx
(MyST) render alike:

- no role (``{doc}`tutorial` ``), no directive fence (```` ```{code-block} ````,
  ``:::{note}``), no target (``(label)=``), no MyST comment (``% ...``), block break
  (``+++``) or definition (``: ...``). A block's file is named in a comment on its
  first line (``# shop/jobs.py``), a page is linked as ``[text](page.md)`` and a
  section as ``[text](page.md#its-heading)``, a warning is ``> [!WARNING]``.
- every relative link and image names a file that exists, and a link's ``#anchor`` is
  a heading of the page it points to, slugged as GitHub slugs it (and MyST, with
  ``myst_heading_anchors``; the Sphinx build checks its side).

Python blocks are checked by test_docs_code.py; docs/conf.py builds Sphinx's
navigation from docs/index.md's lists of links.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted(
    [README, *(page for page in (ROOT / "docs").rglob("*.md") if "_build" not in page.parts)]
)

FENCE = re.compile(r"^[ \t]*(?P<mark>`{3,}|~{3,})(?P<info>[^\n]*)$")
CODE_SPAN = re.compile(r"(?<!`)(?P<ticks>`+)(?!`)(?P<code>.+?)(?<!`)(?P=ticks)(?!`)", re.DOTALL)
ROLE = re.compile(r"\{[A-Za-z][\w:.+-]*\}$")
# MyST block syntax GitHub shows as text: a target, a comment, a block break, a colon
# fence, a definition.
MYST_LINES = {
    "a target": re.compile(r"^ {0,3}\([\w:.-]+\)=[ \t]*$"),
    "a MyST comment": re.compile(r"^ {0,3}%"),
    "a block break": re.compile(r"^ {0,3}\+\+\+"),
    "a colon fence": re.compile(r"^ {0,3}:{3,}"),
    "a definition": re.compile(r"^ {0,3}: "),
}
LINK = re.compile(r"\]\((?P<target><[^>\n]*>|[^)\s]+)(?:[ \t]+\"[^\"\n]*\")?\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(?P<title>.*?)(?:[ \t]+#+)?[ \t]*$")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def outside_code_blocks(text: str) -> tuple[str, list[tuple[int, str]]]:
    """(the text with every fenced block's lines blanked, (line, info string) of each
    block's opening fence). Line numbers are kept."""
    lines = text.split("\n")
    opened: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(lines):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group("mark")
                opened.append((number + 1, match.group("info").strip()))
                lines[number] = ""
            continue
        if match and match.group("mark").startswith(fence) and not match.group("info").strip():
            fence = None
        lines[number] = ""
    return "\n".join(lines), opened


def blank_code_spans(text: str) -> str:
    """`text` with each inline code span's content replaced by spaces (newlines kept)."""
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def myst_only(text: str) -> list[str]:
    """'line: what' for each piece of MyST syntax GitHub would show as written."""
    prose, fences = outside_code_blocks(text)
    found = [f"{line}: a directive ```{info}" for line, info in fences if info.startswith("{")]
    for match in CODE_SPAN.finditer(prose):
        before = max(0, match.start() - 40)
        role = ROLE.search(prose[before : match.start()])
        if role:
            found.append(f"{line_of(prose, before + role.start())}: a role {role.group(0)}")
    for number, line in enumerate(prose.split("\n"), start=1):
        found += [f"{number}: {what}" for what, rule in MYST_LINES.items() if rule.match(line)]
    return sorted(found, key=lambda item: int(item.split(":")[0]))


def heading_text(title: str) -> str:
    """The text a heading renders to: code spans' content, a link's text, no emphasis."""
    spans: list[str] = []

    def keep(match: re.Match[str]) -> str:
        spans.append(match.group("code").strip())
        return f"\0{len(spans) - 1}\0"

    text = CODE_SPAN.sub(keep, title)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", text)
    return re.sub(r"\0(\d+)\0", lambda m: spans[int(m.group(1))], text)


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading's text (MyST's "github" slugs are the same)."""
    return re.sub(r"[^\w\u4e00-\u9fff\- ]", "", text.lower().replace(" ", "-"))


def anchors(page: Path) -> set[str]:
    """The anchor of every heading of `page`, a repeated one suffixed -1, -2, ..."""
    prose, _ = outside_code_blocks(page.read_text("utf-8"))
    found: set[str] = set()
    for line in prose.split("\n"):
        match = HEADING.match(line)
        if not match:
            continue
        slug = base = github_slug(heading_text(match.group("title")))
        count = 0
        while slug in found:
            count += 1
            slug = f"{base}-{count}"
        found.add(slug)
    return found


def links(page: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of every inline link and image of `page`, outside code."""
    prose, _ = outside_code_blocks(page.read_text("utf-8"))
    prose = blank_code_spans(prose)
    for match in LINK.finditer(prose):
        yield line_of(prose, match.start()), match.group("target").strip("<>")


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """'line: target: why' for each relative link or image of `page` that leads nowhere
    (or out of the repository at `root`)."""
    broken = []
    for line, target in links(page):
        if SCHEME.match(target):
            continue  # https:, mailto:: not this repository's
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(root):
            broken.append(f"{line}: {target}: outside the repository")
        elif not file.exists():
            broken.append(f"{line}: {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{line}: {target}: no heading with that anchor")
    return broken


def reached_from_the_readme() -> set[Path]:
    seen, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for _, target in links(page):
            path = target.partition("#")[0]
            if SCHEME.match(target) or not path.endswith(".md"):
                continue
            linked = (page.parent / path).resolve()
            if linked.exists() and linked not in seen:
                seen.add(linked)
                todo.append(linked)
    return seen


def test_the_checks_find_each_kind_of_myst_only_syntax_and_broken_link(tmp_path):
    text = (
        "# Page\n\nSee {doc}`tutorial` and {ref}`the settings <tasks-options>`, not `{x}`.\n"
        "\n```{code-block} python\n:caption: shop/jobs.py\n\nx = 1\n```\n\n"
        "```python\n% not a comment in code\n```\n\n(label)=\n## Section\n\n% comment\n"
        "\n`term`\n: its definition\n\n:::{note}\nnote\n:::\n\n+++\n"
    )
    assert myst_only(text) == [
        "3: a role {doc}",
        "3: a role {ref}",
        "5: a directive ```{code-block} python",
        "15: a target",
        "18: a MyST comment",
        "21: a definition",
        "23: a colon fence",
        "25: a colon fence",
        "27: a block break",
    ]
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## `QUEUE_DATABASES` and *more*\n")
    page.write_text(
        "# Page\n\n[ok](other.md#queue_databases-and-more) [gone](missing.md) "
        "[bad anchor](other.md#nope) [here](#page) [`code`](#nowhere) "
        "[web](https://example.com/x.md) `[not a link](nothing.md)`\n\n"
        "![a picture](images/none.png) [up](../../outside.md)\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "3: missing.md: no such file",
        "3: other.md#nope: no heading with that anchor",
        "3: #nowhere: no heading with that anchor",
        "5: images/none.png: no such file",
        "5: ../../outside.md: outside the repository",
    ]


def test_repeated_headings_get_githubs_numbered_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Step\n\n```sh\n# not a heading\n```\n\n## Step\n\n### Step\n")
    assert anchors(page) == {"title", "step", "step-1", "step-2"}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_page_uses_myst_syntax_github_shows_as_written(page):
    found = myst_only(page.read_text("utf-8"))
    assert not found, f"{page_id(page)}: " + ", ".join(found)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = broken_links(page)
    assert not broken, f"{page_id(page)}: " + ", ".join(broken)


def test_every_page_is_reached_from_the_readme_through_links():
    unreached = [page_id(page) for page in PAGES if page not in reached_from_the_readme()]
    assert not unreached, f"pages no link leads to from README.md: {unreached}"
