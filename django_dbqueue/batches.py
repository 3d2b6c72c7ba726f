"""``Batch``: what a batch handler receives (``@job(..., batch_size=N)``, docs/batches.md).

A batch is up to N claimed jobs of one type, handed to one call of the handler on one thread.
Each job stays a job of its own: its lease, attempt, timeout, cancel, retries, dead letter and
delivery records are its own, and so is its outcome. The handler says how each one ended by
marking it (``fail``, ``retry``, ``succeed``); a job left unmarked succeeds when the handler
returns. A handler that raises fails every job of the batch with that exception (one attempt
each), as if each had raised it alone.

This module only records the marks; the handler pool (execution.py) turns them into each job's
outcome, with the same rules as a plain handler's return or exception.
"""

from .exceptions import JobCancelled, RetryJob
from .outcomes import ResultError, encode_result


class Batch:
    """The jobs of one call of a batch handler.

    ``jobs``: the claimed jobs, each a :class:`~django_dbqueue.JobContext` (``id``,
    ``payload``, ``attempt``, ``cancelled``, ``step()``, ...), in claim order. Iterating a batch
    iterates its jobs; ``len(batch)`` is their number.
    """

    __slots__ = ("_marks", "jobs")

    def __init__(self, jobs):
        self.jobs = list(jobs)
        for job in self.jobs:
            job._batch = True  # a durable wait ends one job's run, not a batch's: refused
        self._marks = {}  # job id -> ("ok", result json) | ("error", exception)

    def __iter__(self):
        return iter(self.jobs)

    def __len__(self):
        return len(self.jobs)

    def __repr__(self):
        return f"<Batch of {len(self.jobs)} jobs: {[job.id for job in self.jobs][:10]}>"

    def _own(self, job, method):
        job_id = getattr(job, "id", job)
        if (
            isinstance(job_id, bool)
            or not isinstance(job_id, int)
            or not any(j.id == job_id for j in self.jobs)
        ):
            raise ValueError(
                f"Batch.{method}(): {job!r} is not a job of this batch (pass one of batch.jobs "
                f"or its id; this batch holds {[j.id for j in self.jobs][:10]}"
                f"{'...' if len(self.jobs) > 10 else ''})"
            )
        return job_id

    def fail(self, job, error):
        """Mark ``job`` failed with ``error`` (an exception, or a message): it is retried after
        its backoff, or dead after its last attempt, alone; the other jobs are not affected.
        The exception decides as if the job's own handler had raised it: ``RetryJob(delay=)``
        retries after that delay, ``DiscardJob`` sends it to the dead letters at once,
        ``JobCancelled`` ends it cancelled."""
        job_id = self._own(job, "fail")
        if isinstance(error, str):
            error = RuntimeError(error)
        if not isinstance(error, BaseException):
            raise TypeError(
                f"Batch.fail(): error must be an exception or a message (str), got "
                f"{type(error).__name__}"
            )
        self._marks[job_id] = ("error", error)

    def retry(self, job, delay=None, reason="retry requested by the batch handler"):
        """Mark ``job`` to run again: after ``delay`` seconds, or its backoff when None. Spends
        the attempt (dead after the last one), as ``raise RetryJob`` does."""
        job_id = self._own(job, "retry")
        error = RetryJob(delay, reason) if delay is not None else RuntimeError(reason)
        self._marks[job_id] = ("error", error)

    def cancel(self, job, reason=None):
        """End ``job`` cancelled (not failed, not retried)."""
        job_id = self._own(job, "cancel")
        self._marks[job_id] = ("error", JobCancelled(reason or f"job #{job_id} was cancelled"))

    def succeed(self, job, result=None):
        """Mark ``job`` done with ``result`` (a JSON value, stored as the job's result, as a
        plain handler's return value is). Unmarked jobs succeed with ``None``. A result that
        is not JSON makes that job dead with the reason (``ResultError``), not the batch."""
        job_id = self._own(job, "succeed")
        try:
            self._marks[job_id] = ("ok", encode_result(result))
        except ResultError as exc:  # not JSON: that job is dead with the reason, alone
            self._marks[job_id] = ("error", exc)

    def cancelled(self, job):
        """True once the cancel of ``job`` was asked for while the batch runs (also
        ``job.cancelled``). Such a job ends cancelled whatever the handler marks for it."""
        return any(j.cancelled for j in self.jobs if j.id == self._own(job, "cancelled"))

    def mark_of(self, job_id):
        """The mark of job ``job_id`` so far (``("ok", result json)`` or ``("error",
        exception)``), or None while it has none. Read by the watchdog at the batch's timeout
        (another thread): the marks made by then are kept, later ones are discarded."""
        return self._marks.get(job_id)

    def outcomes(self):
        """``[(job, kind, value)]``: ``("ok", result json)`` or ``("error", exception)`` per
        job, in the batch's order (the pool's, once the handler returned)."""
        return [(job, *self._marks.get(job.id, ("ok", None))) for job in self.jobs]
