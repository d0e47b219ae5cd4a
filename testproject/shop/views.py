"""Place an order: the order, its payment job and its email job commit together or not at all.

Adjust a product's stock from an async view: the update and the job that pushes the new
stock to the storefront commit together too (`aatomic`, `aenqueue`).
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import Http404, HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_POST

import django_pgqueue

from .models import Order, Product
from .tasks import charge_order, send_order_confirmation


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """POST sku, quantity, email: 201 with the order and its task ids, 409 if out of stock."""
    sku = request.POST.get("sku", "")
    email = request.POST.get("email", "")
    try:
        quantity = int(request.POST.get("quantity", "1"))
    except ValueError:
        quantity = 0
    if quantity < 1 or "@" not in email:
        return JsonResponse({"error": "quantity must be >= 1 and email valid"}, status=400)
    product = get_object_or_404(Product, sku=sku)
    try:
        with transaction.atomic():
            order = Order.objects.create(
                product=product,
                quantity=quantity,
                email=email,
                total_cents=product.price_cents * quantity,
            )
            # Both jobs are rows of this transaction: no worker can see them before
            # the order exists, and a rollback below takes them away with the order.
            payment = charge_order.enqueue(order.pk)
            confirmation = send_order_confirmation.enqueue(order.pk)
            order.payment_task_id = payment.id
            order.email_task_id = confirmation.id
            order.save(update_fields=["payment_task_id", "email_task_id"])
            # Last, take the stock; the CHECK (stock >= 0) refuses to oversell.
            Product.objects.filter(pk=product.pk).update(stock=F("stock") - quantity)
    except IntegrityError:
        return JsonResponse({"error": f"{product.sku} is out of stock"}, status=409)
    return JsonResponse(
        {"order": order.pk, "payment_task": payment.id, "email_task": confirmation.id},
        status=201,
    )


@require_GET
def order_status(request: HttpRequest, pk: int) -> JsonResponse:
    """The order and what its tasks did, read back with TaskResult from the queue tables."""
    order = get_object_or_404(Order, pk=pk)
    tasks = {}
    for name, task, result_id in (
        ("payment", charge_order, order.payment_task_id),
        ("email", send_order_confirmation, order.email_task_id),
    ):
        if not result_id:
            continue
        result = task.get_result(result_id)
        tasks[name] = {
            "status": str(result.status),
            "attempts": result.attempts,
            "errors": [error.exception_class_path for error in result.errors],
            "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
        }
    return JsonResponse({"order": order.pk, "status": order.status, "tasks": tasks})


@require_POST
async def adjust_stock(request: HttpRequest, sku: str) -> JsonResponse:
    """POST change (+5, -2): 200 with the new stock and its sync job, 409 below zero."""
    try:
        change = int(request.POST.get("change", ""))
    except ValueError:
        return JsonResponse({"error": "change must be an integer"}, status=400)
    try:
        async with django_pgqueue.aatomic():
            # Enqueued first: the update below may be refused, and takes the job with it.
            job = await django_pgqueue.aenqueue("shop.sync_stock", {"sku": sku})
            updated = await Product.objects.filter(sku=sku).aupdate(stock=F("stock") + change)
            if not updated:
                raise Http404(f"no product {sku!r}")
    except IntegrityError:  # the CHECK (stock >= 0)
        return JsonResponse({"error": f"{sku} has too little stock"}, status=409)
    product = await Product.objects.aget(sku=sku)
    return JsonResponse({"sku": sku, "stock": product.stock, "sync_job": job.id})
