"""The shop end to end: a view that enqueues in its transaction, a post_save signal that
enqueues on commit, and a payment task that a retry cannot make charge twice."""

from __future__ import annotations

import contextlib

import pytest
from django.db import transaction
from django.urls import reverse
from shop.models import (
    FakeGatewayCharge,
    FakeGatewayFault,
    Order,
    Product,
    SentEmail,
    WarehouseTicket,
)
from shop.tasks import charge_order, send_order_confirmation

from django_pgqueue.models import Job
from tests.integration.tasks.api import TaskResultStatus, settle

pytestmark = pytest.mark.django_db(transaction=True)

SHOP_QUEUES = ["payments", "emails", "warehouse"]


@pytest.fixture
def lamp() -> Product:
    return Product.objects.create(sku="LAMP", name="Desk lamp", price_cents=2_500, stock=3)


def place(client, **data):
    return client.post(reverse("shop:place-order"), {"sku": "LAMP", "quantity": 1, **data})


def test_an_order_enqueues_payment_and_email_in_its_transaction(client, lamp, run_worker):
    response = place(client, quantity=2, email="ada@example.com")
    assert response.status_code == 201
    body = response.json()
    order = Order.objects.get(pk=body["order"])
    assert order.total_cents == 5_000
    # The view's two tasks and the signal's warehouse job, all committed with the order.
    assert sorted(Job.objects.values_list("queue", "type")) == [
        ("emails", "shop.tasks.send_order_confirmation"),
        ("payments", "shop.tasks.charge_order"),
        ("warehouse", "shop.create_warehouse_ticket"),
    ]
    payment = charge_order.get_result(body["payment_task"])
    email = send_order_confirmation.get_result(body["email_task"])
    assert payment.status == email.status == TaskResultStatus.READY
    assert payment.args == [order.pk]

    run_worker(SHOP_QUEUES, burst=True).join()

    order.refresh_from_db()
    lamp.refresh_from_db()
    assert order.status == Order.Status.PAID
    assert lamp.stock == 1
    charge = FakeGatewayCharge.objects.get()
    assert (charge.order_ref, charge.amount_cents, charge.requests) == (order.pk, 5_000, 1)
    assert order.charge_id == f"ch_{charge.pk}"
    assert charge.idempotency_key == f"pgqueue-{payment.id}"
    assert SentEmail.objects.get().to == "ada@example.com"
    assert WarehouseTicket.objects.get().order_id == order.pk
    payment.refresh()
    assert payment.status == TaskResultStatus.SUCCESSFUL
    assert payment.return_value == {"charge_id": order.charge_id, "amount_cents": 5_000}

    status = client.get(reverse("shop:order-status", args=[order.pk])).json()
    assert status["status"] == "paid"
    assert status["tasks"]["payment"]["status"] == "SUCCESSFUL"
    assert status["tasks"]["email"]["attempts"] == 1


def test_a_rolled_back_order_leaves_no_order_no_job_and_no_stock_taken(client, lamp):
    response = place(client, quantity=5, email="bob@example.com")  # 3 in stock
    assert response.status_code == 409
    assert not Order.objects.exists()
    assert not Job.objects.exists()  # neither the view's tasks nor the signal's job
    lamp.refresh_from_db()
    assert lamp.stock == 3


def test_the_signal_enqueues_only_when_the_order_commits(lamp):
    with transaction.atomic():
        order = Order.objects.create(
            product=lamp, quantity=1, email="cy@example.com", total_cents=2_500
        )
        assert not Job.objects.exists()  # on_commit: not yet
    job = Job.objects.get()
    assert (job.type, job.queue, job.payload) == (
        "shop.create_warehouse_ticket",
        "warehouse",
        {"order_id": order.pk},
    )

    with contextlib.suppress(RuntimeError), transaction.atomic():
        Order.objects.create(product=lamp, quantity=1, email="dee@example.com", total_cents=1)
        raise RuntimeError("rolled back")
    assert Job.objects.count() == 1
    order.save()  # an update, not a creation: no second job
    assert Job.objects.count() == 1


def test_a_retried_payment_never_charges_twice(client, lamp, run_worker):
    # The gateway makes the first charge, then its response is lost: the task sees a
    # timeout and is retried. The retry carries the same idempotency key, so the
    # gateway answers with the charge it already made.
    FakeGatewayFault.objects.create(kind=FakeGatewayFault.Kind.DROP_RESPONSE, remaining=1)
    body = place(client, email="eve@example.com").json()
    payment = charge_order.get_result(body["payment_task"])
    run_worker(["payments"])
    settle(payment)

    assert payment.status == TaskResultStatus.SUCCESSFUL
    assert payment.attempts == 2
    [error] = payment.errors
    assert error.exception_class_path == "shop.services.GatewayTimeout"
    charge = FakeGatewayCharge.objects.get()  # one charge ...
    assert charge.requests == 2  # ... for two requests
    assert charge.amount_cents == 2_500
    order = Order.objects.get(pk=body["order"])
    assert order.status == Order.Status.PAID
    assert order.charge_id == f"ch_{charge.pk}"


def test_a_declined_card_is_not_retried_and_an_unavailable_gateway_is(client, lamp, run_worker):
    expensive = Product.objects.create(sku="YACHT", name="Yacht", price_cents=9_000_000, stock=1)
    declined = place(client, sku=expensive.sku, email="gus@example.com").json()
    run_worker(["payments"])
    refused = settle(charge_order.get_result(declined["payment_task"]))
    assert refused.status == TaskResultStatus.FAILED
    assert refused.attempts == 1  # PermanentFailure: dead at once, not retried
    [error] = refused.errors
    assert error.exception_class_path == "django_pgqueue.exceptions.PermanentFailure"
    assert "card declined" in error.traceback
    assert Order.objects.get(pk=declined["order"]).status == Order.Status.PAYMENT_FAILED

    FakeGatewayFault.objects.create(kind=FakeGatewayFault.Kind.UNAVAILABLE, remaining=2)
    ok = place(client, email="fay@example.com").json()
    paid = settle(charge_order.get_result(ok["payment_task"]))
    assert paid.status == TaskResultStatus.SUCCESSFUL
    assert paid.attempts == 3
    assert [e.exception_class_path for e in paid.errors] == [
        "shop.services.GatewayUnavailable",
        "shop.services.GatewayUnavailable",
    ]
    assert FakeGatewayCharge.objects.get().requests == 1
