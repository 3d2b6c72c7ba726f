"""Job types the test suite runs. Behaviour is driven by the payload so tests stay explicit."""

import os
import time

from django.db import connection

from django_dbqueue import DiscardJob, RetryJob, job


@job("noop")
def noop(ctx):
    return None


@job("echo")
def echo(ctx):
    return ctx.payload


@job("record", queue="default")
def record(ctx):
    """Insert a row into testapp_effect for every run: how tests count executions."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (%s, %s, %s, %s)",
            [ctx.id, ctx.attempt, ctx.worker_id, os.getpid()],
        )
    if ctx.payload.get("sleep"):
        time.sleep(ctx.payload["sleep"])


@job("fail", max_attempts=3)
def fail(ctx):
    raise ValueError(f"boom on attempt {ctx.attempt}")


@job("fail-then-succeed", max_attempts=5)
def fail_then_succeed(ctx):
    if ctx.attempt < ctx.payload.get("succeed_on", 3):
        raise RuntimeError(f"transient failure {ctx.attempt}")
    return {"attempt": ctx.attempt}


@job("retry-later")
def retry_later(ctx):
    if ctx.attempt == 1:
        raise RetryJob(delay=ctx.payload.get("delay", 60), reason="provider said later")


@job("discard")
def discard(ctx):
    raise DiscardJob("payload is unusable")


@job("sleep", lease=30)
def sleep(ctx):
    """Sleep in small steps until the payload's seconds pass or a flag file appears."""
    deadline = time.monotonic() + ctx.payload.get("seconds", 1)
    flag = ctx.payload.get("until_file")
    while time.monotonic() < deadline:
        if flag and os.path.exists(flag):
            break
        time.sleep(0.01)


@job("email", queue="emails")
def email(ctx):
    return "sent"


@job("async-echo")
async def async_echo(ctx):
    return ctx.payload


@job("slow-record")
def slow_record(ctx):
    """Record an effect like "record", then wait until payload["until_file"] exists.

    Gives up after payload["seconds"] (default 60). The acceptance tests kill a worker while it
    waits here, so the effect row proves the run started. No per-type lease: a lease shorter than
    the default HEARTBEAT_INTERVAL fails ``manage.py check`` (dbqueue.E004); tests shorten the
    lease through settings instead.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (%s, %s, %s, %s)",
            [ctx.id, ctx.attempt, ctx.worker_id, os.getpid()],
        )
    deadline = time.monotonic() + ctx.payload.get("seconds", 60)
    flag = ctx.payload.get("until_file")
    while time.monotonic() < deadline:
        if flag and os.path.exists(flag):
            break
        time.sleep(0.01)


from . import (  # noqa: E402, F401 - registers their job types
    batch_jobs,
    cancel_jobs,
    delivery_jobs,
    event_jobs,
    fair_jobs,
    hung_jobs,
    process_jobs,
    step_jobs,
    testing_jobs,
)


@job("hang", timeout=1.0, max_attempts=2)
def hang(ctx):
    """Hang far past its timeout (a stuck socket read, a deadlock): the worker must give it up,
    and keep running everything else. Bounded only so a leaked process cannot live forever."""
    deadline = time.monotonic() + ctx.payload.get("seconds", 600)
    while time.monotonic() < deadline:
        time.sleep(0.05)


@job("async-hang", timeout=0.5, max_attempts=1)
async def async_hang(ctx):
    import asyncio

    await asyncio.sleep(ctx.payload.get("seconds", 600))


@job("collect")
def collect(ctx):
    """A workflow callback: record the run like "record" and return the dependencies' results."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (%s, %s, %s, %s)",
            [ctx.id, ctx.attempt, ctx.worker_id, os.getpid()],
        )
    return {str(job_id): result for job_id, result in sorted(ctx.dependency_results().items())}


@job("atomic-echo", atomic=True, timeout=30)
def atomic_echo(ctx):
    """An atomic handler: its completion commits with its own transaction."""
    return ctx.payload


@job("collect-atomic", atomic=True, timeout=30)
def collect_atomic(ctx):
    """A workflow callback whose effect row commits with its completion: a run killed before
    the commit leaves no effect, so the effects count the callback's completed runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (%s, %s, %s, %s)",
            [ctx.id, ctx.attempt, ctx.worker_id, os.getpid()],
        )
    return sorted(ctx.dependency_results())


# Flow control (docs/concepts/flow-control.md): @job defaults computed from the payload at enqueue.
@job("serial-record", serial_key=lambda payload: payload.get("account"))
def serial_record(ctx):
    """Record (key, start, end) of each run in testapp_serial_run, sleeping ``sleep`` seconds
    in between: how tests see whether runs of one key overlap. The key recorded is the
    payload's ``label`` or else its ``account``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_serial_run (job_id, attempt, key, pid, started) "
            "VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING id",
            [
                ctx.id,
                ctx.attempt,
                str(ctx.payload.get("label", ctx.payload.get("account"))),
                os.getpid(),
            ],
        )
        run_id = cursor.fetchone()[0]
    time.sleep(ctx.payload.get("sleep", 0))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE testapp_serial_run SET finished = clock_timestamp() WHERE id = %s", [run_id]
        )


@job("unique-record", unique_key=lambda payload: payload.get("key"), unique_while="pending")
def unique_record(ctx):
    record(ctx)
