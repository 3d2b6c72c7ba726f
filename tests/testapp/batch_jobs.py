"""Batch handlers (docs/batches.md) for the acceptance tests and the soak: real worker processes
run them, so every observation goes to the database."""

import os
import time

from django_dbqueue import job

from .models import Effect


@job("accept-batch", batch_size=50)
def accept_batch(batch):
    """Fails the jobs whose payload says so on their first attempt (alone); records one Effect
    per job it lets succeed (its attempt, and in ``worker`` the size of the batch it ran in),
    then holds the batch ``hold`` seconds, so that a kill lands in the middle of batches."""
    ok = []
    for ctx in batch:
        if ctx.payload.get("fail_first") and ctx.attempt == 1:
            batch.fail(ctx, ValueError(f"planned failure of job #{ctx.id}"))
        else:
            ok.append(ctx)
    Effect.objects.bulk_create(
        Effect(job_id=ctx.id, attempt=ctx.attempt, worker=f"batch:{len(batch)}", pid=os.getpid())
        for ctx in ok
    )
    hold = max((ctx.payload.get("hold", 0) for ctx in batch), default=0)
    if hold:
        time.sleep(hold)  # the handler's own work: not a test waiting on a condition
