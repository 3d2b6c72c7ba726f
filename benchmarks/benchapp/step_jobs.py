"""Job types of benchmarks/steps.py: a handler that calls a small function ``n`` times, directly
or as ``n`` durable steps of one name. Imported by jobs.py, so the worker process discovers
them."""

from django.db import connection

from django_dbqueue import job

# The query a run's first step makes to read the job's recorded steps (store/steps.py,
# LOAD_STEPS), made by hand: the reference for what a replay costs.
READ_STEPS = "SELECT name, occurrence, result::text FROM dbqueue_step WHERE job_id = %s"


def value(i):
    """The work of one call: nothing but a small JSON result."""
    return i


@job("bench-calls")
def calls(ctx):
    """``value(i)`` called ``n`` times, directly; first, with ``query``, the one query a run
    with steps makes to read its records, on the job's connection as ctx.step makes it."""
    if ctx.payload.get("query"):
        with connection.cursor() as cursor:
            cursor.execute(READ_STEPS, [ctx.id])
            cursor.fetchall()
    return [value(i) for i in range(1, ctx.payload["n"] + 1)]


@job("bench-steps")
def steps(ctx):
    """The same calls as ``n`` steps named "s" (occurrences 1 to n): each records its result,
    or returns the recorded one when the job has it already."""
    return [ctx.step("s", value, i) for i in range(1, ctx.payload["n"] + 1)]
