"""django.tasks functions for the Tasks-backend tests (imported on Django 6+ only)."""

import asyncio

from django.db import connection
from django.tasks import task


@task
def add(a, b):
    return a + b


@task(priority=10, queue_name="emails")
def shout(text):
    return {"text": text.upper()}


@task(takes_context=True)
def attempts_seen(context, fail_until):
    if context.attempt < fail_until:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task
def always_fails():
    raise ValueError("never works")


@task
def record_order(label):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (0, 0, %s, 0)",
            [label],
        )


@task
async def async_double(x):
    await asyncio.sleep(0)
    return x * 2


@task(backend="immediate")
def immediate_only():
    return "ran"
