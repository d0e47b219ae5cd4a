"""Settings of the django-pgqueue test and demo project.

The database comes from DATABASE_URL, or the local server on 127.0.0.1:5432.
"""

import json
import os
from pathlib import Path

import django

from .dburl import database_from_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "django-insecure-pgqueue-testproject-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_pgqueue",
    "demo",
    "qa",
    "shop",
]
if django.VERSION < (6, 0):
    # Django 5.2: the Tasks API comes from the django-tasks backport.
    INSTALLED_APPS.insert(INSTALLED_APPS.index("django_pgqueue"), "django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": database_from_url()}
# A second database for the tests of queues on several databases (tests/multidb/, whose
# conftest starts a throwaway server and sets this). Unset: one database, as usual.
if os.environ.get("PGQUEUE_TEST_QUEUES2_URL"):
    DATABASES["queues2"] = database_from_url(os.environ["PGQUEUE_TEST_QUEUES2_URL"])
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

PGQUEUE = {
    # Retries in tenths of seconds and few attempts, so tests that fail jobs stay fast
    # (the defaults wait up to 56.5 hours over 20 attempts).
    "MAX_ATTEMPTS": 5,
    "RETRY_BACKOFF_BASE": 0.2,
    "RETRY_BACKOFF_CAP": 2.0,
    # The tests compare each scrape with the tables at that moment: no shared reading
    # (tests/integration/test_metrics_view.py turns it on to test it).
    "METRICS_CACHE_SECONDS": 0,
    # Tests count the jobs and schedules they make: no built-in prune firing on the hour
    # (tests/integration/test_builtin_prune.py turns it on to test it).
    "PRUNE": None,
}

# Two releases of the code's schedules, for the rolling-deploy scenario
# (tests/reliability/test_rolling_deploy.py): a worker started with
# PGQUEUE_TEST_SCHEDULES=deploy-old or deploy-new declares that set. The new release
# keeps one schedule as it was, retimes one and removes the third. Unset: none.
DEPLOY_SCHEDULES = {
    "deploy-old": {
        "deploy-steady": {"type": "qa.ledger", "queue": "roll-ticks", "every": 1},
        "deploy-retimed": {"type": "qa.ledger", "queue": "roll-ticks", "every": 2},
        "deploy-removed": {"type": "qa.ledger", "queue": "roll-ticks", "every": 3},
    },
    "deploy-new": {
        "deploy-steady": {"type": "qa.ledger", "queue": "roll-ticks", "every": 1},
        "deploy-retimed": {"type": "qa.ledger", "queue": "roll-ticks", "cron": "*/5 * * * * *"},
    },
}
if os.environ.get("PGQUEUE_TEST_SCHEDULES"):
    PGQUEUE["SCHEDULES"] = DEPLOY_SCHEDULES[os.environ["PGQUEUE_TEST_SCHEDULES"]]
# Queues routed to other aliases, as JSON ({"b.*": "queues2"}), for worker and producer
# subprocesses of the scenarios on several servers (tests/reliability/test_multidb_outage.py).
if os.environ.get("PGQUEUE_TEST_QUEUE_DATABASES"):
    PGQUEUE["QUEUE_DATABASES"] = json.loads(os.environ["PGQUEUE_TEST_QUEUE_DATABASES"])
# Fair queues, as JSON ({"tenants": {}}), for the worker subprocesses of the fair and
# sequenced scenario (tests/reliability/test_sequences.py).
if os.environ.get("PGQUEUE_TEST_FAIR_QUEUES"):
    PGQUEUE["FAIR_QUEUES"] = json.loads(os.environ["PGQUEUE_TEST_FAIR_QUEUES"])

# django.tasks through the queue: @task functions are jobs of the same tables, run by
# the same run_queue_worker command. A task's queue_name must be one of QUEUES.
TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.backends.PgQueueBackend",
        "QUEUES": ["default", "payments", "emails", "qa-tasks"],
        "OPTIONS": {
            "MAX_ATTEMPTS": 3,
            "RETRY": {"policy": "exponential", "base": 0.1, "cap": 1.0},
            "TASKS": {
                # A payment may wait a while for the gateway to come back.
                "shop.tasks.charge_order": {"max_attempts": 6},
                "qa.tasks.flaky": {"max_attempts": 5, "retry": {"policy": "fixed", "seconds": 0}},
                "qa.tasks.explode": {"max_attempts": 2, "retry": {"policy": "fixed", "seconds": 0}},
                # Celery's options, an exception of the task's own module by its path.
                "qa.tasks.picky": {
                    "max_attempts": 3,
                    "autoretry_for": ["qa.tasks.Transient"],
                    "retry_backoff": 0.01,
                    "retry_jitter": False,
                },
                # A workflow step's parents' results come first in every step of it.
                "qa.tasks.average": {"takes_results": True},
            },
        },
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # PGQUEUE_TEST_LOG_LEVEL=INFO shows a test worker process's info lines (its final stats).
    "loggers": {
        "django_pgqueue": {
            "handlers": ["console"],
            "level": os.environ.get("PGQUEUE_TEST_LOG_LEVEL", "WARNING"),
        }
    },
}
