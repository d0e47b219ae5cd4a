"""PgQueueBackend through Django's public Tasks API, against the real database and worker.

Every task here is defined in testproject/qa/tasks.py, enqueued with ``.enqueue()`` or
``.aenqueue()``, run by a real Worker (in a thread, or a run_queue_worker process), and
observed with ``.refresh()`` / ``.get_result()``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone
from qa.models import TaskCall
from qa.tasks import add, async_add, durable_task, echo, explode, flaky, record, refuse

from django_pgqueue import LeaseExpired
from django_pgqueue.backends import PgQueueBackend
from django_pgqueue.models import Job, JobState
from django_pgqueue.store.worker import Store

from .api import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    settle,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "qa-tasks"


def test_the_backend_declares_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, PgQueueBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


def test_success_with_return_value_timestamps_and_worker(run_worker):
    result = add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3]
    assert result.kwargs == {}
    assert result.enqueued_at is not None
    assert result.started_at is None
    assert result.backend == "default"
    # OPTIONS["MAX_ATTEMPTS"] of the test project's backend, stored with the job.
    assert JobState.objects.get(pk=int(result.id)).max_attempts == 3
    worker = run_worker([QUEUE], burst=True)
    worker.join()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.attempts == 1
    assert result.worker_ids == [worker.worker.worker_id]
    assert result.errors == []
    assert result.enqueued_at <= result.started_at == result.last_attempted_at
    assert result.started_at <= result.finished_at
    fetched = add.get_result(result.id)
    assert fetched.task.func is add.func
    assert fetched.task.queue_name == QUEUE
    assert fetched.return_value == 5
    assert fetched.enqueued_at == result.enqueued_at


def test_failure_keeps_the_error_class_and_traceback(run_worker):
    result = refuse.enqueue("this order can never be charged")
    run_worker([QUEUE], burst=True).join()

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1  # PermanentFailure: no retry
    [error] = result.errors
    assert error.exception_class_path == "django_pgqueue.exceptions.PermanentFailure"
    assert error.exception_class.__name__ == "PermanentFailure"
    assert "Traceback (most recent call last)" in error.traceback
    assert "this order can never be charged" in error.traceback
    assert "qa/tasks.py" in error.traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018 - the property raises


def test_retry_then_success_counts_attempts_and_keeps_the_errors(run_worker):
    result = flaky.enqueue(failures=2)  # per-task options: 5 attempts, no delay
    run_worker([QUEUE])
    settle(result)

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 3
    assert [error.exception_class_path for error in result.errors] == [
        "builtins.ConnectionError",
        "builtins.ConnectionError",
    ]
    assert "flaky dependency down (attempt 2)" in result.errors[1].traceback
    # The task saw TaskContext.attempt 1, 2, 3, and its last result names every worker.
    assert list(TaskCall.objects.order_by("id").values_list("attempt", flat=True)) == [1, 2, 3]
    assert result.return_value["attempt"] == 3
    assert result.return_value["worker_ids"] == result.worker_ids
    assert result.started_at < result.last_attempted_at <= result.finished_at


def test_dead_after_max_attempts_from_the_per_task_options(run_worker, settings):
    options = settings.TASKS["default"]["OPTIONS"]
    settings.TASKS = {
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {
                **options,
                "TASKS": {
                    "qa.tasks.explode": {
                        "max_attempts": 3,
                        "retry": {"policy": "fixed", "seconds": 0},
                    }
                },
            },
        }
    }
    result = explode.enqueue("boom")
    run_worker([QUEUE])
    settle(result)

    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3
    assert len(result.errors) == 3
    assert all(error.exception_class is ValueError for error in result.errors)
    assert all(error.traceback.rstrip().endswith("ValueError: boom") for error in result.errors)
    # Underneath, the queue marked the job dead with its attempts spent.
    state = JobState.objects.get(pk=int(result.id))
    assert (state.status, state.attempts, state.max_attempts) == ("dead", 3, 3)


def test_a_task_option_gives_its_jobs_a_concurrency_key(run_worker, settings):
    """OPTIONS["TASKS"][path]["concurrency_key"] is passed to enqueue(): the job is keyed
    (its queue's claims then respect the key limit)."""
    settings.TASKS = {
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {
                **settings.TASKS["default"]["OPTIONS"],
                "TASKS": {"qa.tasks.add": {"concurrency_key": "sum:{a}"}},
            },
        }
    }
    first = add.enqueue(1, 2)
    second = add.enqueue(b=3, a=1)
    other = echo.enqueue(1)  # no option: no key
    keys = dict(
        JobState.objects.filter(pk__in=[int(r.id) for r in (first, second, other)]).values_list(
            "pk", "concurrency_key"
        )
    )
    assert keys == {int(first.id): "sum:1", int(second.id): "sum:1", int(other.id): None}
    run_worker([QUEUE])
    settle(first)
    settle(second)
    assert (first.return_value, second.return_value) == (3, 4)


