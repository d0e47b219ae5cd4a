"""Demo handlers: found by django_pgqueue's autodiscovery of each app's jobs module."""

from __future__ import annotations

import time
from typing import Any

import django_pgqueue
from django_pgqueue import FixedDelay, JobContext, PermanentFailure


@django_pgqueue.handler("demo.resize_image")
def resize_image(ctx: JobContext) -> dict[str, Any]:
    time.sleep(ctx.payload.get("seconds", 0.01))
    width, height = ctx.payload["size"]
    return {"thumbnail": [width // 4, height // 4]}


@django_pgqueue.handler("demo.send_email", max_attempts=4)
def send_email(ctx: JobContext) -> None:
    """Fails its first `flaky` attempts, like a mail server having a bad minute."""
    if ctx.attempt <= ctx.payload.get("flaky", 0):
        raise ConnectionError(f"SMTP server unavailable (attempt {ctx.attempt})")


@django_pgqueue.handler("demo.charge_card", max_attempts=3, retry=FixedDelay(0.1))
def charge_card(ctx: JobContext) -> dict[str, Any]:
    if ctx.payload.get("card") == "declined":
        raise PermanentFailure("card declined by the issuer: do not retry")
    if ctx.payload.get("card") == "broken":
        raise RuntimeError("payment gateway returned 502")
    return {"charged": ctx.payload["amount"], "idempotency_key": ctx.idempotency_key}
