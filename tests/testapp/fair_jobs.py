"""Jobs of a fair queue (docs/fairness.md) for the acceptance tests: real worker processes run
them, so every observation goes to the database."""

import os
import time

from django_dbqueue import job

from .models import Effect


@job("fair-work", fair_key=lambda payload: payload["tenant"], atomic=True, timeout=30)
def fair_work(ctx):
    """Works ``seconds`` (the handler's own work: a run a kill can land in), and records one
    Effect in its own transaction: a run that reached done left exactly one, a killed run none.
    Its queue is given at enqueue (a fair queue of the test's settings): the type's own queue is
    ``default``, so that every settings module of the tests knows it."""
    time.sleep(ctx.payload.get("seconds", 0))
    Effect.objects.create(job_id=ctx.id, attempt=ctx.attempt, worker=ctx.worker_id, pid=os.getpid())
