"""Delivery records (deliveries.py): begun, read and settled on a connection that commits on
its own (connections.side_execute), so that a record outlives the caller's rollback."""

import logging
import time

from django.db import connections

from ..connections import DB_ERRORS, reset_connection, side_execute
from ._db import _execute

logger = logging.getLogger("django_dbqueue")


SETTLE_RETRIES = 3  # tries of a settle that met a lost connection


# Claim the right to perform a side effect. A new key inserts a 'recorded' row; a key whose last
# delivery definitely failed is moved back to 'recorded' in the same statement (ON CONFLICT takes
# the row lock, so of two attempts racing only one sees 'failed'); a key that is recorded
# (outcome unknown) or sent returns nothing, and the caller must not perform the effect.
# It returns the record's updated_at, which names this recording (see SETTLE_DELIVERY): every
# write of a delivery row moves updated_at forward, by at least a microsecond past its last value.
# As whole microseconds since the epoch: a number comes back the same through any connection,
# where a timestamp without its zone (USE_TZ = False) would be read in each connection's TimeZone.
BEGIN_DELIVERY = """
INSERT INTO dbqueue_delivery (key, state, job_id, attempt, provider_reference, error,
                              created_at, updated_at)
VALUES (%(key)s, 'recorded', %(job_id)s, %(attempt)s, '', '', now(), now())
ON CONFLICT (key) DO UPDATE
    SET state = 'recorded', job_id = EXCLUDED.job_id, attempt = EXCLUDED.attempt,
        provider_reference = '', error = '',
        updated_at = GREATEST(now(), dbqueue_delivery.updated_at + interval '1 microsecond')
    WHERE dbqueue_delivery.state::text = 'failed'
RETURNING id, (extract(epoch FROM updated_at) * 1000000::numeric)::bigint
"""


def begin_delivery(using, *, key, job_id, attempt):
    """Record (or re-record a failed) delivery. When this caller now holds it: the recording's
    ``updated_at`` in microseconds since the epoch, which fences its settle
    (SETTLE_DELIVERY); otherwise None."""
    params = {"key": key, "job_id": job_id, "attempt": attempt}
    rows = side_execute(using, BEGIN_DELIVERY, params)
    return rows[0][1] if rows else None


SELECT_DELIVERY = """
SELECT id, state, provider_reference, error, job_id, attempt, created_at, updated_at
FROM dbqueue_delivery WHERE key::text = %(key)s::text
"""


def delivery(using, key):
    """``(id, state, provider_reference, error, job_id, attempt, created_at, updated_at)`` of the
    delivery ``key``, or ``None``."""
    rows = side_execute(using, SELECT_DELIVERY, {"key": key})
    return rows[0] if rows else None


# Settle a recorded delivery: sent (with the provider's reference) or failed (with the error).
# Only a 'recorded' row moves, so a late or repeated confirmation changes nothing. A run that
# holds the record settles it only while it is still its own recording: same job and attempt,
# and the updated_at its BEGIN_DELIVERY returned (%(recorded_at)s, in microseconds). Attempt
# numbers repeat (a requeue starts them again at 1): a stale run of attempt 1, whose record a person failed and the
# requeued job's attempt 1 recorded again, matches on job and attempt, but not on the recording,
# whose updated_at only ever moves forward (by at least a microsecond per write, so that two
# writes within one microsecond cannot share it). A run whose lease expired but whose recording
# nobody replaced still settles it: it holds the record, and only it knows the outcome.
SETTLE_DELIVERY = """
UPDATE dbqueue_delivery
SET state = %(state)s, provider_reference = %(reference)s, error = %(error)s,
    updated_at = GREATEST(now(), updated_at + interval '1 microsecond')
WHERE key::text = %(key)s::text AND state::text = 'recorded'
  AND (%(holder)s::boolean IS NOT TRUE
       OR (job_id IS NOT DISTINCT FROM %(job_id)s::bigint AND attempt = %(attempt)s::int
           AND (%(recorded_at)s::bigint IS NULL
                OR (extract(epoch FROM updated_at) * 1000000::numeric)::bigint
                   = %(recorded_at)s::bigint)))
RETURNING id
"""


def settle_delivery(
    using, *, key, state, reference, error, holder, job_id, attempt, recorded_at=None
):
    """Move a ``recorded`` delivery to ``state``; True if it moved, False if it did not, None
    when a retry matched nothing after a try whose reply was lost (it may have moved it).

    The effect has already happened when this runs, so a lost connection must not leave the
    record ``recorded`` (an unknown outcome that needs a person): reconnect and try again. That
    is safe because the statement is fenced (only a ``recorded`` row, and for a ``holder`` only
    its own recording: job, attempt and ``recorded_at``, moves); a first try that committed but lost its reply makes the
    retry match nothing, which the caller tells apart by reading the row back.
    """
    params = {
        "key": key,
        "state": state,
        "reference": reference,
        "error": error,
        "holder": holder,
        "job_id": job_id,
        "attempt": attempt,
        "recorded_at": recorded_at,
    }
    for tries in range(1, SETTLE_RETRIES + 1):
        try:
            if side_execute(using, SETTLE_DELIVERY, params):
                return True
            return False if tries == 1 else None
        except DB_ERRORS:
            if tries == SETTLE_RETRIES:
                raise
            logger.warning(
                "dbqueue delivery %r: connection lost while settling it %s; reconnecting "
                "(try %d of %d)",
                key,
                state,
                tries + 1,
                SETTLE_RETRIES,
            )
            if not connections[using].in_atomic_block:
                reset_connection(using)  # the side path drops its own connection itself
            time.sleep(0.05 * tries)  # a short backoff before reconnecting, not a wait
    raise AssertionError("unreachable")  # pragma: no cover


# A person settles unconfirmed deliveries from the admin: only 'recorded' rows move, so a record
# that its job settled meanwhile keeps the job's word.
SETTLE_DELIVERIES_BY_ID = """
UPDATE dbqueue_delivery
SET state = %(state)s, error = %(error)s,
    updated_at = GREATEST(now(), updated_at + interval '1 microsecond')
WHERE id = ANY(%(ids)s::bigint[]) AND state::text = 'recorded'
RETURNING id
"""


def settle_deliveries(using, ids, *, state, error):
    """A person settles ``recorded`` deliveries by id; returns the number moved."""
    rows = _execute(
        using, SETTLE_DELIVERIES_BY_ID, {"ids": list(ids), "state": state, "error": error}
    )
    return len(rows)
