"""Durable steps: ``ctx.step("name", fn, *args, **kwargs)`` runs ``fn`` once per job.

When ``fn`` returns, its result (JSON, the payload rules) is recorded in ``dbqueue_step`` under
the job, the step's name and its occurrence (the n-th call of that name in this run). When the
job runs again (a crash, a lease expiry, a retry after a later step failed, a timeout), a
recorded step returns its stored result without running, so the handler goes on at its first
unfinished step. A step that raises records nothing and runs again on the next attempt.

The record is written on the job's database connection: inside a transaction there (the
handler's, for ``@job(atomic=True)``, or a ``transaction.atomic()`` around the step) it commits
or rolls back with that transaction's writes; otherwise it commits at once. A crash between the
step's return and its record's commit runs the step again, so an external effect inside a step
still wants a delivery record (deliveries.py). docs/steps.md has the guarantees and their limits.
"""

import json
import threading

from . import payloads, store, validation
from .exceptions import InvalidArgument, LeaseLost
from .outcomes import ResultError

MAX_NAME = 200  # dbqueue_step.name is varchar(200)


class Steps:
    """One run's steps: the recorded ones (read once, at its first step) and how many times
    each name was called so far in this run."""

    __slots__ = ("_calls", "_lock", "_recorded")

    def __init__(self):
        self._recorded = None
        self._calls = {}
        self._lock = threading.Lock()

    def key(self, name):
        """``(name, occurrence)`` of a new call of step ``name`` in this run."""
        with self._lock:
            occurrence = self._calls.get(name, 0) + 1
            self._calls[name] = occurrence
        return name, occurrence

    def recorded(self, ctx):
        if self._recorded is None:
            self._recorded = store.load_steps(ctx.using, ctx.id)
        return self._recorded


def check_step(name, fn):
    """A clear error for a bad step name or function, before anything runs."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(
            f"ctx.step(): the step's name must be a non-empty string, got {validation.shown(name)}"
        )
    if len(name) > MAX_NAME:
        raise InvalidArgument(
            f"ctx.step(): the step's name is {len(name)} characters long; at most {MAX_NAME}"
        )
    if not callable(fn):
        raise TypeError(f"ctx.step({name!r}, fn): fn must be callable, got {validation.shown(fn)}")


def encode(name, value):
    """The step's result as JSON text (None stays NULL), or ``ResultError`` naming it: found
    after the step's effects, so the job goes to the dead letters rather than repeat them."""
    if value is None:
        return None
    try:
        return payloads.dumps(value, "result")
    except payloads.PayloadError as exc:
        raise ResultError(f"the result of step {name!r} cannot be stored: {exc}") from None


def decode(text):
    return None if text is None else json.loads(text)


def stored(ctx, key):
    """``(True, result)`` for a recorded step, else ``(False, None)``."""
    recorded = ctx._steps.recorded(ctx)
    if key in recorded:
        return True, decode(recorded[key])
    return False, None


def record(ctx, key, text):
    """Record the finished step ``key`` with its result ``text``; returns the result to hand
    back (a step recorded first by another run of this job keeps that run's result)."""
    row = store.save_step(
        ctx.using,
        job_id=ctx.id,
        token=ctx._token,
        name=key[0],
        occurrence=key[1],
        result=text,
        attempt=ctx.attempt,
    )
    if row is None:
        raise LeaseLost(
            f"job #{ctx.id}: step {key[0]!r} finished, but this run no longer holds the job "
            "(its lease expired and another run took it); the step was not recorded"
        )
    result_text, _inserted = row
    ctx._steps.recorded(ctx)[key] = result_text
    return decode(result_text)
