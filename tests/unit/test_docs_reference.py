"""The reference pages against the code.

Every PGQUEUE setting, every backend option, every management command with each of its
options, every public name and every system check must be documented; and nothing the
reference documents may be gone from the code. Commands are discovered from the
commands directory, so a new command fails here until it has its section.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.management import load_command_class
from django.core.management.base import BaseCommand

from django_pgqueue import backends
from django_pgqueue.conf import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
COMMANDS_DIR = ROOT / "django_pgqueue" / "management" / "commands"


def page(name: str) -> str:
    return (REFERENCE / name).read_text("utf-8")


def sections(text: str, level: str) -> dict[str, str]:
    """{title in backticks: body} for the headings of one level (``##`` or ``###``)."""
    heading = re.compile(rf"^{level} `([^`]+)`[ \t]*$", re.MULTILINE)
    matches = list(heading.finditer(text))
    bodies = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        bodies[match.group(1)] = text[match.end() : end]
    return bodies


def pgqueue_part(text: str) -> str:
    """The settings page's PGQUEUE section, up to the TASKS one."""
    return text.split("## `PGQUEUE`", 1)[1].split("## `TASKS`", 1)[0]


def documented_default(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def command_names() -> list[str]:
    return sorted(path.stem for path in COMMANDS_DIR.glob("*.py") if not path.stem.startswith("_"))


def command_arguments(name: str) -> tuple[set[str], set[str]]:
    """(option strings, positional metavars) a command adds to Django's own options."""
    parser = load_command_class("django_pgqueue", name).create_parser("manage.py", name)
    base = BaseCommand().create_parser("manage.py", name)
    inherited = {option for action in base._actions for option in action.option_strings}
    options, positionals = set(), set()
    for action in parser._actions:
        if action.option_strings:
            options.update(o for o in action.option_strings if o not in inherited)
        else:
            positionals.add(action.metavar or action.dest.upper())
    return options, positionals


def test_every_pgqueue_setting_is_documented_with_its_default():
    text = pgqueue_part(page("settings.md"))
    assert set(sections(text, "###")) == set(SETTINGS)
    for key, setting in SETTINGS.items():
        row = f"| `{key}` | `{documented_default(setting.default)}` |"
        assert row in text, f"settings.md: the table row of {key} should start {row!r}"


def test_every_backend_option_is_documented():
    text = page("settings.md").split("## `TASKS`", 1)[1]
    documented = {
        title.removeprefix('OPTIONS["').removesuffix('"]') for title in sections(text, "###")
    }
    assert documented == set(backends.OPTIONS)
    tasks_section = sections(text, "###")['OPTIONS["TASKS"]']
    for key in backends.TASK_OPTIONS:
        assert f"`{key}`" in tasks_section
    assert "`QUEUES`" in text


@pytest.mark.parametrize("name", command_names())
def test_every_command_and_option_is_documented(name):
    documented = sections(page("commands.md"), "##")
    assert name in documented, f"commands.md has no section '## `{name}`'"
    body = documented[name]
    options, positionals = command_arguments(name)
    for option in options:
        assert re.search(rf"`{re.escape(option)}[ `=]", body), f"{name}: {option} undocumented"
    for metavar in positionals:
        assert f"`{metavar}`" in body, f"{name}: positional {metavar} undocumented"
    stale = set(re.findall(r"`(--[a-z][a-z0-9-]*)", body)) - options
    assert not stale, f"{name}: documented options that do not exist: {sorted(stale)}"


def test_no_documented_command_is_gone():
    assert set(sections(page("commands.md"), "##")) == set(command_names())


def test_every_system_check_is_documented():
    ids = set()
    for path in (ROOT / "django_pgqueue").rglob("*.py"):
        ids.update(re.findall(r'id="(pgqueue\.[EW]\d{3})"', path.read_text("utf-8")))
    assert ids
    text = page("settings.md")
    assert not [check for check in sorted(ids) if f"`{check}`" not in text]


def test_the_settings_page_states_the_default_retry_window():
    """The window the page states is the sum of the default backoff's ceilings."""
    from django_pgqueue.retry import ExponentialBackoff

    policy = ExponentialBackoff(
        base=SETTINGS["RETRY_BACKOFF_BASE"].default, cap=SETTINGS["RETRY_BACKOFF_CAP"].default
    )
    retries = range(1, SETTINGS["MAX_ATTEMPTS"].default)  # no retry after the last attempt
    window = sum(policy.ceiling(attempt) for attempt in retries)
    text = " ".join(page("settings.md").split())
    assert f"at most **{window / 3600:.1f} hours** ({window:,.0f} s" in text
    assert f"`MAX_ATTEMPTS` {SETTINGS['MAX_ATTEMPTS'].default}," in text
    assert policy == ExponentialBackoff()  # the class's defaults are the settings'
