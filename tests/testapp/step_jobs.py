"""Job types with durable steps (ctx.step). Each step body writes a "start" row, may block on a
file the test creates (``block``: {step: path} on attempt 1), and writes an "end" row, each in
its own autocommit statement, so a test counts how often each body started and finished."""

import asyncio
import os
import time

from django.db import connection

from django_dbqueue import job

STEPS = ("reserve", "charge", "wait-warehouse", "ship", "email")


def _body_row(ctx, step, phase):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_step_body (job_id, step, attempt, phase, pid, at)"
            " VALUES (%s, %s, %s, %s, %s, now())",
            [ctx.id, step, ctx.attempt, phase, os.getpid()],
        )


def _body(ctx, step):
    _body_row(ctx, step, "start")
    block = (ctx.payload.get("block") or {}).get(step)
    if block and ctx.attempt == 1:
        deadline = time.monotonic() + 120
        while not os.path.exists(block) and time.monotonic() < deadline:
            time.sleep(0.02)  # held here until the test kills this process (or frees it)
    if ctx.payload.get("fail_in") == step and ctx.attempt < ctx.payload.get("fail_until", 2):
        raise RuntimeError(f"step {step} fails on attempt {ctx.attempt}")
    _body_row(ctx, step, "end")
    return {"step": step, "attempt": ctx.attempt}


@job("five-steps", max_attempts=5)
def five_steps(ctx):
    results = [ctx.step(name, _body, ctx, name) for name in STEPS]
    return [r["attempt"] for r in results]


@job("loop-steps", max_attempts=3)
def loop_steps(ctx):
    out = []
    for item in ctx.payload["items"]:
        out.append(ctx.step("item", _item, ctx, item))
    if ctx.attempt == 1 and ctx.payload.get("fail_after"):
        raise RuntimeError("fails after every item's step")
    return out


def _item(ctx, item):
    _body_row(ctx, f"item:{item}", "end")
    return item * 2


@job("async-steps", max_attempts=3)
async def async_steps(ctx):
    async def double(n):
        await asyncio.sleep(0)
        return n * 2

    first = await ctx.astep("double", double, 21)
    second = await ctx.astep("sync", lambda: {"list": [1, 2]})
    if ctx.attempt == 1:
        raise RuntimeError("fail after both steps")
    return [first, second]


@job("atomic-steps", atomic=True, max_attempts=3)
def atomic_steps(ctx):
    value = ctx.step("write", _body, ctx, "write")
    if ctx.attempt == 1:
        raise RuntimeError("the atomic handler fails: its step rolls back with it")
    return value
