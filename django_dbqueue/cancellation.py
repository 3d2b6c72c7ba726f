"""``cancel()``: stop jobs that have not finished, whether they wait or run.

A pending or waiting job is cancelled at once. A running job is marked for cancellation: the
worker running it learns it within milliseconds from a notification sent after the commit (or,
when that is lost, from its next heartbeat), tells the handler (``ctx.cancelled``,
``ctx.raise_if_cancelled()``; an async handler's task is cancelled), and whatever the run's
outcome, the job ends ``cancelled``: never retried, never dead (docs/concepts/cancelling.md).
"""

from collections.abc import Iterable

from django.db import ProgrammingError

from . import cancel_notices, schema, store, validation
from .exceptions import InvalidArgument
from .jobspec import EnqueuedJob, database

CANCELLED = "cancelled"  # was pending or waiting: cancelled now, it never runs
CANCELLING = "cancelling"  # is running: marked; its worker ends it cancelled
FINISHED = "finished"  # was done, dead or cancelled already: left alone
UNKNOWN = "unknown"  # no such job (never existed, or deleted by retention)

_OUTCOMES = {"cancelled": CANCELLED, "running": CANCELLING, "finished": FINISHED}
MAX_BY = validation.MAX_BY  # dbqueue_job.cancelled_by is varchar(200)
MAX_ID = validation.MAX_JOB_ID


def _job_id(value):
    if isinstance(value, EnqueuedJob):
        return value.id
    problem = validation.job_id_problem(value)
    if problem == "type":
        raise TypeError(
            f"cancel() takes job ids (int) or EnqueuedJob, got {validation.shown(value)}"
        )
    if problem == "range":
        raise InvalidArgument(f"cancel(): {validation.shown(value)} is not a job id (1 to 2**63-1)")
    return value


def cancel(job_ids, *, by=None, using=None):
    """Cancel one job or many; returns ``{job id: outcome}`` in the order given.

    ``job_ids``: a job id, an ``EnqueuedJob``, or an iterable of them. ``by``: who cancels,
    recorded in the job's ``cancelled_by`` (default ``"api"``; the admin records
    ``"admin:<username>"``). The outcome of each job is ``"cancelled"`` (it was pending or
    waiting: cancelled now, it will not run), ``"cancelling"`` (it is running: marked, and its
    worker ends it ``cancelled`` when its handler stops), ``"finished"`` (done, dead or
    cancelled already: left alone) or ``"unknown"`` (no such job). Cancelling a job that is
    being cancelled again keeps the first request and its author.

    Runs on the caller's transaction: inside ``transaction.atomic()`` the cancel commits (and
    the workers are told) with the caller's commit, or not at all. A running job's row is not
    written until that commit (a deferred trigger marks it then: CANCEL_JOBS in
    store/operations.py), so however long the transaction stays open, its worker's heartbeat
    and completions never wait for it; a job that finished before the commit is left as it
    ended. Jobs of a workflow that wait
    for a cancelled job are cancelled with it (or run, with ``on_failure="run"``); those
    waiting for a running job wait for its end.
    """
    if isinstance(job_ids, int | EnqueuedJob):
        job_ids = [job_ids]
    elif not isinstance(job_ids, Iterable) or isinstance(job_ids, str | bytes):
        raise TypeError(
            f"cancel() takes a job id or an iterable of job ids, got {validation.shown(job_ids)}"
        )
    ids = list(dict.fromkeys(_job_id(value) for value in job_ids))
    by = "api" if by is None else validation.by(by, "cancel() by", error=InvalidArgument)
    using = database(using)
    if not ids:
        return {}
    try:
        states = store.request_cancel(using, ids, by=by)
    except ProgrammingError as exc:
        schema.raise_if_unmigrated(exc, using)
        raise
    cancel_notices.jobs_cancelled(using, [i for i, state in states.items() if state == "running"])
    return {i: _OUTCOMES.get(states.get(i), UNKNOWN) for i in ids}