def test_a_task_option_puts_its_jobs_in_a_sequence(run_worker, settings):
    """OPTIONS["TASKS"][path]["sequence"] (and sequence_on_failure) are passed to
    enqueue(): calls with one key wait for each other, in order."""
    settings.TASKS = {
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {
                **settings.TASKS["default"]["OPTIONS"],
                "TASKS": {
                    "qa.tasks.add": {"sequence": "sum:{a}", "sequence_on_failure": "continue"}
                },
            },
        }
    }
    first, second, other = add.enqueue(1, 2), add.enqueue(b=3, a=1), add.enqueue(7, 1)
    rows = dict(
        JobState.objects.filter(pk__in=[int(r.id) for r in (first, second, other)]).values_list(
            "pk", "status"
        )
    )
    assert rows == {int(first.id): "pending", int(second.id): "waiting", int(other.id): "pending"}
    assert JobState.objects.get(pk=int(second.id)).sequence_on_failure == "continue"
    run_worker([QUEUE])
    settle(first)
    settle(second)
    assert (first.return_value, second.return_value) == (3, 4)


def test_a_task_whose_worker_vanished_shows_the_lost_attempt_and_runs_again(run_worker):
    result = add.enqueue(4, 5)
    vanished = Store("default", "pgqueue test: a worker that dies")
    try:
        vanished.claim(QUEUE, 1, "gone:1:abc", 0.1)  # claims, then never renews
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING
        assert result.worker_ids == ["gone:1:abc"]
        time.sleep(0.3)
        vanished.sweep()
    finally:
        vanished.close()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    [error] = result.errors
    assert error.exception_class_path == "django_pgqueue.LeaseExpired"
    assert error.exception_class is LeaseExpired
    assert "the lease ran out" in error.traceback

    run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 9
    assert result.attempts == 2
    assert result.worker_ids[0] == "gone:1:abc"


def test_deferred_task_runs_no_earlier_than_run_after(run_worker):
    run_after = timezone.now() + dt.timedelta(seconds=2)
    result = add.using(run_after=run_after).enqueue(1, 1)
    run_worker([QUEUE])
    time.sleep(0.5)  # the worker is up and polling
    result.refresh()
    if timezone.now() < run_after:  # looked before it was due (a loaded machine may not)
        assert result.status == TaskResultStatus.READY

    settle(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.started_at >= run_after  # on the database's clock: claimed once due
    assert result.task.run_after == run_after


def test_higher_priority_runs_first(run_worker):
    for priority in (-50, 0, 100, 10, -100):
        record.using(priority=priority).enqueue(f"p{priority}")
    run_worker([QUEUE], concurrency=1, batch_size=10, burst=True).join()
    ran = list(TaskCall.objects.order_by("id").values_list("label", flat=True))
    assert ran == ["p100", "p10", "p0", "p-50", "p-100"]


def test_async_task_through_the_async_api(run_worker):
    async def enqueue():
        return await async_add.aenqueue(20, 22)

    result = async_to_sync(enqueue)()
    assert result.status == TaskResultStatus.READY
    worker = run_worker([QUEUE], burst=True)
    worker.join()
    assert worker.worker.event_loop.started  # awaited on the worker's loop, not a thread

    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    fetched = async_to_sync(async_add.aget_result)(result.id)
    assert fetched.return_value == 42


def test_unknown_and_foreign_result_ids():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("987654321")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("not-a-number")
    from django_pgqueue import enqueue

    plain = enqueue("qa.noop", {"x": 1}, queue=QUEUE)  # a handler job, not a task
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(plain.id))
    other = echo.enqueue(1)
    with pytest.raises(TaskResultMismatch):
        add.get_result(other.id)


