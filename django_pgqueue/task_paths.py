"""A ``@task`` function found by its module path, the type of every task job.

The Tasks backend and its runner (`django_pgqueue.tasks`) look a task up this way to
run it or to read its result, and the schedules a backend's ``OPTIONS["SCHEDULES"]``
declares (`django_pgqueue.schedules`) to learn a task's queue. It sits below both, so
the schedules feature does not import the Tasks integration. It needs Django's Tasks
framework only to recognise a Task: ``django.tasks`` (Django 6.0+), else the
``django-tasks`` backport, as `django_pgqueue.tasks.api` imports it; without either it
still imports, and `import_task` raises ImportError.
"""

from __future__ import annotations

import importlib
import re

try:
    from django.tasks import Task
except ImportError:  # Django 5.2: the backport, if installed
    try:
        from django_tasks.base import Task  # type: ignore[no-redef]
    except ImportError:
        Task = None  # type: ignore[assignment,misc]

# What an import that needs Django's Tasks framework says when neither is installed.
NO_TASKS_FRAMEWORK = (
    "django_pgqueue's Tasks backend needs Django's Tasks framework: Django 6.0 or newer, "
    "or on Django 5.2 the backport (pip install 'django-pgqueue-jobs[django52]', which "
    "installs django-tasks)."
)

# A task's module path, as Task.module_path spells it for a module-level function.
# \A and \Z: `$` would also match before a trailing newline.
TASK_PATH_RE = re.compile(r"\A[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\Z", re.ASCII)


def import_task(path: str) -> Task | None:
    """The Task defined at module path `path`, or None if there is none.

    A module that is missing is None; an error raised while importing a module that
    exists (a bug in it) propagates.
    """
    if Task is None:
        raise ImportError(NO_TASKS_FRAMEWORK)
    if not TASK_PATH_RE.match(path):
        return None
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return None
        raise
    found = getattr(module, attribute, None)
    if isinstance(found, Task) and found.module_path == path:
        return found
    return None
