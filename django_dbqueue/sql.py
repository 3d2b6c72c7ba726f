"""Every raw SQL statement django-dbqueue runs, each named after what it does.

Values are always bound parameters (``%(name)s``); nothing here is built from strings at run time.
Statements that touch many rows take arrays and ``unnest`` them, so a batch is one round trip.
Time is always the database's ``now()``, never a worker's clock.
"""

# Enqueue: one round trip, one statement, and no notification. A NOTIFY inside the caller's
# transaction would make PostgreSQL take a cluster-wide lock at its commit and hold it through the
# WAL flush, so concurrent enqueuing commits would queue behind each other; the wake-up is sent
# after the commit instead (NOTIFY_WORKERS, wakeup.py). Four variants, built here once from one
# template: with or without an idempotency key (ON CONFLICT makes "at most one job per key" hold
# under a race: the second inserter waits for the first to commit, then inserts nothing and
# returns no row), and due now or scheduled. A scheduled variant also says whether the job is
# already due by the database's clock, so that only a due job wakes a worker. The plain variant
# is what nearly every enqueue runs, and the server parses and plans a statement with fewer
# parameters and no expressions measurably faster.
_INSERT_JOB = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, idempotency_key, errors, created_at
)
VALUES (
    %(type)s, %(queue)s, %(payload)s::jsonb, 'pending', %(priority)s, {run_after},
    0, %(max_attempts)s, %(lease)s, {key}, '[]'::jsonb, now()
)
{conflict}RETURNING id, {due}
"""
_SCHEDULED = "COALESCE(%(run_after)s::timestamptz, now() + %(delay)s * interval '1 second')"
_ON_CONFLICT = "ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING\n"

_DUE = "run_after <= now()"

INSERT_JOB = _INSERT_JOB.format(run_after="now()", key="NULL", conflict="", due="true")
INSERT_JOB_SCHEDULED = _INSERT_JOB.format(run_after=_SCHEDULED, key="NULL", conflict="", due=_DUE)
INSERT_JOB_WITH_KEY = _INSERT_JOB.format(
    run_after="now()", key="%(key)s", conflict=_ON_CONFLICT, due="true"
)
INSERT_JOB_SCHEDULED_WITH_KEY = _INSERT_JOB.format(
    run_after=_SCHEDULED, key="%(key)s", conflict=_ON_CONFLICT, due=_DUE
)

# The batch variant: one INSERT ... SELECT FROM unnest(...) for any number of jobs; each row
# inserted comes back with its queue and whether it is due, for the wake-up after the commit.
INSERT_JOBS = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, idempotency_key, errors, created_at
)
SELECT u.type, u.queue, u.payload::jsonb, 'pending', u.priority,
       COALESCE(u.run_after, now() + u.delay * interval '1 second'),
       0, u.max_attempts, u.lease, u.key, '[]'::jsonb, now()
FROM unnest(
    %(types)s::text[], %(queues)s::text[], %(payloads)s::text[], %(priorities)s::smallint[],
    %(run_afters)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int[],
    %(leases)s::float8[], %(keys)s::text[]
) WITH ORDINALITY AS u(type, queue, payload, priority, run_after, delay, max_attempts, lease,
                       key, ord)
ORDER BY u.ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key, queue, run_after <= now()
"""

# The wake-up: one notification per queue, payload "<count>:<queue>", sent after the jobs'
# transaction committed, as a transaction of its own. NOTIFY takes a cluster-wide lock at commit
# and holds it until the commit is done; synchronous_commit = off for this transaction only
# (set_config's is_local) makes that commit not wait for the WAL flush, so the lock is held for
# microseconds and enqueuing commits never queue behind a flush. Losing it in a crash loses
# nothing but a wake-up (the worker's poll is the backstop). Never run inside a caller's open
# transaction: that would turn off synchronous commit for the caller's own writes.
NOTIFY_WORKERS = """
SELECT pg_notify(%(channel)s, payload), set_config('synchronous_commit', 'off', true)
FROM unnest(%(payloads)s::text[]) AS payload
"""

# The same inside a transaction that the caller commits by hand (Django's manual transaction
# management, where there is no on_commit): delivered at their commit, their durability untouched.
NOTIFY_WORKERS_AT_COMMIT = """
SELECT pg_notify(%(channel)s, payload) FROM unnest(%(payloads)s::text[]) AS payload
"""

