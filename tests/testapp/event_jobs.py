"""Subscribers of the events the publish/subscribe tests publish (docs/events.md).

Each handler is atomic: its effect row and its job's completion commit together, so the
effect rows count the runs that reached done (a run killed with kill -9 leaves none).
"""

import os
import time

from django.db import connection

from django_dbqueue import job


def _effect(ctx):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (%s, %s, %s, %s)",
            [ctx.id, ctx.attempt, ctx.worker_id, os.getpid()],
        )


@job("ledger-on-paid", subscribes=["test.invoice.paid"], atomic=True, timeout=30)
def ledger_on_paid(ctx):
    """Blocks its first attempt while the payload's ``hold_file`` does not exist (the test
    kills its worker then); a later attempt runs at once."""
    hold = ctx.payload.get("hold_file")
    if hold and ctx.attempt == 1:
        deadline = time.monotonic() + 30
        while not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.01)
    _effect(ctx)


@job(
    "email-on-paid",
    subscribes=["test.invoice.paid", "test.invoice.refunded"],
    priority=5,
    max_attempts=4,
    atomic=True,
    timeout=30,
)
def email_on_paid(ctx):
    _effect(ctx)


@job("flaky-on-paid", subscribes=["test.invoice.paid"], max_attempts=3, atomic=True, timeout=30)
def flaky_on_paid(ctx):
    """Fails its first attempt when the payload says ``flaky``; the retry succeeds."""
    if ctx.payload.get("flaky") and ctx.attempt == 1:
        raise RuntimeError("the first delivery of this event fails")
    _effect(ctx)


@job("late-subscriber", atomic=True, timeout=30)
def late_subscriber(ctx):
    """Subscribes to nothing by itself: tests list it in DBQUEUE["SUBSCRIPTIONS"] or replay."""
    _effect(ctx)
