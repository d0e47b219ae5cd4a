#!/usr/bin/env python
"""Django's command-line utility for the django-pgqueue test project."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from testproject.dburl import database_from_url

    try:
        database_from_url()  # what settings.py reads: a bad URL is one line, not a traceback
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