# Which jobs already hold these idempotency keys (the ones ON CONFLICT skipped).
SELECT_IDS_BY_KEYS = """
SELECT idempotency_key, id FROM dbqueue_job WHERE idempotency_key = ANY(%(keys)s::text[])
"""

# The claim: one statement for up to %(limit)s jobs across the worker's queues.
# - One LATERAL index scan per queue, each in claim order, so every scan stops after its LIMIT
#   instead of sorting the whole backlog (a plain ``queue = ANY(...)`` cannot use the index
#   order across several queues). The per-queue limit is how a queue's concurrency is capped.
# - SKIP LOCKED: rows another worker is claiming right now are passed over, never waited on.
#   FOR UPDATE re-checks ``state = 'pending'`` on the newest row version, so a row that was
#   claimed and committed meanwhile is skipped too.
# - MATERIALIZED pins the plan: the candidates are computed once, then updated by id; the
#   planner cannot turn the LIMIT subquery into a join it re-evaluates.
# - The lease comes from the row (set at enqueue from the job type), in database time.
CLAIM_JOBS = """
WITH candidates AS MATERIALIZED (
    SELECT c.id
    FROM unnest(%(queues)s::text[], %(limits)s::int[]) AS q(name, lim)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_after
        FROM dbqueue_job AS j
        WHERE j.state = 'pending' AND j.queue = q.name AND j.run_after <= now()
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT q.lim
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_after, c.id
    LIMIT %(limit)s
)
UPDATE dbqueue_job AS j
SET state = 'running',
    attempts = j.attempts + 1,
    worker_id = %(worker)s,
    started_at = now(),
    leased_until = now() + j.lease_seconds * interval '1 second'
FROM candidates
WHERE j.id = candidates.id
RETURNING j.id, j.type, j.queue, j.payload::text, j.attempts, j.max_attempts, j.lease_seconds,
          j.idempotency_key, j.priority, j.created_at
"""

# Batched acknowledgement of successes. Fenced by (id, attempt, worker) and state: a worker whose
# lease expired and whose job was claimed again matches nothing here, so it cannot overwrite the
# new holder's state. The worker is part of the fence because an attempt number alone can be
# handed out twice (a requeue resets attempts; a release gives one back). The ids it did not
# match come back missing from RETURNING.
COMPLETE_JOBS = """
UPDATE dbqueue_job AS j
SET state = 'done', finished_at = now(), leased_until = NULL, result = c.result::jsonb
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::text[]) AS c(id, attempt, result)
WHERE j.id = c.id AND j.attempts = c.attempt AND j.state = 'running'
  AND j.worker_id = %(worker)s
RETURNING j.id
"""

# One failure: back to pending after a delay, or dead when the attempts are spent or the handler
# asked for no retry. Fenced like COMPLETE_JOBS. The error entry gets its time from the database.
FAIL_JOB = """
UPDATE dbqueue_job
SET state = CASE WHEN %(dead)s OR attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN %(dead)s OR attempts >= max_attempts THEN now() END,
    run_after = CASE WHEN %(dead)s OR attempts >= max_attempts THEN run_after
                     ELSE now() + %(delay)s * interval '1 second' END,
    leased_until = NULL,
    errors = errors || jsonb_build_array(%(error)s::jsonb || jsonb_build_object('at', now()))
WHERE id = %(id)s AND attempts = %(attempt)s AND state = 'running' AND worker_id = %(worker)s
RETURNING state, run_after
"""

# Heartbeat: push the lease of every job this worker still runs forward by the job's lease.
# Fenced; a job missing from RETURNING was taken back by the sweeper and belongs to someone else.
EXTEND_LEASES = """
UPDATE dbqueue_job AS j
SET leased_until = now() + j.lease_seconds * interval '1 second'
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS h(id, attempt)
WHERE j.id = h.id AND j.attempts = h.attempt AND j.state = 'running'
  AND j.worker_id = %(worker)s
RETURNING j.id
"""

