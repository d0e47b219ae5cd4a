"""Plain django_pgqueue handlers, next to the @task functions in tasks.py.

Both kinds of job share the tables and the worker; a handler receives a JobContext
(payload, attempt, idempotency key, lease) instead of the call's arguments.
"""

from __future__ import annotations

from typing import Any

import django_pgqueue
from django_pgqueue import JobContext

from .models import Product, WarehouseTicket


@django_pgqueue.handler("shop.create_warehouse_ticket", max_attempts=10)
def create_warehouse_ticket(ctx: JobContext) -> dict[str, Any]:
    """Make the order's pick ticket; a second run finds it instead of making another."""
    ticket, created = WarehouseTicket.objects.get_or_create(order_id=ctx.payload["order_id"])
    return {"ticket": ticket.pk, "created": created}


@django_pgqueue.handler("shop.sync_stock", queue="warehouse")
def sync_stock(ctx: JobContext) -> dict[str, Any]:
    """Push a product's stock to the storefront (here: read it back, as that call would)."""
    product = Product.objects.get(sku=ctx.payload["sku"])
    return {"sku": product.sku, "stock": product.stock}
