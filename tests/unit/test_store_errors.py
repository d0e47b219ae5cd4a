"""What a database error means to the worker: by SQLSTATE, never by Python class alone."""

import psycopg
import pytest
from psycopg import errors as pg

from django_pgqueue.store import errors


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (pg.SerializationFailure(), errors.TRANSIENT),  # an OperationalError subclass
        (pg.DeadlockDetected(), errors.TRANSIENT),
        (pg.LockNotAvailable(), errors.TRANSIENT),
        (pg.QueryCanceled(), errors.TRANSIENT),
        (pg.AdminShutdown(), errors.LOST),
        (pg.lookup("08006")(), errors.LOST),
        (psycopg.OperationalError("server closed the connection unexpectedly"), errors.LOST),
        (pg.UntranslatableCharacter(), errors.VALUE),
        (pg.InvalidTextRepresentation(), errors.VALUE),
        (pg.ProgramLimitExceeded(), errors.VALUE),
        (pg.InvalidSqlStatementName(), errors.UNPREPARED),
        (pg.DatetimeFieldOverflow(), errors.OTHER),
        (pg.CheckViolation(), errors.OTHER),
        (IndexError("pop from an empty deque"), errors.OTHER),
    ],
)
def test_classify(exc, kind):
    assert errors.classify(exc) == kind


def test_describe_names_class_and_sqlstate():
    assert errors.describe(pg.DeadlockDetected("deadlock\nDETAIL")) == (
        "psycopg.errors.DeadlockDetected [40P01]: deadlock"
    )
