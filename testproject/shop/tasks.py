"""The shop's background work, written with Django's own @task API.

With ``TASKS["default"]["BACKEND"] = "django_pgqueue.backends.PgQueueBackend"`` each
``.enqueue()`` writes a job in the caller's transaction, and ``run_queue_worker
payments emails`` runs it: retried with backoff when it raises, dead after its last
attempt, the whole history visible through ``.get_result()`` and the admin.
"""

from __future__ import annotations

from typing import Any

from django_pgqueue import PermanentFailure
from django_pgqueue.backends import idempotency_key

from . import services
from .models import Order

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task


@task(queue_name="payments", takes_context=True)
def charge_order(context: TaskContext, order_id: int) -> dict[str, Any]:
    """Charge an order's total; a retry reuses the job's key, so it never charges twice."""
    order = Order.objects.get(pk=order_id)
    try:
        charge_id = services.charge(
            idempotency_key=idempotency_key(context),
            amount_cents=order.total_cents,
            order_ref=order.pk,
        )
    except services.CardDeclined as exc:
        Order.objects.filter(pk=order.pk).update(status=Order.Status.PAYMENT_FAILED)
        raise PermanentFailure(f"card declined: {exc}") from exc
    # GatewayTimeout and GatewayUnavailable propagate: the job is retried with backoff.
    Order.objects.filter(pk=order.pk).update(status=Order.Status.PAID, charge_id=charge_id)
    return {"charge_id": charge_id, "amount_cents": order.total_cents}


@task(queue_name="emails", takes_context=True)
def send_order_confirmation(context: TaskContext, order_id: int) -> int:
    """Mail the order confirmation, at most once per job."""
    order = Order.objects.select_related("product").get(pk=order_id)
    return services.send_email(
        idempotency_key=idempotency_key(context),
        to=order.email,
        subject=f"Order #{order.pk} received",
        body=f"{order.quantity} x {order.product.name}: {order.total_cents / 100:.2f} EUR.",
    )
