"""Fake external services: a payment gateway and a mail provider.

Both behave like the real APIs they stand for: a request carries an idempotency key,
and a second request with a key already seen returns the first request's outcome
instead of charging or sending again. That is what makes a retried job safe: the
queue delivers at least once, the provider applies at most once.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from .models import FakeGatewayCharge, FakeGatewayFault, SentEmail

# The fake gateway declines any single charge above this amount.
DECLINE_ABOVE_CENTS = 1_000_000


class GatewayError(Exception):
    """The payment gateway did not give an answer; the request may be retried."""


class GatewayTimeout(GatewayError):
    """No response arrived: the charge may or may not have been made."""


class GatewayUnavailable(GatewayError):
    """The gateway answered 503: nothing was charged."""


class CardDeclined(Exception):
    """The gateway refused the charge: retrying will not help."""


class IdempotencyKeyReused(Exception):
    """The key was used before with a different amount (a bug on the caller's side)."""


def charge(*, idempotency_key: str, amount_cents: int, order_ref: int) -> str:
    """Charge `amount_cents` once per `idempotency_key`; return the charge id."""
    with transaction.atomic():
        fault = (
            FakeGatewayFault.objects.select_for_update()
            .filter(remaining__gt=0)
            .order_by("pk")
            .first()
        )
        if fault is not None:
            FakeGatewayFault.objects.filter(pk=fault.pk).update(remaining=F("remaining") - 1)
        if fault is not None and fault.kind == FakeGatewayFault.Kind.UNAVAILABLE:
            lost_response = False
            unavailable = True
        else:
            unavailable = False
            lost_response = fault is not None
            if amount_cents > DECLINE_ABOVE_CENTS:
                raise CardDeclined(f"amount {amount_cents} is over the card's limit")
            made, created = FakeGatewayCharge.objects.get_or_create(
                idempotency_key=idempotency_key,
                defaults={"amount_cents": amount_cents, "order_ref": order_ref},
            )
            if not created:
                if made.amount_cents != amount_cents:
                    raise IdempotencyKeyReused(
                        f"key {idempotency_key!r} was used for {made.amount_cents} cents"
                    )
                FakeGatewayCharge.objects.filter(pk=made.pk).update(requests=F("requests") + 1)
    # Outside the transaction: what the gateway did is committed either way.
    if unavailable:
        raise GatewayUnavailable("payment gateway answered 503 Service Unavailable")
    if lost_response:
        raise GatewayTimeout("no response from the payment gateway within 10s")
    return f"ch_{made.pk}"


def send_email(*, idempotency_key: str, to: str, subject: str, body: str) -> int:
    """Send a message once per `idempotency_key`; return the message id."""
    message, _created = SentEmail.objects.get_or_create(
        idempotency_key=idempotency_key, defaults={"to": to, "subject": subject, "body": body}
    )
    return message.pk
