"""The batch top-up: more due jobs of one batch type, claimed for a batch the plain claim began
(docs/batches.md). Only a worker whose claim returned a job of a batch type runs it; the plain
claim (store/claiming.py) is not changed by batch handlers."""

from ._db import _commit, claimed_cte, int_array, text_array
from .fair import CLAIM_MORE_FAIR

# More jobs of one batch type from one queue, under the claim's lease token, so that a batch
# handler gets up to its batch_size per call rather than what one claim's free slots held.
# - The same scan as CLAIM_JOBS's per queue (dbqueue_job_claim_idx, in claim order, pending only),
#   filtered on the type: in a queue of its own (what docs/batches.md advises) every row it
#   reads is one it takes; in a shared queue it reads past the other types' due rows.
# - FOR UPDATE SKIP LOCKED, MATERIALIZED and ``id = ANY(ARRAY(...))`` as in CLAIM_JOBS, for the
#   same reasons (never wait on another worker's claim; a primary-key probe per id).
# - A paused queue gives nothing (the queue's row, once, not per job).
# - Jobs with a serial key are left to the plain claim, which takes them for free threads only
#   (a keyed job holds its key from its claim on).
# - Not used under fleet-wide limits: every job a limit counts is claimed through
#   dbqueue_claim_within_limits(), which the worker then calls as usual.
# - The rows come back as CLAIM_JOBS's do (one JSON array), read by claimed_rows().
# - On a fair queue (docs/fairness.md) the top-up is fair.CLAIM_MORE_FAIR (planned once) instead:
#   round-robin by fair key from the worker's cursor, so that one key's backlog does not fill
#   the batch ahead of the other keys' jobs.
CLAIM_MORE_OF_TYPE = f"""
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit'::text,
                      COALESCE(%(commit)s::text, current_setting('synchronous_commit'::text)),
                      true)
),
chosen AS MATERIALIZED (
    SELECT j.id
    FROM dbqueue_job AS j
    WHERE j.state::text = 'pending' AND j.queue::text = %(queue)s::text AND j.run_after <= now()
      AND j.type::text = %(type)s::text AND j.serial_key IS NULL
      AND NOT EXISTS (SELECT 1 FROM dbqueue_queue AS p
                      WHERE p.name::text = %(queue)s::text AND p.paused)
    ORDER BY j.priority DESC, j.run_after, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
{claimed_cte()}
SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
           id, type, queue, payload, attempts, max_attempts, lease_seconds, idempotency_key,
           priority, created_at, wait, traceparent, keyed)
       ORDER BY priority DESC, run_after, id)::text
FROM claimed
"""


def claim_more_statement(
    *, worker_id, queue, job_type, limit, token, async_commit=False, fair_cursor=None
):
    """The top-up's statement and parameters: up to ``limit`` more due jobs of ``job_type``
    from ``queue`` under lease ``token``; read its rows with ``claimed_rows``. ``fair_cursor``:
    for a fair queue, the last key the worker served in it (the rows then carry their keys and
    places, for next_cursors); None for a queue that is not fair."""
    params = {
        "worker": worker_id,
        "queue": queue,
        "type": job_type,
        "limit": limit,
        "token": token,
        "commit": _commit(async_commit),
    }
    if fair_cursor is None:
        return CLAIM_MORE_OF_TYPE, params
    return CLAIM_MORE_FAIR, {
        **params,
        "queues": text_array([queue]),
        "limits": int_array([limit]),
        "threads": 0,
        "fair": "{t}",
        "cursors": text_array([fair_cursor]),
    }
