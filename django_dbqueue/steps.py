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

import contextlib
import datetime
import threading
import time

from django.db import connections

from . import decoding, payloads, store, validation
from .exceptions import MAX_WAIT, InvalidArgument, LeaseLost, SignalTimeout, UnreadableJob
from .outcomes import ResultError

MAX_NAME = 200  # dbqueue_step.name is varchar(200)
SLEEP, SIGNAL = "sleep:", "signal:"  # the records of durable waits, named apart from steps
# A wait for a signal without a timeout is due at this time (and at once when the signal comes).
NEVER = datetime.datetime(9999, 1, 1, tzinfo=datetime.UTC)


class Suspend(BaseException):
    """A durable wait ends the run here (ctx.sleep, ctx.wait_for_signal): the job goes back to
    pending, its attempt not spent, due at ``until``. A BaseException, so that a handler's
    ``except Exception`` does not swallow it; one that catches it all the same does not undo
    it (``_suspend``)."""

    def __init__(self, until, reason, seen=None):
        super().__init__(reason)
        self.until, self.reason, self.seen = until, reason, seen


class Steps:
    """One run's steps: the recorded ones (read once, at its first step), how many times each
    name was called so far in this run, and the durable wait that ended the run, if one did
    (``suspended``: its :class:`Suspend`)."""

    __slots__ = ("_calls", "_lock", "_recorded", "suspended")

    def __init__(self):
        self._recorded = None
        self._calls = {}
        self._lock = threading.Lock()
        self.suspended = None

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

    def reread(self, ctx):
        """Read the records again, fenced by the run's lease: raises ``LeaseLost`` when the
        run no longer holds the job."""
        recorded = store.load_held_steps(ctx.using, ctx.id, ctx._token)
        if recorded is None:
            raise _lost(ctx, "before it ran")
        self._recorded = recorded
        return recorded


def _suspend(ctx, until, reason, seen=None):
    """End the run in a durable wait. The context remembers it: a handler that catches the
    :class:`Suspend` (``except BaseException``) cannot carry the run on past it, since every
    later step or wait of the run raises it again (:func:`raise_if_suspended`), and the run's
    end reads :func:`suspension` whatever the handler returned or raised."""
    suspended = Suspend(until, reason, seen)
    _runs(ctx).suspended = suspended
    raise suspended


def suspension(ctx):
    """The :class:`Suspend` that ended ``ctx``'s run, or None (execution.run_handler)."""
    runs = ctx._steps
    return None if runs is None else runs.suspended


def raise_if_suspended(ctx):
    """Raise again the wait that ended this run, if one did: nothing durable happens after it."""
    suspended = suspension(ctx)
    if suspended is not None:
        raise suspended


def check_name(where, name, limit=MAX_NAME):
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(
            f"{where}: the name must be a non-empty string, got {validation.shown(name)}"
        )
    if len(name) > limit:
        raise InvalidArgument(f"{where}: the name is {len(name)} characters long; at most {limit}")
    problem = validation.text_problem(name)  # a NUL, or a lone surrogate (surrogateescape)
    if problem:
        raise InvalidArgument(f"{where}: the name {validation.shown(name)} {problem}")


def check_step(name, fn):
    """A clear error for a bad step name or function, before anything runs."""
    check_name("ctx.step()", name)
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


def decode(text, what="a recorded step"):
    """A record's JSON text decoded (None stays None), or ``UnreadableJob`` naming ``what``: a
    record written by hand that Python cannot read fails its job at once (execution.py)."""
    return decoding.json_value(text, what)


def _what(key):
    name, occurrence = key
    return f"recorded step {name!r}" + (f" #{occurrence}" if occurrence > 1 else "")


def _lost(ctx, when):
    return LeaseLost(
        f"job #{ctx.id}: this run no longer holds the job (its lease expired and another run "
        f"may have taken it, or this worker gave the run up); the step was not run, {when}"
    )


def _lease_in_doubt(ctx):
    """Whether the run may have lost its lease without hearing of it: no renewal known for half
    a lease (a process paused, a heartbeat stalled, a child process that hears of none)."""
    renewed = ctx._renewed
    return renewed is None or time.monotonic() - renewed > ctx.lease_seconds / 2