def test_arguments_that_are_not_json_are_refused_before_anything_is_written():
    with pytest.raises(TypeError, match=r"args\[0\] is a datetime"):
        echo.enqueue(timezone.now())
    with pytest.raises(TypeError, match=r"kwargs\['ids'\] is a set"):
        echo.enqueue(ids={1, 2})
    with pytest.raises(TypeError, match=r"args\[0\]\[1\] is a object"):
        echo.enqueue([1, object()])
    assert not Job.objects.exists()


def test_queue_and_priority_are_validated_like_django_does():
    with pytest.raises(InvalidTask, match="not valid for backend"):
        add.using(queue_name="not-configured")
    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=101)
    with pytest.raises(InvalidTask, match="priority must be an integer, got str '5'"):
        add.using(priority="5")
    with pytest.raises(InvalidTask, match="aware"):
        add.using(run_after=dt.datetime(2030, 1, 1))  # naive on purpose


def test_enqueue_is_transactional_and_task_enqueued_waits_for_the_commit():
    seen: list[str] = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver, weak=False)
    try:
        with contextlib.suppress(RuntimeError), transaction.atomic():
            add.enqueue(1, 2)
            raise RuntimeError("the caller's transaction fails")
        assert not Job.objects.exists()
        assert seen == []

        with transaction.atomic():
            result = add.enqueue(3, 4)
            assert seen == []  # not before the commit
        assert seen == [result.id]
        assert Job.objects.get().type == "qa.tasks.add"
    finally:
        task_enqueued.disconnect(receiver)


def test_task_started_and_finished_are_sent_by_the_worker(run_worker):
    events: list[tuple[str, str, str]] = []

    def on_started(sender, task_result, **kwargs):
        events.append(("started", task_result.task.name, str(task_result.status)))

    def on_finished(sender, task_result, **kwargs):
        events.append(("finished", task_result.task.name, str(task_result.status)))

    task_started.connect(on_started, weak=False)
    task_finished.connect(on_finished, weak=False)
    try:
        flaky_result = flaky.enqueue(failures=1)
        explode_result = explode.enqueue("always")  # 2 attempts in the settings
        run_worker([QUEUE])
        settle(flaky_result)
        settle(explode_result)
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    for name, final in (("flaky", "SUCCESSFUL"), ("explode", "FAILED")):
        mine = [(kind, status) for kind, task_name, status in events if task_name == name]
        # One start per attempt; one finish, for the attempt that ended the task.
        assert mine == [("started", "RUNNING"), ("started", "RUNNING"), ("finished", final)]


@pytest.mark.slow
def test_run_queue_worker_process_runs_tasks(worker_process):
    """A fresh process imports each task by its module path and runs it."""
    results = [add.enqueue(n, n) for n in range(5)] + [async_add.enqueue(1, 2)]
    worker = worker_process(QUEUE, "--burst")
    code, output = worker.wait(60)
    assert code == 0, output
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, output
        assert result.worker_ids[0].split(":")[1] == str(worker.pid)
    assert [r.return_value for r in results] == [0, 2, 4, 6, 8, 3]


def test_a_task_with_context_runs_durable_steps_through_current_job(run_worker):
    result = durable_task.enqueue("durable")
    run_worker([QUEUE], poll_interval=0.05)
    deadline = time.monotonic() + 120
    while not result.is_finished and time.monotonic() < deadline:
        time.sleep(0.05)
        result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "durable"
    # The step ran once, though the task ran twice (before and after its sleep).
    assert list(TaskCall.objects.values_list("label", flat=True)) == ["durable"]
