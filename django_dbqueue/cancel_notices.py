"""Cancel notifications: how a worker running a job learns within milliseconds that its cancel
was asked for (cancellation.py marks the job; docs/concepts/cancelling.md). One
``"cancel:<id>,<id>,..."`` notification per 200 jobs on the wake-up channel, sent after the
commit; a lost one is made up for by the worker's next heartbeat.
"""

import logging

from django.db import connections, transaction

from .conf import get_settings
from .store import wakeups

logger = logging.getLogger("django_dbqueue.wakeup")

CANCEL_PREFIX = "cancel:"
CANCEL_CHUNK = 200  # ids per notification: ~2 KB, far below NOTIFY's 8000-byte payload limit,
#                     and below PIPE_BUF, so a group listener forwards one in a single write


def cancel_payloads(ids):
    """The notifications that tell the workers ``ids`` are to be cancelled."""
    ids = sorted(set(ids))
    return [
        CANCEL_PREFIX + ",".join(str(i) for i in ids[start : start + CANCEL_CHUNK])
        for start in range(0, len(ids), CANCEL_CHUNK)
    ]


MAX_ID = 2**63 - 1  # a job id is a bigint
MAX_ID_DIGITS = len(str(MAX_ID))


def _job_id(part):
    """The job id ``part`` spells (ASCII digits, 1 to 2**63-1), or None."""
    if not (0 < len(part) <= MAX_ID_DIGITS and part.isascii() and part.isdigit()):
        return None  # the length bounds what int() is given (it refuses > 4300 digits)
    value = int(part)
    return value if 0 < value <= MAX_ID else None


def parse_cancel(payload):
    """The job ids of a ``"cancel:<id>,<id>"`` payload, or ``None`` for any other payload.
    Parts that are not ids are skipped: a bad notification must not stop a listener, and never
    raises. The ids are a hint only: anyone who can connect may send one (NOTIFY needs no
    privilege), and the worker asks the database whether their cancel was asked for."""
    if not isinstance(payload, str) or not payload.startswith(CANCEL_PREFIX):
        return None
    ids = (_job_id(part) for part in payload[len(CANCEL_PREFIX) :].split(","))
    return [job_id for job_id in ids if job_id is not None]


def jobs_cancelled(using, ids):
    """Tell the workers that the running jobs ``ids`` were marked for cancellation on
    ``using``'s current transaction: one ``"cancel:<ids>"`` notification per 200 jobs, sent
    once that transaction commits (nothing if it rolls back), like ``wakeup.jobs_ready`` but not
    coalesced: cancels are rare, and each one must reach its worker within milliseconds. A
    notification that is lost is made up for by the worker's next heartbeat."""
    payloads = cancel_payloads(ids)
    if not payloads:
        return
    channel = get_settings().NOTIFY_CHANNEL
    connection = connections[using]
    if connection.in_atomic_block:
        transaction.on_commit(lambda: _send_cancel(using, channel, payloads), using=using)
    elif connection.get_autocommit():
        _send_cancel(using, channel, payloads)
    else:  # manual transaction management: ride in the caller's transaction
        wakeups.notify_at_commit(using, channel, payloads)


def _libpq_idle(connection):
    """Whether Django's ``connection`` (connected here if it was not) is outside any transaction
    in libpq too: Django's autocommit says nothing of a raw BEGIN."""
    from psycopg import pq

    connection.ensure_connection()
    return connection.connection.pgconn.transaction_status == pq.TransactionStatus.IDLE


def _send_cancel(using, channel, payloads):
    connection = connections[using]
    try:
        if (
            connection.in_atomic_block
            or not connection.get_autocommit()
            or not _libpq_idle(connection)
        ):
            # A transaction is open: an earlier on_commit hook opened one, or a raw BEGIN did
            # behind Django's back (it may hold the cancel itself). Ride in it, as its commit
            # sends it (its durability untouched).
            wakeups.notify_at_commit(using, channel, payloads)
        else:
            wakeups.notify(using, channel, payloads)
    except Exception as exc:  # the cancel has committed: never raise into the caller
        logger.warning(
            "dbqueue could not notify the workers of a cancel (%s) on %r: %s; their next "
            "heartbeat tells them",
            ", ".join(payloads),
            using,
            exc,
        )