def stored(ctx, key):
    """``(True, result)`` for a recorded step, else ``(False, None)``: then the step is about
    to run, and the run must still hold the job. Records are read once per run; a run that may
    have lost its lease (a zombie that another run overtook) reads them again, fenced, so that it
    never runs a step that run recorded. Raises ``LeaseLost`` when the run was given up."""
    raise_if_suspended(ctx)  # a step after a swallowed wait: the run ended at the wait
    runs = ctx._steps
    recorded = runs.recorded(ctx)
    if key in recorded:
        return True, decode(recorded[key], _what(key))
    if ctx._lease_gone and ctx._token is not None:
        raise _lost(ctx, "before it ran")
    if ctx._token is not None and _lease_in_doubt(ctx):
        recorded = runs.reread(ctx)
        if key in recorded:
            return True, decode(recorded[key], _what(key))
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
    return decode(result_text, _what(key))


def _runs(ctx):
    if ctx._steps is None:
        ctx._steps = Steps()
    return ctx._steps


def _outside_batches(ctx, where):
    """Refused before anything is recorded: a wait ends the run, and a batch handler's call
    runs the other jobs of its batch too. Recorded first, the wait would have ended by the
    retry and the handler would go past it."""
    if ctx._batch:
        raise InvalidArgument(
            f"{where} is not available in a batch handler (job #{ctx.id}): a durable wait ends "
            "the run, and this call runs the other jobs of the batch too. Enqueue the waiting "
            "work as a job of a plain type, or use ctx.step() and retries"
        )


# Per database alias, how many atomic blocks were open on this thread's connection when the runs
# began and are not theirs: the test transaction that django_dbqueue.testing runs jobs inside
# (outer_transaction()). None under a worker, whose runs begin outside any transaction.
_outer = threading.local()


@contextlib.contextmanager
def outer_transaction(using):
    """While inside, the atomic blocks open now on ``using`` are not the runs' own: a durable
    wait is refused only inside a transaction a run opened (an atomic handler's)."""
    depths = getattr(_outer, "depths", {})
    _outer.depths = {**depths, using: len(connections[using].atomic_blocks)}
    try:
        yield
    finally:
        _outer.depths = depths


def _outside_transactions(ctx, where):
    connection = connections[ctx.using]
    if connection.in_atomic_block and len(connection.atomic_blocks) > getattr(
        _outer, "depths", {}
    ).get(ctx.using, 0):
        raise InvalidArgument(
            f"{where} cannot wait inside a transaction (an atomic handler, or "
            "transaction.atomic()): the run ends at the wait, and the transaction would roll "
            "back the record of when the wait began, so it would never end"
        )


def _seconds(where, value, *, allow_none=False):
    if value is None and allow_none:
        return None
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_WAIT:
        raise InvalidArgument(
            f"{where}: a number of seconds from 0 to {MAX_WAIT:g} (10 years)"
            f"{', or None' if allow_none else ''}, got {validation.shown(value)}"
        )
    return float(value)


def _time(value, field, key, *, optional=False):
    """The aware time ``value[field]`` of a wait's record (None for a missing one that is
    ``optional``), or ``UnreadableJob`` for a record (written by hand) that holds none Python
    reads."""
    text = value.get(field) if isinstance(value, dict) else None
    if text is None and optional and isinstance(value, dict):
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        when = None
    if when is None or when.tzinfo is None:
        raise UnreadableJob(
            _what(key), f"its {field!r} is not an aware time Python reads: {validation.shown(text)}"
        )
    return when


def sleep(ctx, name, *, seconds=None, until=None):
    """``ctx.sleep`` and ``ctx.sleep_until``: the first time, record when the sleep ends; while
    the database's clock is before that, end the run (:class:`Suspend`); after it, return."""
    where = "ctx.sleep()" if until is None else "ctx.sleep_until()"
    check_name(where, name, MAX_NAME - len(SLEEP))
    if until is None:
        seconds = _seconds(where, seconds)
    else:
        validation.timestamp(until, f"{where}: when", error=InvalidArgument)
    _outside_batches(ctx, where)
    _outside_transactions(ctx, where)
    raise_if_suspended(ctx)
    key = _runs(ctx).key(SLEEP + name)
    found, value = stored(ctx, key)
    now = store.db_now(ctx.using)
    if found:
        ends = _time(value, "until", key)
    else:
        ends = until if until is not None else now + datetime.timedelta(seconds=seconds)
        record(ctx, key, encode(name, {"until": ends.isoformat()}))
    if now < ends:
        _suspend(ctx, ends, SLEEP + name)


