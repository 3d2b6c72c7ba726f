"""Durable steps (steps.py, ``ctx.step``): the finished steps of a job, read once per run, and
the record of a step that just finished, fenced by the run's lease token."""

from ._db import _execute

# Every finished step of a job, as (name, occurrence, result as JSON text or NULL).
LOAD_STEPS = """
SELECT name, occurrence, result::text FROM dbqueue_step WHERE job_id = %(job)s::bigint
"""


def load_steps(using, job_id):
    """``{(name, occurrence): result JSON text or None}`` of ``job_id``'s finished steps."""
    return {(name, n): result for name, n, result in _execute(using, LOAD_STEPS, {"job": job_id})}


# The same, only while the run still holds the job (its lease token, state running); no row at
# all when it does not, and one row of NULLs for a held job without steps. Read, not locked, as
# SAVE_STEP reads it: a new claim needs the lease to have expired first.
LOAD_HELD_STEPS = """
SELECT s.name, s.occurrence, s.result::text
FROM dbqueue_job AS j LEFT JOIN dbqueue_step AS s ON s.job_id = j.id
WHERE j.id = %(job)s::bigint AND j.lease_token = %(token)s::bigint AND j.state::text = 'running'
"""


def load_held_steps(using, job_id, token):
    """:func:`load_steps` while the run with lease ``token`` holds the job; None after it lost
    it."""
    rows = _execute(using, LOAD_HELD_STEPS, {"job": job_id, "token": token})
    if not rows:
        return None
    return {(name, n): result for name, n, result in rows if name is not None}


# Record a finished step, only while the run still holds the job (its lease token, state
# running): a run whose lease was lost and whose job another worker took meanwhile records
# nothing. The job's row is locked FOR KEY SHARE until the record commits: inside a transaction
# (an atomic handler, transaction.atomic() around the step) that is the transaction's end, and
# the sweeper and the claim (FOR UPDATE SKIP LOCKED) pass the job over until then, so no other
# run can take the job while this record (and the step's writes beside it) may still commit.
# The heartbeat, completions and cancels take weaker locks (NO KEY UPDATE) and never wait for it.
# A step already recorded under the same key (a run racing its own zombie) keeps its first
# result; the caller reads it back. Returns the recorded result's text (NULL for a None result)
# and whether this call inserted it; no row at all: fenced out.
SAVE_STEP = """
WITH held AS (
    SELECT 1 FROM dbqueue_job
    WHERE id = %(job)s::bigint AND lease_token = %(token)s::bigint AND state::text = 'running'
    FOR KEY SHARE
),
inserted AS (
    INSERT INTO dbqueue_step (job_id, name, occurrence, result, attempt, finished_at)
    SELECT %(job)s, %(name)s, %(occurrence)s, %(result)s::jsonb, %(attempt)s, now()
    FROM held
    ON CONFLICT (job_id, name, occurrence) DO NOTHING
    RETURNING result::text
)
SELECT result, true FROM inserted
UNION ALL
SELECT s.result::text, false FROM dbqueue_step AS s, held
WHERE s.job_id = %(job)s::bigint AND s.name::text = %(name)s::text
  AND s.occurrence = %(occurrence)s::int
  AND NOT EXISTS (SELECT 1 FROM inserted)
"""


def save_step(using, *, job_id, token, name, occurrence, result, attempt):
    """Record the step; returns ``(result_text, inserted)``, or None when the run no longer
    holds the job (fenced out)."""
    params = {
        "job": job_id,
        "token": token,
        "name": name,
        "occurrence": occurrence,
        "result": result,
        "attempt": attempt,
    }
    rows = _execute(using, SAVE_STEP, params)
    return rows[0] if rows else None


# A job's steps, for the admin and jobqueue_status --job: oldest first.
LIST_STEPS = """
SELECT name, occurrence, attempt, finished_at, result::text
FROM dbqueue_step WHERE job_id = %(job)s::bigint ORDER BY id
"""


def list_steps(using, job_id):
    """``[(name, occurrence, attempt, finished_at, result_text)]`` of ``job_id``, in the order
    they finished."""
    return _execute(using, LIST_STEPS, {"job": job_id})


# The database's clock: durable waits measure their time with it, as the claim does.
NOW = "SELECT now()"


def db_now(using):
    return _execute(using, NOW, None)[0][0]


# What a wait for the %(seq)s-th signal %(name)s finds, in one snapshot: that signal's payload
# (NULL when none was sent yet, or when it carried None: see the second column) and the job's
# signal_seq, which a snooze compares with the newest row (SNOOZE_JOB's %(seen)s).
READ_SIGNAL = """
SELECT s.payload::text, s.id IS NOT NULL, j.signal_seq, now()
FROM dbqueue_job AS j
LEFT JOIN dbqueue_signal AS s
    ON s.job_id = j.id AND s.name::text = %(name)s::text AND s.seq = %(seq)s::int
WHERE j.id = %(job)s::bigint
"""


def read_signal(using, *, job_id, name, seq):
    """``(found, payload_text, signal_seq, now)`` for the job's ``seq``-th signal ``name``."""
    rows = _execute(using, READ_SIGNAL, {"job": job_id, "name": name, "seq": seq})
    if not rows:
        return False, None, None, db_now(using)
    payload, found, seen, now = rows[0]
    return found, payload, seen, now


# signal_job, in the caller's transaction. First a transaction-level advisory lock of the job
# (class "dbq4", the id folded into 31 bits: two jobs may share a key, which only orders their
# senders): it orders concurrent signals to one job, so each takes the next seq, and blocks
# nothing but another sender to that job. Then the job, read without a lock (a finished job takes
# no signal), then the signal. The job's row is changed at the sender's COMMIT by the deferred
# trigger dbqueue_apply_signal (migration 0023): signal_seq + 1, and due now when it waits for
# a signal of that name. Holding the row from here would stall the heartbeat of the worker
# running the job until the sender commits.
SIGNAL_LOCK = (
    "SELECT pg_advisory_xact_lock(1684173108, mod(%(job)s::bigint, 2147483647::bigint)::int)"
)
SIGNAL_TARGET = """
SELECT queue FROM dbqueue_job
WHERE id = %(job)s::bigint AND state::text NOT IN ('done', 'dead', 'cancelled')
"""

INSERT_SIGNAL = """
INSERT INTO dbqueue_signal (job_id, name, seq, payload, created_at)
SELECT %(job)s, %(name)s,
       COALESCE((SELECT max(seq) FROM dbqueue_signal
                 WHERE job_id = %(job)s::bigint AND name::text = %(name)s::text), 0) + 1,
       %(payload)s::jsonb, now()
RETURNING seq
"""


def signal_job(using, *, job_id, name, payload):
    """Send a signal (three statements in the caller's transaction: the job's advisory lock,
    which orders concurrent senders, the job, then the signal; the job's row changes at the
    commit). Returns ``(queue, seq)``, or None when the job does not exist or has finished."""
    _execute(using, SIGNAL_LOCK, {"job": job_id})
    rows = _execute(using, SIGNAL_TARGET, {"job": job_id})
    if not rows:
        return None
    seq = _execute(using, INSERT_SIGNAL, {"job": job_id, "name": name, "payload": payload})[0][0]
    return rows[0][0], seq
