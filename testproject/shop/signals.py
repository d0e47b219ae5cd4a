"""Enqueue from a signal: a new order gets a warehouse ticket once it is committed."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

import django_pgqueue

from .models import Order


@receiver(post_save, sender=Order)
def order_placed(sender: type[Order], instance: Order, created: bool, **kwargs: Any) -> None:
    """Enqueue the warehouse job when the transaction that created the order commits.

    A signal receiver cannot tell whether its caller's transaction will commit, so it
    defers the enqueue with on_commit: a rolled-back order enqueues nothing. (The
    queue's enqueue is transactional too, so enqueuing directly here would be just as
    safe and would survive a crash between COMMIT and the callback; on_commit is the
    pattern that also works for side effects outside the database.)
    """
    if not created:
        return
    transaction.on_commit(
        partial(
            django_pgqueue.enqueue,
            "shop.create_warehouse_ticket",
            {"order_id": instance.pk},
            queue="warehouse",
        ),
        robust=True,  # the order is committed already: log a failure, don't raise it
    )
