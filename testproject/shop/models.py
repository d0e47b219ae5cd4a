"""A small shop: products, orders, and two fake external services.

`FakeGatewayCharge` and `SentEmail` stand for systems the shop does not own (a payment
provider, a mail provider). They live in this database only so that tests and the demo
can look at what "the outside world" saw; the shop's code talks to them through
`shop.services` as it would over HTTP, with an idempotency key on every request.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class Product(models.Model):
    sku = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    price_cents = models.PositiveIntegerField()
    stock = models.IntegerField(default=0)

    class Meta:
        db_table = "shop_product"
        constraints = [
            # Overselling is refused by the database: the UPDATE that takes the stock
            # fails, and the order's transaction (its jobs included) rolls back.
            models.CheckConstraint(condition=Q(stock__gte=0), name="shop_product_stock_nonnegative")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.sku})"


class Order(models.Model):
    class Status(models.TextChoices):
        PLACED = "placed"
        PAID = "paid"
        PAYMENT_FAILED = "payment_failed", "payment failed"

    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    quantity = models.PositiveIntegerField()
    email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PLACED)
    charge_id = models.CharField(max_length=64, blank=True, default="")
    # The TaskResult ids of the jobs the order enqueued, for its status page.
    payment_task_id = models.CharField(max_length=64, blank=True, default="")
    email_task_id = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "shop_order"

    def __str__(self) -> str:
        return f"order #{self.pk} ({self.status})"


class WarehouseTicket(models.Model):
    """A pick ticket for the warehouse, made by a job the post_save signal enqueues."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="ticket")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "shop_warehouse_ticket"

    def __str__(self) -> str:
        return f"ticket for order #{self.order_id}"


class FakeGatewayCharge(models.Model):
    """The payment provider's ledger: at most one charge per idempotency key."""

    idempotency_key = models.CharField(max_length=255, unique=True)
    order_ref = models.BigIntegerField()  # the provider's copy of our order id, not a FK
    amount_cents = models.PositiveIntegerField()
    # Requests that carried this key: more than one means a retry was answered with
    # the charge already made, not charged again.
    requests = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "shop_fake_gateway_charge"

    def __str__(self) -> str:
        return f"charge {self.pk}: {self.amount_cents} cents for order {self.order_ref}"


class FakeGatewayFault(models.Model):
    """A fault the payment provider will inject into its next `remaining` requests."""

    class Kind(models.TextChoices):
        # The charge is made, then the response is lost: the caller sees a timeout.
        DROP_RESPONSE = "drop_response", "charge, then lose the response"
        # Nothing is charged: the provider answers 503.
        UNAVAILABLE = "unavailable", "unavailable (nothing charged)"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    remaining = models.PositiveIntegerField(default=1)

    class Meta:
        db_table = "shop_fake_gateway_fault"

    def __str__(self) -> str:
        return f"{self.kind} x{self.remaining}"


class SentEmail(models.Model):
    """The mail provider's outbox: at most one message per idempotency key."""

    idempotency_key = models.CharField(max_length=255, unique=True)
    to = models.EmailField()
    subject = models.CharField(max_length=200)
    body = models.TextField()
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "shop_sent_email"

    def __str__(self) -> str:
        return f"{self.subject} -> {self.to}"
