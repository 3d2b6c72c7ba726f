"""``JobContext``: what a handler receives. A light object built from the claimed row."""

import contextlib

from . import names
from .exceptions import JobCancelled


class JobContext:
    """The claimed job, as a handler sees it.

    ``id``, ``type``, ``name`` (what logs and metrics call the job: the type, or a
    ``django.tasks`` job's task path when this process knows the task), ``queue``, ``payload`` (the decoded JSON), ``attempt`` (1 on the first run),
    ``max_attempts``, ``idempotency_key`` (or ``None``), ``priority``, ``enqueued_at``,
    ``worker_id``, ``using`` (the database alias of the queue), ``wait`` (seconds from the moment
    the job came due to its claim) and ``traceparent`` (the enqueuer's W3C trace context, or
    ``None``).

    ``cancelled`` turns true once the worker learns that the job's cancel was asked for
    (``django_dbqueue.cancel()`` or the admin); ``raise_if_cancelled()`` raises
    ``JobCancelled`` then, which ends the job ``cancelled`` (docs/concepts/cancelling.md).
    """

    __slots__ = (
        "_batch",
        "_cancelled",
        "_lease_gone",
        "_on_cancel",
        "_renewed",
        "_steps",
        "_token",
        "attempt",
        "enqueued_at",
        "id",
        "idempotency_key",
        "lease_seconds",
        "max_attempts",
        "name",
        "payload",
        "priority",
        "queue",
        "traceparent",
        "type",
        "using",
        "wait",
        "worker_id",
    )

    def __init__(self, row, *, worker_id, using):
        self.id = row.id
        self.type = row.type
        # What logs and metrics call it: for a django.tasks job, its task's path when this
        # process knows that task (names.label); else the type. One comparison per job.
        self.name = names.label(row.type, row.payload)
        self.queue = row.queue
        self.payload = row.payload
        self.attempt = row.attempt
        self.max_attempts = row.max_attempts
        self.lease_seconds = row.lease_seconds
        self.idempotency_key = row.idempotency_key
        self.priority = row.priority
        self.enqueued_at = row.created_at
        self.wait = row.wait
        self.traceparent = row.traceparent
        self.worker_id = worker_id
        self.using = using
        # A plain flag rather than a threading.Event: it is set once, by one thread (the worker's
        # listener or claim loop), and read by the handler's; a bool attribute is read and
        # written atomically in CPython, and costs the claim nothing per job (an Event would be
        # a Condition and a lock per claimed job, for the few jobs ever cancelled).
        self._cancelled = False
        self._on_cancel = None  # set while an async handler runs: cancels its task
        self._token = None  # the run's lease token (run_handler): fences its step records
        self._steps = None  # steps.Steps, made at the run's first step
        self._batch = False  # one job of a batch handler's call (batches.Batch): no waits
        # What the run knows of its lease, for a step about to run (steps.stored): when it was
        # last known held (time.monotonic(), taken before the claim or renewal that held it;
        # None: unknown), and whether this worker gave the run up (the heartbeat found the lease
        # lost, the watchdog timed the run out, shutdown released it).
        self._renewed = None
        self._lease_gone = False

    @property
    def cancelled(self):
        """True once the worker learned that this job's cancel was asked for. Cheap: check it
        in a loop."""
        return self._cancelled

    def raise_if_cancelled(self):
        """Raise ``JobCancelled`` if the job's cancel was asked for; the job then ends
        ``cancelled`` (not failed, not retried). Call it between steps of a long run."""
        if self._cancelled:
            raise JobCancelled(f"job #{self.id} was cancelled while it ran")

    def _cancel(self):
        """The worker learned of the cancel (any thread): raise the flag, cancel an async run."""
        self._cancelled = True
        on_cancel = self._on_cancel
        if on_cancel is not None:
            with contextlib.suppress(RuntimeError):  # its event loop already closed
                on_cancel()

    def step(self, name, fn, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` once per job, as the step ``name`` (docs/steps.md).

        The first time, ``fn`` runs and its JSON result is recorded; when the job runs again
        (a crash, a lease expiry, a retry), the recorded result is returned and ``fn`` does not
        run. The result must be a JSON value (the payload rules); it is returned as decoded
        from its record, the same on every run. A name called again in one run is a new step (``name`` #2, #3, ...). An
        exception from ``fn`` records nothing: the step runs again on the next attempt."""
        from . import steps

        steps.check_step(name, fn)
        if self._steps is None:
            self._steps = steps.Steps()
        key = self._steps.key(name)
        found, result = steps.stored(self, key)
        if found:
            return result
        return steps.record(self, key, steps.encode(name, fn(*args, **kwargs)))

    async def astep(self, name, fn, *args, **kwargs):
        """:meth:`step` for an ``async def`` handler: ``fn`` may be a coroutine function (it is
        awaited) or a plain one (called). The records are read and written through asgiref's
        ``sync_to_async``, as the ORM calls of an async handler are."""
        import inspect

        from asgiref.sync import sync_to_async

        from . import steps

        steps.check_step(name, fn)
        if self._steps is None:
            self._steps = steps.Steps()
        key = self._steps.key(name)
        found, result = await sync_to_async(steps.stored)(self, key)
        if found:
            return result
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        text = steps.encode(name, value)
        return await sync_to_async(steps.record)(self, key, text)

    def snooze(self, seconds):
        """``return ctx.snooze(seconds)``: run the job again after ``seconds`` without spending
        an attempt (the same as ``raise Snooze(seconds)``)."""
        from .exceptions import Snooze

        return Snooze(seconds)

    def sleep(self, name, seconds):
        """A durable sleep (docs/steps.md): the first time, end this run and run the job again
        in ``seconds`` (no thread, no limit slot and no attempt are held meanwhile); on that
        run the finished steps replay, and the sleep returns once its time has passed. ``name``
        names the sleep among the job's waits. Not inside a transaction."""
        from . import steps

        steps.sleep(self, name, seconds=seconds)

    def sleep_until(self, name, when):
        """:meth:`sleep` until the aware datetime ``when``."""
        from . import steps

        steps.sleep(self, name, until=when)

    def wait_for_signal(self, name, timeout=None):
        """Wait, holding no worker, for a signal ``name`` sent with ``signal_job(job_id,
        name, payload)``; returns its payload (decoded JSON). A signal sent before the wait is
        kept; the n-th wait of a name takes the n-th signal of that name. Past ``timeout``
        seconds (None: no timeout) raises ``SignalTimeout``. Not inside a transaction."""
        from . import steps

        return steps.wait_for_signal(self, name, timeout)

    async def asleep(self, name, seconds):
        """:meth:`sleep` for an ``async def`` handler."""
        from asgiref.sync import sync_to_async

        from . import steps

        await sync_to_async(steps.sleep)(self, name, seconds=seconds)

    async def await_signal(self, name, timeout=None):
        """:meth:`wait_for_signal` for an ``async def`` handler."""
        from asgiref.sync import sync_to_async

        from . import steps

        return await sync_to_async(steps.wait_for_signal)(self, name, timeout)

    def dependency_results(self):
        """``{dependency id: result}`` of the jobs this one waited on (docs/workflows.md): each
        one's decoded return value, ``None`` for a handler that returned nothing or for a
        dependency that failed (``on_failure="run"``). A dependency already deleted by
        retention is missing. A result that Python cannot read (written by hand) raises
        ``UnreadableJob`` naming the dependency: this job is then dead at once."""
        from . import decoding, store

        return {
            job_id: decoding.json_value(result, f"the result of dependency #{job_id}")
            for job_id, result in store.dependency_results(self.using, self.id).items()
        }

    @property
    def is_last_attempt(self):
        """True when a failure of this run sends the job to the dead letters."""
        return self.attempt >= self.max_attempts

    def __repr__(self):
        return f"<JobContext {self.type} #{self.id} attempt {self.attempt}/{self.max_attempts}>"
