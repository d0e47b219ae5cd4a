"""Run the django-pgqueue demo: a mixed batch of handler jobs, then the shop.

Part 1 enqueues image, email and payment jobs on two queues and works them off.
Part 2 places orders through the shop's view (Django's test client): each order
enqueues a payment task and an email task in its transaction and, through a post_save
signal, a warehouse job on commit. One order is out of stock and rolls back; one is
declined; for one the fake payment gateway charges and then loses its response, so the
payment task is retried and, thanks to its idempotency key, does not charge twice.
The summary is checked against the tables.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError, connections
from django.db.models import Count, Max
from django.test import Client
from django.urls import reverse
from shop.models import FakeGatewayCharge, FakeGatewayFault, Order, Product, SentEmail
from shop.tasks import charge_order
from testproject.dburl import describe

from django_pgqueue import JobSpec, enqueue, enqueue_many
from django_pgqueue.durations import counted
from django_pgqueue.models import Attempt, Job, JobState
from django_pgqueue.worker import Worker

SHOP_QUEUES = ["payments", "emails", "warehouse"]


class Command(BaseCommand):
    help = "Run the django-pgqueue demo: enqueue, work, summarize, check against the tables."

    def handle(self, *args: Any, **options: Any) -> None:
        db = connections["default"].settings_dict
        try:
            tables = connections["default"].introspection.table_names()
        except OperationalError as exc:
            reason = str(exc).strip().splitlines()[-1]
            raise CommandError(
                f"cannot reach PostgreSQL at {describe(db)} ({reason}): start it, set "
                "DATABASE_URL, or run `make demo`, which falls back to an embedded PostgreSQL."
            ) from None
        if "queue_jobs" not in tables:
            raise CommandError(f"{describe(db)} has no queue tables: run manage.py migrate.")
        self.stdout.write(f"demo: using database {describe(db)}")
        checks = self.mixed_batch()
        checks.update(self.shop())
        self.stdout.write("")
        for name, ok in checks.items():
            self.stdout.write(f"check {name}: {'ok' if ok else 'MISMATCH'}")
        consistent = all(checks.values())
        self.stdout.write(
            "\nsummary matches the tables: " + ("yes" if consistent else "NO (see above)")
        )
        if not consistent:
            raise SystemExit(1)

    # -- part 1: handler jobs ----------------------------------------------------------

    def mixed_batch(self) -> dict[str, bool]:
        first_id = next_job_id()
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
            "\npart 1: enqueued 20 image jobs on 'media', 13 email/payment jobs on 'email', "
            "1 job of an unknown type"
        )
        self.stdout.flush()
        run = work_off(["email", "media"], first_id, weights={"email": 2})
        self.stdout.write(f"part 1: all jobs finished in {run.elapsed:.1f}s\n")
        rows = (
            JobState.objects.filter(job_id__gte=first_id)
            .values("queue", "status")
            .annotate(jobs=Count("job_id"))
            .order_by("queue", "status")
        )
        self.stdout.write(f"{'queue':<8} {'status':<10} {'jobs':>5}")
        for row in rows:
            self.stdout.write(f"{row['queue']:<8} {row['status']:<10} {row['jobs']:>5}")
        self.report_workers(run)
        for state in JobState.objects.filter(job_id__gte=first_id, status="dead").select_related(
            "job"
        ):
            self.stdout.write(f"dead: job {state.job_id} {state.job.type}: {state.last_error}")
        return run.checks("part 1")

    # -- part 2: the shop ------------------------------------------------------------------

    def shop(self) -> dict[str, bool]:
        first_id = next_job_id()
        FakeGatewayFault.objects.all().delete()  # a fault left by an interrupted run
        lamp, _ = Product.objects.update_or_create(
            sku="DEMO-LAMP", defaults={"name": "Desk lamp", "price_cents": 2_500, "stock": 5}
        )
        yacht, _ = Product.objects.update_or_create(
            sku="DEMO-YACHT", defaults={"name": "Yacht", "price_cents": 9_000_000, "stock": 1}
        )
        client = Client()
        url = reverse("shop:place-order")
        self.stdout.write("\npart 2: the shop (a view, a signal, @task functions)")

        def post(sku: str, quantity: int, email: str) -> dict[str, Any]:
            jobs_before = Job.objects.count()
            response = client.post(url, {"sku": sku, "quantity": quantity, "email": email})
            body = response.json()
            added = Job.objects.count() - jobs_before
            self.stdout.write(
                f"  POST {url} {sku} x{quantity} for {email} -> {response.status_code} "
                f"{body}; jobs added: {added}"
            )
            return {"status": response.status_code, "jobs_added": added, **body}

        placed = post(lamp.sku, 2, "ada@example.com")
        refused = post(lamp.sku, 50, "bob@example.com")
        declined = post(yacht.sku, 1, "cy@example.com")
        self.stdout.flush()
        run = work_off(SHOP_QUEUES, first_id)
        self.stdout.write(
            "  (now the payment gateway will charge the next request, then lose its answer)"
        )
        FakeGatewayFault.objects.create(kind=FakeGatewayFault.Kind.DROP_RESPONSE, remaining=1)
        retried = post(lamp.sku, 1, "eve@example.com")
        self.stdout.flush()
        work_off(SHOP_QUEUES, first_id, run=run)
        self.stdout.write(f"part 2: all shop jobs finished in {run.elapsed:.1f}s")
        orders = {
            "placed": Order.objects.get(pk=placed["order"]),
            "declined": Order.objects.get(pk=declined["order"]),
            "retried": Order.objects.get(pk=retried["order"]),
        }
        payments = {
            name: charge_order.get_result(order.payment_task_id) for name, order in orders.items()
        }
        charges = {
            charge.order_ref: charge
            for charge in FakeGatewayCharge.objects.filter(
                order_ref__in=[order.pk for order in orders.values()]
            )
        }
        for name, order in orders.items():
            payment = payments[name]
            charge = charges.get(order.pk)
            gateway = (
                f"charge {order.charge_id}, {counted(charge.requests, 'request')} for 1 charge"
                if charge
                else "no charge"
            )
            errors = ", ".join(e.exception_class_path.rsplit(".", 1)[-1] for e in payment.errors)
            self.stdout.write(
                f"  order {order.pk} ({name}): {order.status}; payment task {payment.status} "
                f"after {counted(payment.attempts, 'attempt')}"
                + (f" [errors: {errors}]" if errors else "")
                + f"; gateway: {gateway}"
            )
        retried_charge = charges.get(orders["retried"].pk)
        if retried_charge is not None and retried_charge.requests == 2:
            self.stdout.write(
                "  the retried payment reused its idempotency key: the gateway answered the "
                "second request with the first charge, and charged once"
            )
        order_ids = [order.pk for order in orders.values()]
        emails = SentEmail.objects.filter(
            idempotency_key__in=[f"pgqueue-{o.email_task_id}" for o in orders.values()]
        ).count()
        tickets = Order.objects.filter(pk__in=order_ids, ticket__isnull=False).count()
        self.stdout.write(f"  confirmation emails sent: {emails}; warehouse tickets: {tickets}")
        self.report_workers(run)
        checks = run.checks("part 2")
        checks.update(
            {
                "part 2: the placed order is paid with one charge": orders["placed"].status
                == Order.Status.PAID
                and charges.get(orders["placed"].pk) is not None
                and charges[orders["placed"].pk].requests == 1,
                "part 2: the out-of-stock order rolled back with no job": refused["status"] == 409
                and refused["jobs_added"] == 0,
                "part 2: the declined card failed once, not retried": payments["declined"].status
                == "FAILED"
                and payments["declined"].attempts == 1
                and orders["declined"].pk not in charges,
                "part 2: the retried payment charged once for two requests": payments[
                    "retried"
                ].attempts
                == 2
                and retried_charge is not None
                and retried_charge.requests == 2
                and orders["retried"].status == Order.Status.PAID,
                "part 2: every order got its email and warehouse ticket": emails == tickets == 3,
                "part 2: each order enqueued 3 jobs": placed["jobs_added"]
                == declined["jobs_added"]
                == retried["jobs_added"]
                == 3,
            }
        )
        return checks

    # -- output ------------------------------------------------------------------------------

    def report_workers(self, run: Run) -> None:
        attempts = run.attempts_by_status()
        self.stdout.write(
            "attempts by the demo's workers: "
            + ", ".join(f"{status}={n}" for status, n in sorted(attempts.items()))
        )
        self.stdout.write(
            "worker: "
            + ", ".join(
                f"{key}={run.totals.get(key, 0)}"
                for key in ("claimed", "completed", "retried", "dead")
            )
        )


def next_job_id() -> int:
    return (Job.objects.aggregate(top=Max("id"))["top"] or 0) + 1


class Run:
    """What the burst workers of one part did, to compare with the tables."""

    def __init__(self, first_id: int) -> None:
        self.first_id = first_id
        self.totals: dict[str, int] = {}
        self.worker_ids: list[str] = []
        self.elapsed = 0.0

    def attempts_by_status(self) -> dict[str, int]:
        rows = (
            Attempt.objects.filter(worker_id__in=self.worker_ids)
            .values("status")
            .annotate(n=Count("id"))
        )
        return {row["status"]: row["n"] for row in rows}

    def checks(self, part: str) -> dict[str, bool]:
        """What the workers counted against the attempt rows they wrote, and the jobs."""
        by_attempt = self.attempts_by_status()
        jobs = dict(
            JobState.objects.filter(job_id__gte=self.first_id)
            .values_list("status")
            .annotate(n=Count("job_id"))
        )
        return {
            f"{part}: claimed = attempts": self.totals.get("claimed", 0)
            == sum(by_attempt.values()),
            f"{part}: completed = succeeded attempts": self.totals.get("completed", 0)
            == by_attempt.get("succeeded", 0),
            f"{part}: retried + dead = failed attempts": self.totals.get("retried", 0)
            + self.totals.get("dead", 0)
            == by_attempt.get("failed", 0),
            f"{part}: every job finished": sum(jobs.values())
            == jobs.get("completed", 0) + jobs.get("dead", 0),
        }


def work_off(
    queues: list[str],
    first_id: int,
    weights: dict[str, int] | None = None,
    run: Run | None = None,
) -> Run:
    """Run burst workers until every job from `first_id` on is finished (adding to `run`)."""
    run = run or Run(first_id)
    started = time.monotonic() - run.elapsed
    while True:
        worker = Worker(
            queues,
            concurrency=4,
            batch_size=4,
            weights=weights or {},
            burst=True,
            install_signal_handlers=True,
        )
        run.worker_ids.append(worker.worker_id)
        worker.run()
        for key, value in worker.stats.items():
            run.totals[key] = run.totals.get(key, 0) + value
        waiting = JobState.objects.filter(job_id__gte=first_id, status__in=["pending", "running"])
        if not waiting.exists():
            break
        time.sleep(0.2)  # retries are scheduled a moment ahead
    run.elapsed = time.monotonic() - started
    return run
