"""One root error, the bad-input errors it has, and the control-flow exceptions handlers raise."""

from django.core.exceptions import ImproperlyConfigured
from django.db import ProgrammingError

MAX_WAIT = 10 * 366 * 86400.0  # seconds: the longest snooze or durable sleep
# Seconds: the longest delay RetryJob takes, the longest a retry is given at all (a backoff's
# longer delay is capped to it: outcomes.MAX_DELAY).
MAX_RETRY_DELAY = 30 * 86400.0


class DBQueueError(Exception):
    """Root of every error django-dbqueue raises."""


class JobRegistrationError(DBQueueError, ImproperlyConfigured, ValueError):
    """A ``@job`` registration is wrong: duplicate type name, bad signature or option.

    A ``ValueError`` too, like every bad-input error here (``ImproperlyConfigured`` is not one).
    """


class UnknownJobType(DBQueueError, LookupError):
    """``enqueue()`` was given a type name that no ``@job`` registered."""


class PayloadError(DBQueueError, TypeError):
    """A payload that would not survive a JSON round trip unchanged; names the offending path."""


class EnqueueError(DBQueueError, ValueError):
    """An ``enqueue()`` argument is out of range or of the wrong kind."""


class UnsupportedDatabase(DBQueueError, ImproperlyConfigured):
    """The database alias is not PostgreSQL."""


class UnknownDatabase(DBQueueError, ValueError):
    """A ``using=`` argument that is not the alias (a str) of a database in ``DATABASES``."""


class InvalidArgument(DBQueueError, ValueError):
    """An argument of ``cancel()``, ``pause_queue()``, ``resume_queue()`` or the delivery
    functions is out of range or of the wrong kind (a ``by`` or key that PostgreSQL cannot store,
    ...); the message names it."""


class NotMigrated(DBQueueError, ProgrammingError):
    """The queue's tables (or some of its migrations) are missing from the database: the message
    names them and says to run ``python manage.py migrate``.

    Raised when one of the package's statements failed on a missing table, column or function,
    so the statement was sent: inside ``transaction.atomic()`` the caller's transaction is
    aborted and must be rolled back. Still a ``ProgrammingError`` (what was raised before it had
    a name), so ``except DatabaseError`` keeps catching it."""


class UnreadableJob(DBQueueError):
    """A value of a job's row, or of a record the job reads (a step's result, a signal's payload,
    a dependency's result), that Python cannot read back: JSON nested deeper than Python's
    ``json`` decodes, an integer of more digits than Python converts, a number Python would read
    as infinity, a timestamp outside Python's years 1 to 9999. Such a row can only come from
    outside the Python API (a plain ``UPDATE``, a SQL caller). The job that meets it is dead at
    once, this error in its history; the worker and the other jobs of its claim go on.

    ``column`` names what could not be read (``"payload"``, ``"created_at"``, ``"step 'x'"``),
    ``reason`` why; the message is ``"<column>: <reason>"``."""

    def __init__(self, column, reason):
        self.column = column
        self.reason = reason
        super().__init__(f"{column}: {reason}")

    def __reduce__(self):  # a process-mode child sends it back whole
        return type(self), (self.column, self.reason)


class LeaseExpired(DBQueueError):
    """Recorded (by the sweeper) for an attempt whose worker stopped renewing its lease."""


class LeaseLost(DBQueueError):
    """Raised in a handler by ``ctx.step`` when its run no longer holds the job: the lease
    expired and another run claimed it. The run should end; nothing it writes about the job
    counts any more (its completion is fenced out too)."""


class Snooze(Exception):
    """Raise from a handler (or return ``ctx.snooze(seconds)``) to run the job again after
    ``seconds`` without spending an attempt. A job snoozes at most ``MAX_SNOOZES`` times
    (1,000 by default): past that, a snooze counts as a failed attempt (``SnoozeLimit``)."""

    def __init__(self, seconds=0.0, reason=""):
        if hasattr(seconds, "total_seconds"):
            seconds = seconds.total_seconds()
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_WAIT
        ):
            raise InvalidArgument(
                f"Snooze(seconds): a number of seconds from 0 to {MAX_WAIT:g} "
                f"(10 years), got {seconds!r}"
            )
        self.seconds = float(seconds)
        self.reason = reason
        super().__init__(reason or f"snoozed for {self.seconds:g}s")


class SignalTimeout(DBQueueError, TimeoutError):
    """Raised in a handler by ``ctx.wait_for_signal(name, timeout=...)`` when the wait's
    timeout passed before the signal came."""


class RetryJob(Exception):
    """Raise from a handler to retry after ``delay`` seconds instead of the type's backoff.

    The attempt still counts: a job that keeps asking for a retry dies after ``max_attempts``.
    A delay past 30 days (``MAX_RETRY_DELAY``) raises ``InvalidArgument`` (a ``ValueError``).
    """

    def __init__(self, delay=0.0, reason=""):
        if hasattr(delay, "total_seconds"):
            delay = delay.total_seconds()
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not 0 <= delay <= MAX_RETRY_DELAY  # also NaN and inf
        ):
            from .validation import shown  # an int too long for repr() is described

            raise InvalidArgument(
                f"RetryJob(delay): a number of seconds from 0 to {MAX_RETRY_DELAY:.0f} (30 "
                f"days, the longest retry delay), got {shown(delay)}"
            )
        self.delay = float(delay)
        self.reason = reason
        super().__init__(reason or f"retry requested in {self.delay:g}s")


class JobCancelled(Exception):
    """Raised by ``ctx.raise_if_cancelled()`` once the job's cancel was asked for; a handler may
    raise it itself too. The run ends the job ``cancelled``: not a failure, never retried.

    A handler that catches it and carries on runs to its end, and the job still ends
    ``cancelled`` (with its result kept). Raised of a handler's own accord, with no cancel
    asked for, it cancels the job in the handler's name (``cancelled_by`` = ``"handler"``).
    """

    def __init__(self, reason=""):
        self.reason = reason
        super().__init__(reason or "the job was cancelled")


class DiscardJob(Exception):
    """Raise from a handler to send the job to the dead letters at once, with no further retry."""

    def __init__(self, reason=""):
        self.reason = reason
        super().__init__(reason or "discarded by the handler")