def wait_for_signal(ctx, name, timeout=None):
    """``ctx.wait_for_signal``: the payload of the job's n-th signal ``name`` for its n-th wait
    of that name; until it comes, end the run (:class:`Suspend`), due at the timeout or when the
    signal comes; past the timeout, :class:`SignalTimeout`."""
    where = "ctx.wait_for_signal()"
    check_name(where, name, MAX_NAME - len(SIGNAL))
    timeout = _seconds(where, timeout, allow_none=True)
    _outside_batches(ctx, where)
    _outside_transactions(ctx, where)
    raise_if_suspended(ctx)
    key = _runs(ctx).key(SIGNAL + name)
    has_signal, payload, seen, now = store.read_signal(
        ctx.using, job_id=ctx.id, name=name, seq=key[1]
    )
    if has_signal:
        return decode(payload, f"the payload of signal {name!r} #{key[1]}")
    found, value = stored(ctx, key)
    if found:
        deadline = _time(value, "deadline", key, optional=True)
    else:
        deadline = None if timeout is None else now + datetime.timedelta(seconds=timeout)
        record(ctx, key, encode(name, {"deadline": deadline and deadline.isoformat()}))
    if deadline is not None and now >= deadline:
        raise SignalTimeout(
            f"job #{ctx.id}: no signal {name!r} came before the wait's deadline, "
            f"{deadline.isoformat()}"
        )
    _suspend(ctx, NEVER if deadline is None else deadline, SIGNAL + name, seen=seen)


def signal_job(job_id, name, payload=None, *, using=None):
    """Send the signal ``name`` with the JSON ``payload`` to the job ``job_id`` (an id or an
    ``EnqueuedJob``), in the caller's transaction, like ``enqueue``: it is kept until the job's
    ``ctx.wait_for_signal(name)`` takes it (the n-th signal of a name goes to the n-th wait of
    it), and a job waiting for it is due at once and its workers are woken after the commit.
    Returns the signal's number among the job's signals of that name, or None when the job does
    not exist or has finished (nothing is stored). Raises ``NotMigrated`` on a database without
    the queue's tables."""
    from django.db import ProgrammingError, transaction

    from . import schema, wakeup
    from .jobspec import EnqueuedJob, database

    if isinstance(job_id, EnqueuedJob):
        job_id = job_id.id
    problem = validation.job_id_problem(job_id)
    if problem is not None:
        raise InvalidArgument(
            f"signal_job(): job_id must be a job id (an int from 1 to 2**63-1) or an "
            f"EnqueuedJob, got {validation.shown(job_id)}"
        )
    check_name("signal_job()", name, MAX_NAME - len(SIGNAL))
    try:
        text = None if payload is None else payloads.dumps(payload, "payload")
    except payloads.PayloadError as exc:
        raise type(exc)(f"signal_job(): {exc}") from None
    using = database(using)
    try:
        with transaction.atomic(using=using):  # the job's advisory lock orders the signals
            sent = store.signal_job(using, job_id=job_id, name=name, payload=text)
    except ProgrammingError as exc:
        # The atomic block rolled its statement back: a caller's transaction goes on.
        schema.raise_if_unmigrated(exc, using, aborted=False)
        raise
    if sent is None:
        return None
    queue, seq = sent
    # Whether the job waits for it is settled at the commit (a run may be writing its wait
    # now): its queue is woken after the commit in any case, which costs nothing when no worker
    # waits on it (waiters.py).
    wakeup.jobs_ready(using, [queue])
    return seq


def waiting_for(reason, run_after):
    """What a job in a durable wait waits for, in words (docs/steps.md), or ``-``."""
    if not reason:
        return "-"
    kind, _, name = reason.partition(":")
    if kind == "sleep":
        return f"the end of its sleep {name!r}, {_shown(run_after)}"
    if run_after is not None and run_after.year >= 9999:
        return f"the signal {name!r} (no timeout)"
    return f"the signal {name!r}, or its timeout at {_shown(run_after)}"


def _shown(value):
    return "-" if value is None else value.isoformat(timespec="seconds")