# Graceful shutdown: hand jobs that never finished back without spending the attempt the claim
# took. Fenced like the rest.
RELEASE_JOBS = """
UPDATE dbqueue_job AS j
SET state = 'pending', attempts = j.attempts - 1, leased_until = NULL, worker_id = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS r(id, attempt)
WHERE j.id = r.id AND j.attempts = r.attempt AND j.state = 'running'
  AND j.worker_id = %(worker)s
RETURNING j.id
"""

# The sweeper: jobs whose lease ran out (their worker died or hung) go back to pending, after the
# default backoff with full jitter, or to dead when their attempts are spent. The attempt that
# expired counts and is recorded as an error. (The exponent is clamped so power() cannot overflow.) Bounded, and SKIP LOCKED so several workers sweeping
# at once split the work instead of queueing behind each other.
RESCUE_EXPIRED = """
WITH expired AS MATERIALIZED (
    SELECT id FROM dbqueue_job
    WHERE state = 'running' AND leased_until < now()
    ORDER BY leased_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE dbqueue_job AS j
SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    run_after = CASE WHEN j.attempts >= j.max_attempts THEN j.run_after
                     ELSE now() + random() * LEAST(%(cap)s, %(base)s * power(%(factor)s,
                                                   LEAST(GREATEST(j.attempts - 1, 0), 50)))
                                  * interval '1 second' END,
    leased_until = NULL,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts,
        'class', 'LeaseExpired',
        'message', 'lease expired at ' || j.leased_until::text || ' while held by worker '
                   || COALESCE(j.worker_id, '?') || '; the worker died, hung or lost the database',
        'traceback', '',
        'worker', j.worker_id,
        'at', now()))
FROM expired
WHERE j.id = expired.id
RETURNING j.id, j.type, j.attempts, j.state, j.worker_id, j.queue
"""

# The worker's status line: due backlog of its queues, counted up to a bound so that a huge
# backlog costs no more than the bound.
COUNT_DUE = """
SELECT count(*) FROM (
    SELECT 1 FROM dbqueue_job
    WHERE state = 'pending' AND queue = ANY(%(queues)s::text[]) AND run_after <= now()
    LIMIT %(bound)s
) AS due
"""

# Delivery records ------------------------------------------------------------------------------

# Claim the right to perform a side effect. A new key inserts a 'recorded' row; a key whose last
# delivery definitely failed is moved back to 'recorded' in the same statement (ON CONFLICT takes
# the row lock, so of two attempts racing only one sees 'failed'); a key that is recorded
# (outcome unknown) or sent returns nothing, and the caller must not perform the effect.
BEGIN_DELIVERY = """
INSERT INTO dbqueue_delivery (key, state, job_id, attempt, provider_reference, error,
                              created_at, updated_at)
VALUES (%(key)s, 'recorded', %(job_id)s, %(attempt)s, '', '', now(), now())
ON CONFLICT (key) DO UPDATE
    SET state = 'recorded', job_id = EXCLUDED.job_id, attempt = EXCLUDED.attempt,
        provider_reference = '', error = '', updated_at = now()
    WHERE dbqueue_delivery.state = 'failed'
RETURNING id
"""

SELECT_DELIVERY = """
SELECT id, state, provider_reference, error, job_id, attempt, created_at, updated_at
FROM dbqueue_delivery WHERE key = %(key)s
"""

# Settle a recorded delivery: sent (with the provider's reference) or failed (with the error).
# Only a 'recorded' row moves, so a late or repeated confirmation changes nothing. A run that
# holds the record settles it only while it is still its own (same job and attempt): if a person
# failed it meanwhile and a later attempt re-recorded it, the old run's late word is refused.
SETTLE_DELIVERY = """
UPDATE dbqueue_delivery
SET state = %(state)s, provider_reference = %(reference)s, error = %(error)s, updated_at = now()
WHERE key = %(key)s AND state = 'recorded'
  AND (%(holder)s::boolean IS NOT TRUE
       OR (job_id IS NOT DISTINCT FROM %(job_id)s::bigint AND attempt = %(attempt)s::int))
RETURNING id
"""

# Operator actions -------------------------------------------------------------------------------
# Each takes explicit ids and moves only the rows whose state allows it; the caller reports how
# many moved and how many were left alone. Requeue and run-now return each job's queue, for the
# wake-up their callers send after the commit (NOTIFY_WORKERS).

