"""Job types for the cancellation tests (docs/concepts/cancelling.md).

Each records an effect row when it starts (sync ones) or touches ``payload["started_file"]``
(async ones, which cannot use Django's connection), so that a test knows the run is under way
before it cancels it.
"""

import asyncio
import os
import time
from pathlib import Path

from django.db import connection

from django_dbqueue import job


def _started(ctx):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (%s, %s, %s, %s)",
            [ctx.id, ctx.attempt, ctx.worker_id, os.getpid()],
        )


@job("cooperative", max_attempts=3)
def cooperative(ctx):
    """A long run that stops cleanly when cancelled: checks between small steps."""
    _started(ctx)
    deadline = time.monotonic() + ctx.payload.get("seconds", 60)
    while time.monotonic() < deadline:
        ctx.raise_if_cancelled()
        time.sleep(0.01)
    return {"finished": True}


@job("ignores-cancel", max_attempts=3)
def ignores_cancel(ctx):
    """Never checks: runs for payload["seconds"] whatever happens, and returns a result."""
    _started(ctx)
    deadline = time.monotonic() + ctx.payload.get("seconds", 2)
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return {"ran_to_the_end": True, "saw_cancel": ctx.cancelled}


@job("fails-when-cancelled", max_attempts=3)
def fails_when_cancelled(ctx):
    """Notices the cancel and then fails on its way out (a cleanup that raises)."""
    _started(ctx)
    deadline = time.monotonic() + ctx.payload.get("seconds", 60)
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.01)
    raise ValueError("cleanup failed after the cancel")


@job("async-cooperative", max_attempts=3)
async def async_cooperative(ctx):
    """An async run that never checks: the worker cancels its task."""
    Path(ctx.payload["started_file"]).touch()
    await asyncio.sleep(ctx.payload.get("seconds", 60))
    return {"finished": True}


@job("cancels-itself", max_attempts=3)
def cancels_itself(ctx):
    from django_dbqueue import JobCancelled

    raise JobCancelled("nothing left to do")


@job("atomic-cancellable", atomic=True, timeout=30, max_attempts=3)
def atomic_cancellable(ctx):
    """An atomic handler: writes an effect row (which commits only with its completion), says
    it started through a file, then waits for the cancel. ``payload["stop"]`` makes it raise
    JobCancelled (its writes roll back); otherwise it returns (its writes and result commit)."""
    _started(ctx)
    Path(ctx.payload["started_file"]).touch()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.01)
    if ctx.payload.get("stop"):
        ctx.raise_if_cancelled()
    return {"kept": True}
