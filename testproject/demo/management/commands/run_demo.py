"""Enqueue a mixed batch of demo jobs on two queues, work them off, print what happened."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand
from django.db import connections
from django.db.models import Count, Max
from testproject.dburl import describe

from django_pgqueue import JobSpec, enqueue, enqueue_many
from django_pgqueue.models import Attempt, Job, JobState
from django_pgqueue.worker import Worker


class Command(BaseCommand):
    help = "Run the django-pgqueue demo: enqueue, work, summarize."

    def handle(self, *args: Any, **options: Any) -> None:
        db = connections["default"].settings_dict
        self.stdout.write(f"demo: using database {describe(db)}")
        first_id = (Job.objects.aggregate(top=Max("id"))["top"] or 0) + 1

        images = [
            JobSpec("demo.resize_image", {"size": [800 + i, 600], "seconds": 0.02})
            for i in range(20)
        ]
        emails = [
            JobSpec("demo.send_email", {"to": f"user{i}@example.com", "flaky": i % 3})
            for i in range(10)
        ]
        enqueue_many(images, queue="media")
        enqueue_many(emails, queue="email")
        enqueue("demo.charge_card", {"amount": 42, "card": "ok"}, queue="email", priority=10)
        enqueue("demo.charge_card", {"amount": 7, "card": "broken"}, queue="email")
        enqueue("demo.charge_card", {"amount": 9, "card": "declined"}, queue="email")
        enqueue("demo.no_such_handler", {"x": 1}, queue="media")
        self.stdout.write(
            "demo: enqueued 20 image jobs on 'media', 13 email/payment jobs on 'email', "
            "1 job of an unknown type"
        )

        self.stdout.flush()
        started = time.monotonic()
        totals: dict[str, int] = {}
        worker_ids: list[str] = []
        while True:
            worker = Worker(
                ["email", "media"],
                concurrency=4,
                batch_size=4,
                weights={"email": 2},
                burst=True,
                install_signal_handlers=True,
            )
            worker_ids.append(worker.worker_id)
            worker.run()
            for key, value in worker.stats.items():
                totals[key] = totals.get(key, 0) + value
            waiting = JobState.objects.filter(
                job_id__gte=first_id, status__in=["pending", "running"]
            )
            if not waiting.exists():
                break
            time.sleep(0.2)  # retries are scheduled a moment ahead
        elapsed = time.monotonic() - started

        self.stdout.write(f"\ndemo: all jobs finished in {elapsed:.1f}s\n")
        rows = (
            JobState.objects.filter(job_id__gte=first_id)
            .values("queue", "status")
            .annotate(jobs=Count("job_id"))
            .order_by("queue", "status")
        )
        self.stdout.write(f"{'queue':<8} {'status':<10} {'jobs':>5}")
        for row in rows:
            self.stdout.write(f"{row['queue']:<8} {row['status']:<10} {row['jobs']:>5}")
        attempts = (
            Attempt.objects.filter(worker_id__in=worker_ids)
            .values("status")
            .annotate(n=Count("id"))
            .order_by("status")
        )
        self.stdout.write(
            "\nattempts by the demo's workers: "
            + ", ".join(f"{a['status']}={a['n']}" for a in attempts)
        )
        self.stdout.write(
            "worker: "
            + ", ".join(
                f"{key}={totals.get(key, 0)}" for key in ("claimed", "completed", "retried", "dead")
            )
        )
        for state in JobState.objects.filter(job_id__gte=first_id, status="dead").select_related(
            "job"
        ):
            self.stdout.write(f"dead: job {state.job_id} {state.job.type}: {state.last_error}")

        # The summary must agree with the tables: what the workers counted against the
        # attempt rows they wrote, and this run's jobs against the attempts they took.
        by_attempt = {a["status"]: a["n"] for a in attempts}
        jobs = {row["status"]: 0 for row in rows}
        for row in rows:
            jobs[row["status"]] += row["jobs"]
        checks = {
            "claimed = attempts": totals.get("claimed", 0) == sum(by_attempt.values()),
            "completed = succeeded attempts": totals.get("completed", 0)
            == by_attempt.get("succeeded", 0),
            "retried + dead = failed attempts": totals.get("retried", 0) + totals.get("dead", 0)
            == by_attempt.get("failed", 0),
            "every demo job finished": sum(jobs.values())
            == jobs.get("completed", 0) + jobs.get("dead", 0),
        }
        for name, ok in checks.items():
            self.stdout.write(f"check {name}: {'ok' if ok else 'MISMATCH'}")
        consistent = all(checks.values())
        self.stdout.write(
            "\nsummary matches the tables: " + ("yes" if consistent else "NO (see above)")
        )
        if not consistent:
            raise SystemExit(1)
