"""Durable steps (steps.py, ``ctx.step``): the finished steps of a job, read once per run, and
the record of a step that just finished, fenced by the run's lease token."""

from ._db import _execute

# Every finished step of a job, as (name, occurrence, result as JSON text or NULL).
LOAD_STEPS = """
SELECT name, occurrence, result::text FROM dbqueue_step WHERE job_id = %(job)s
"""


def load_steps(using, job_id):
    """``{(name, occurrence): result JSON text or None}`` of ``job_id``'s finished steps."""
    return {(name, n): result for name, n, result in _execute(using, LOAD_STEPS, {"job": job_id})}


# Record a finished step, only while the run still holds the job (its lease token, state
# running): a run whose lease was lost and whose job another worker took meanwhile records
# nothing. The job's row is read, not locked: the token only ever changes by a new claim, and
# a claim needs the lease to have expired first, which fencing at completion settles anyway.
# A step already recorded under the same key (a run racing its own zombie) keeps its first
# result; the caller reads it back. Returns the recorded result's text (NULL for a None result)
# and whether this call inserted it; no row at all: fenced out.
SAVE_STEP = """
WITH held AS (
    SELECT 1 FROM dbqueue_job
    WHERE id = %(job)s AND lease_token = %(token)s AND state = 'running'
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
WHERE s.job_id = %(job)s AND s.name = %(name)s AND s.occurrence = %(occurrence)s
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
FROM dbqueue_step WHERE job_id = %(job)s ORDER BY id
"""


def list_steps(using, job_id):
    """``[(name, occurrence, attempt, finished_at, result_text)]`` of ``job_id``, in the order
    they finished."""
    return _execute(using, LIST_STEPS, {"job": job_id})