# Dead or cancelled -> pending, attempts reset. The error history stays: it is the record of
# what went wrong, and the next failures are appended after it.
REQUEUE_JOBS = """
UPDATE dbqueue_job
SET state = 'pending', attempts = 0, run_after = now(), finished_at = NULL,
    leased_until = NULL, worker_id = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('dead', 'cancelled')
RETURNING id, queue
"""

# Pending but scheduled for later -> due now.
RUN_JOBS_NOW = """
UPDATE dbqueue_job SET run_after = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending' AND run_after > now()
RETURNING id, queue
"""

# Pending -> cancelled. A running job is not cancelled: its handler is already under way.
CANCEL_JOBS = """
UPDATE dbqueue_job SET state = 'cancelled', finished_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
RETURNING id
"""

# The ids of dead jobs matching optional filters, in id order after a cursor, for requeueing a
# large set in bounded batches.
SELECT_DEAD_IDS = """
SELECT id FROM dbqueue_job
WHERE state = 'dead' AND id > %(after)s
  AND (%(type)s::text IS NULL OR type = %(type)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id
LIMIT %(limit)s
"""

COUNT_DEAD = """
SELECT count(*) FROM dbqueue_job
WHERE state = 'dead'
  AND (%(type)s::text IS NULL OR type = %(type)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
"""

# Retention: delete finished jobs of one state older than a cutoff, oldest first, bounded, and
# SKIP LOCKED so that workers pruning at once split the rows. Served by dbqueue_job_finished_idx.
PRUNE_FINISHED = """
DELETE FROM dbqueue_job
WHERE id IN (
    SELECT id FROM dbqueue_job
    WHERE state = %(state)s AND finished_at < now() - %(age)s * interval '1 second'
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
"""

# Status --------------------------------------------------------------------------------------------
# Counts per queue and state of the live states (pending, running, dead), the oldest due pending
# job's age, and the stuck (lease expired) jobs. One aggregate per state, so each is served by
# that state's partial index (claim, lease, finished) instead of a scan of the whole table.
# Finished rows (done, cancelled) are left out: retention keeps them few, and counting them is
# the one part that grows with history.
STATUS_COUNTS = """
SELECT queue, 'pending' AS state, count(*), 0 AS stuck,
       EXTRACT(EPOCH FROM now() - min(run_after) FILTER (WHERE run_after <= now())) AS oldest_due,
       count(*) FILTER (WHERE run_after > now()) AS scheduled
FROM dbqueue_job WHERE state = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*), count(*) FILTER (WHERE leased_until < now()), NULL, 0
FROM dbqueue_job WHERE state = 'running' GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*), 0, NULL, 0
FROM dbqueue_job WHERE state = 'dead' GROUP BY queue
ORDER BY 1, 2
"""

# Scheduler -------------------------------------------------------------------------------------

# First sight of a schedule entry: it starts from now (no tick before the fleet knew it).
ENSURE_SCHEDULE = """
INSERT INTO dbqueue_schedule (name, last_tick, updated_at) VALUES (%(name)s, now(), now())
ON CONFLICT (name) DO NOTHING
"""

# One worker at a time ticks an entry: the others skip the locked row instead of waiting, and the
# tick's idempotency key still makes one job should two ever compute the same tick.
LOCK_SCHEDULE = """
SELECT last_tick, now() FROM dbqueue_schedule WHERE name = %(name)s FOR UPDATE SKIP LOCKED
"""

ADVANCE_SCHEDULE = """
UPDATE dbqueue_schedule SET last_tick = %(tick)s, updated_at = now() WHERE name = %(name)s
"""

# Always one row at least (the LEFT JOIN), so the caller gets the database's now() too.
SCHEDULE_STATE = """
SELECT s.name, s.last_tick, n.now
FROM (SELECT now() AS now) AS n LEFT JOIN dbqueue_schedule AS s ON true
"""

# django.tasks ------------------------------------------------------------------------------------

# A task's result is its job row; the type check keeps a result id from reading other jobs.
SELECT_TASK_RESULT = """
SELECT payload::text, state, created_at, started_at, finished_at, errors::text, result::text,
       worker_id, priority, queue
FROM dbqueue_job WHERE id = %(id)s AND type = %(type)s
"""
