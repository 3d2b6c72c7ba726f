"""Job types with durable steps (ctx.step). Each step body writes a "start" row, may block on a
file the test creates (``block``: {step: path} on attempt 1), and writes an "end" row, each in
its own autocommit statement, so a test counts how often each body started and finished."""

import asyncio
import os
import time

from django.db import connection

from django_dbqueue import SignalTimeout, Snooze, job

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


@job("atomic-steps", atomic=True, max_attempts=3, timeout=30)
def atomic_steps(ctx):
    value = ctx.step("write", _body, ctx, "write")
    if ctx.attempt == 1:
        raise RuntimeError("the atomic handler fails: its step rolls back with it")
    return value


def _count_bodies(ctx, step):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM testapp_step_body WHERE job_id = %s AND step = %s",
            [ctx.id, step],
        )
        return cursor.fetchone()[0]


@job("pausing-steps", max_attempts=3)
def pausing_steps(ctx):
    """Between its two steps, attempt 1 waits for the file ``hold`` (outside any step): the
    test freezes its process there, and lets it go on after another run finished the job."""
    ctx.step("reserve", _body, ctx, "reserve")
    if ctx.attempt == 1:
        deadline = time.monotonic() + 120
        while not os.path.exists(ctx.payload["hold"]) and time.monotonic() < deadline:
            time.sleep(0.02)
    try:
        return ctx.step("charge", _body, ctx, "charge")
    finally:
        _body_row(ctx, "charge-called", "end")  # the step ran or raised: the test may look


@job("snoozer", max_attempts=1)
def snoozer(ctx):
    """Snoozes until it has run ``times`` times, by raising or returning (``returned``)."""
    _body_row(ctx, "run", "end")
    if ctx.payload.get("forever") or _count_bodies(ctx, "run") <= ctx.payload.get("times", 0):
        if ctx.payload.get("returned"):
            return ctx.snooze(ctx.payload.get("delay", 0))
        raise Snooze(ctx.payload.get("delay", 0))
    return {"runs": _count_bodies(ctx, "run"), "attempt": ctx.attempt}


@job("sleeper", max_attempts=2)
def sleeper(ctx):
    ctx.step("before", _body, ctx, "before")
    ctx.sleep("nap", ctx.payload["seconds"])
    return ctx.step("after", _body, ctx, "after")


@job("approver", max_attempts=2)
def approver(ctx):
    ctx.step("prepare", _body, ctx, "prepare")
    answers = []
    for _ in range(ctx.payload.get("waits", 1)):
        try:
            answers.append(ctx.wait_for_signal("approve", timeout=ctx.payload.get("timeout")))
        except SignalTimeout:
            answers.append("timed out")
    ctx.step("finish", _body, ctx, "finish")
    return answers


@job("atomic-sleeper", atomic=True, max_attempts=1, timeout=30)
def atomic_sleeper(ctx):
    ctx.sleep("nap", 60)


@job("swallowing-sleeper", max_attempts=2)
def swallowing_sleeper(ctx):
    """Catches BaseException around its durable wait, as a careless ``except BaseException``
    (or a bare ``except:``) does. ``then``: what it does after swallowing the suspension:
    return (the default), raise an error of its own, or run a step."""
    ctx.step("before", _body, ctx, "before")
    try:
        if ctx.payload.get("signal"):
            ctx.wait_for_signal("approve")
        else:
            ctx.sleep("nap", ctx.payload.get("seconds", 3600))
    except BaseException:
        pass
    _body_row(ctx, "after-wait", "end")  # not a step: it runs on each run that gets here
    then = ctx.payload.get("then")
    if then == "raise":
        raise RuntimeError("an error of the handler's own, after the swallowed wait")
    if then == "step":
        ctx.step("after", _body, ctx, "after")
    return "woke"
