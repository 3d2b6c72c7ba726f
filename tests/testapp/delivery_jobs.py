"""Job types that perform a (fake) costly side effect through delivery records."""

import os
import time

from django.db import connection

from django_dbqueue import job
from django_dbqueue.deliveries import DeliveryFailed, deliver


def provider_send(key, ctx):
    """The fake provider: every call is one row in testapp_providercall."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_providercall (key, job_id, attempt) VALUES (%s, %s, %s)",
            [key, getattr(ctx, "id", None), getattr(ctx, "attempt", 0)],
        )
    return f"ref-{key}-{getattr(ctx, 'attempt', 0)}"


def _wait_for(flag, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (flag and os.path.exists(flag)):
        time.sleep(0.01)


@job("deliver-sms", max_attempts=5)
def deliver_sms(ctx):
    """payload: key; reject_attempts (attempts on which the provider definitely rejects);
    hold_before_send / hold_after_send: wait until payload["until_file"] exists (max 60 s)."""
    payload = ctx.payload
    with deliver(ctx, payload["key"]) as delivery:
        if not delivery.proceed:
            return {"skipped": delivery.state}
        if payload.get("hold_before_send"):
            _wait_for(payload.get("until_file"), 60)
        if ctx.attempt in payload.get("reject_attempts", []):
            raise DeliveryFailed(f"provider rejected attempt {ctx.attempt}")
        reference = provider_send(payload["key"], ctx)
        if payload.get("hold_after_send"):
            _wait_for(payload.get("until_file"), 60)
        delivery.sent(reference)
    return {"sent": reference}


@job("atomic-effect", atomic=True, timeout=30)
def atomic_effect(ctx):
    """Writes one Effect row in the job's own transaction; holds on payload["hold_attempts"]."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (%s, %s, %s, %s)",
            [ctx.id, ctx.attempt, ctx.worker_id, os.getpid()],
        )
    if ctx.attempt in ctx.payload.get("hold_attempts", []):
        _wait_for(ctx.payload.get("until_file"), 60)
