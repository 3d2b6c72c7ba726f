"""Batch handlers (docs/batches.md) for the acceptance tests and the soak: real worker processes
run them, so every observation goes to the database."""

import os
import time

from django.db import connection

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


@job("accept-batch-hold", batch_size=10)
def accept_batch_hold(batch):
    """Records one Effect per job as it starts (``worker`` "started"), then waits until none of
    its jobs is ``running`` any more (the shutdown handed them back) or ``seconds`` passed, then
    records one Effect per job (``worker`` "returned") and returns, marking every job done: the
    return comes after the release, inside the process, so that its outcomes must be discarded.
    A run of jobs that returned before (their second run) returns at once."""
    ids = [ctx.id for ctx in batch]
    Effect.objects.bulk_create(
        Effect(job_id=ctx.id, attempt=ctx.attempt, worker="started", pid=os.getpid())
        for ctx in batch
    )
    again = Effect.objects.filter(job_id__in=ids, worker="returned").exists()  # a second run
    deadline = time.monotonic() + max(ctx.payload.get("seconds", 60) for ctx in batch)
    while not again and time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'running'",
                [ids],
            )
            if cursor.fetchone()[0] == 0:
                break
        time.sleep(0.01)  # the handler's own polling, not a test's wait
    for ctx in batch:
        batch.succeed(ctx, {"returned": True})
    Effect.objects.bulk_create(
        Effect(job_id=ctx.id, attempt=ctx.attempt, worker="returned", pid=os.getpid())
        for ctx in batch
    )
