"""Every raw SQL statement django-dbqueue runs, each named after what it does.

Values are always bound parameters (``%(name)s``); nothing here is built from strings at run time.
Statements that touch many rows take arrays and ``unnest`` them, so a batch is one round trip.
Time is always the database's ``now()``, never a worker's clock.
"""

# Whether an enqueue's job wants a wake-up (waiters.py explains it). Two advisory locks per
# queue, keyed by the queue's hashtext() (computed by the server on both sides: the enqueue binds
# nothing more for them), of two classes: WAITING ('dbq1' in ASCII), held shared at session level
# by every worker that waits for a wake-up on the queue (START_WAITING), and ENQUEUING ('dbq2'),
# held shared by an enqueue that found nobody waiting, until its transaction ends. The CASE fixes
# the order of its steps; a wake-up is wanted (true) at the first that fails:
# 1. WAITING, tried exclusively and let go of at once (a session lock for an instant: concurrent
#    enqueues do not hold it against each other): a worker waits, or is starting to. The common
#    case while workers are idle ends here, holding nothing.
# 2. ENQUEUING, shared, held until this transaction ends: a worker that starts waiting from now
#    on waits for this commit before its claim (AWAIT_ENQUEUERS). Only enqueues that found nobody
#    hold it, so a worker starting to wait waits for those alone, and they are finite: once it
#    waits, later enqueues stop at step 1.
# 3. WAITING again, as in 1, now that ENQUEUING is held: a worker that started waiting between 1
#    and 2 is found here (its AWAIT_ENQUEUERS may have passed before this held ENQUEUING).
WAITING_LOCK = 0x64627131
ENQUEUING_LOCK = 0x64627132


def _wakeup_wanted(queue):
    key = f"hashtext({queue})"
    look = f"pg_try_advisory_lock({WAITING_LOCK}, {key})"
    done = f"pg_advisory_unlock({WAITING_LOCK}, {key})"
    return (
        f"CASE WHEN NOT {look} THEN true WHEN NOT {done} THEN true"
        f" WHEN NOT pg_try_advisory_xact_lock_shared({ENQUEUING_LOCK}, {key}) THEN true"
        f" WHEN {look} THEN NOT {done} ELSE true END"
    )


# The same once per queue of a batch (enqueue_many, a workflow), from its inserted rows.
WAKEUPS_WANTED = f"""
SELECT q.queue, {_wakeup_wanted("q.queue")} AS wanted
FROM (SELECT DISTINCT queue FROM inserted) AS q
"""


# Enqueue: one round trip, one statement, and no notification. A NOTIFY inside the caller's
# transaction would make PostgreSQL take a cluster-wide lock at its commit and hold it through the
# WAL flush, so concurrent enqueuing commits would queue behind each other; the wake-up is sent
# after the commit instead (NOTIFY_WORKERS, wakeup.py). Four variants (and the flow-control ones
# of INSERT_JOB_VARIANTS below), built here once from one template: with or without an idempotency key (ON CONFLICT makes "at most one job per key" hold
# under a race: the second inserter waits for the first to commit, then inserts nothing and
# returns no row), and due now or scheduled. A scheduled variant also says whether the job is
# already due by the database's clock, so that only a due job wakes a worker: each returns the
# job's id and ``wake``, NULL for a job not due yet, else whether a worker waits for its wake-up
# (_wakeup_wanted). The plain variant
# is what nearly every enqueue runs, and the server parses and plans a statement with fewer
# parameters and no expressions measurably faster. Each has a traced twin (``_TRACED``) that also
# stores the enqueuer's W3C traceparent; the untraced ones leave the column out, so an enqueue
# outside a trace binds nothing more than it did before tracing existed.
_INSERT_JOB = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, idempotency_key, errors, created_at{trace_column}{unique_columns}{serial_column}
)
VALUES (
    %(type)s, %(queue)s, %(payload)s::jsonb, 'pending', %(priority)s, {run_after},
    0, %(max_attempts)s, %(lease)s, {key}, '[]'::jsonb, now(){trace_value}{unique_values}{serial_value}
)
{conflict}RETURNING id, {wake}{created}
"""
_SCHEDULED = "COALESCE(%(run_after)s::timestamptz, now() + %(delay)s * interval '1 second')"
_ON_CONFLICT = "ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING\n"
_DUE = "run_after <= now()"
_WANTED = _wakeup_wanted("queue")
_UNTRACED = {"trace_column": "", "trace_value": ""}
_TRACED = {"trace_column": ", traceparent", "trace_value": ", %(traceparent)s"}


# When a job holds its unique key: the predicate of the partial unique index
# dbqueue_job_unique_key_live_uniq (models.UNIQUE_HELD), written out for ON CONFLICT's inference
# (PostgreSQL picks a partial index as the arbiter only when the statement's WHERE implies the
# index's predicate) and for the lookup of the live holder. "active": pending, waiting or
# running. "pending": not claimed yet (started_at is set by the first claim and never cleared),
# so a retry, a release or a rescue back to pending never takes the key again, and no statement
# that moves a started job back to pending can collide with a newer holder.
def _unique_held(alias=""):
    return (
        f"{alias}unique_key IS NOT NULL AND {alias}state IN ('pending', 'waiting', 'running')"
        f" AND ({alias}unique_while = 'active' OR {alias}started_at IS NULL)"
    )


UNIQUE_HELD_SQL = _unique_held()

# Unique while pending/active (enqueue(unique_key=..., unique_while=...)): the conflict target is
# the partial unique index, so "at most one live job per key" holds under concurrent enqueuers:
# the second inserter waits for the first to commit, then inserts nothing and returns no row,
# and the caller reads the holder (SELECT_UNIQUE_HOLDER). The debounce form updates the holder
# instead, in the same statement, while it is still pending and never claimed, and of the same
# type: its run_after and payload become this call's (the last call's payload is the one that
# runs). A holder being claimed meanwhile is locked: the update waits, and finds a row version
# that left the index (a "pending" holder: PostgreSQL then retries the insert, which succeeds) or
# that fails the WHERE (an "active" one: no row, and the caller returns the holder untouched).
# xmax = 0 tells an inserted row from an updated one in RETURNING (the updated row version
# carries this transaction's id there; a common idiom, not a documented guarantee).
_ON_UNIQUE_CONFLICT = "ON CONFLICT (unique_key) WHERE " + UNIQUE_HELD_SQL + "\n"
_UNIQUE_DO_NOTHING = _ON_UNIQUE_CONFLICT + "DO NOTHING\n"
_UNIQUE_DEBOUNCE = (
    _ON_UNIQUE_CONFLICT
    + """DO UPDATE SET run_after = EXCLUDED.run_after, payload = EXCLUDED.payload
    WHERE dbqueue_job.state = 'pending' AND dbqueue_job.started_at IS NULL
      AND dbqueue_job.type = EXCLUDED.type
"""
)
_CONFLICTS = {
    None: ("NULL", "", ""),
    "key": ("%(key)s", _ON_CONFLICT, ""),
    "unique": ("NULL", _UNIQUE_DO_NOTHING, ""),
    "debounce": ("NULL", _UNIQUE_DEBOUNCE, ", xmax = 0"),
}


def _insert_job(scheduled, conflict, trace, serial=False):
    key, clause, created = _CONFLICTS[conflict]
    unique = conflict in ("unique", "debounce")
    return _INSERT_JOB.format(
        run_after=_SCHEDULED if scheduled else "now()",
        key=key,
        conflict=clause,
        # NULL: not due yet (a scheduled job looks only when it is due already); else whether a
        # worker waits for its wake-up.
        wake=f"CASE WHEN {_DUE} THEN {_WANTED} END" if scheduled else _WANTED,
        created=created,
        unique_columns=", unique_key, unique_while" if unique else "",
        unique_values=", %(unique_key)s, %(unique_while)s" if unique else "",
        serial_column=", serial_key" if serial else "",
        serial_value=", %(serial_key)s" if serial else "",
        **trace,
    )


INSERT_JOB = _insert_job(False, None, _UNTRACED)
INSERT_JOB_SCHEDULED = _insert_job(True, None, _UNTRACED)
INSERT_JOB_WITH_KEY = _insert_job(False, "key", _UNTRACED)
INSERT_JOB_SCHEDULED_WITH_KEY = _insert_job(True, "key", _UNTRACED)
INSERT_JOB_TRACED = _insert_job(False, None, _TRACED)
INSERT_JOB_SCHEDULED_TRACED = _insert_job(True, None, _TRACED)
INSERT_JOB_WITH_KEY_TRACED = _insert_job(False, "key", _TRACED)
INSERT_JOB_SCHEDULED_WITH_KEY_TRACED = _insert_job(True, "key", _TRACED)

# Every other combination (a unique key, a debounce, a serial key, with the others), built
# once here, named by (scheduled, conflict, traced, serial): conflict is None, "key" (the
# idempotency key), "unique" or "debounce". The plain ones above are the same texts.
INSERT_JOB_VARIANTS = {
    (scheduled, conflict, traced, serial): _insert_job(
        scheduled, conflict, _TRACED if traced else _UNTRACED, serial
    )
    for scheduled in (False, True)
    for conflict in _CONFLICTS
    for traced in (False, True)
    for serial in (False, True)
}

# The job holding a unique key now (the one an enqueue that inserted nothing must return).
# Served by the unique index itself.
SELECT_UNIQUE_HOLDER = (
    "SELECT id, type, queue FROM dbqueue_job WHERE unique_key = %(unique_key)s AND "
    + UNIQUE_HELD_SQL
)

# The batch variant: one INSERT ... SELECT FROM unnest(...) for any number of jobs; each row
# inserted comes back with its queue and its ``wake``, as for one job (WAKEUPS_WANTED looks once
# per queue of the batch).
# Every job of one batch shares the enqueuer's trace context; the traced twin binds it once.
_INSERT_JOBS = """
WITH inserted AS (
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, idempotency_key, errors, created_at, serial_key{trace_column}
)
SELECT u.type, u.queue, u.payload::jsonb, 'pending', u.priority,
       COALESCE(u.run_after, now() + u.delay * interval '1 second'),
       0, u.max_attempts, u.lease, u.key, '[]'::jsonb, now(), u.serial_key{trace_value}
FROM unnest(
    %(types)s::text[], %(queues)s::text[], %(payloads)s::text[], %(priorities)s::smallint[],
    %(run_afters)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int[],
    %(leases)s::float8[], %(keys)s::text[], %(serial_keys)s::text[]
) WITH ORDINALITY AS u(type, queue, payload, priority, run_after, delay, max_attempts, lease,
                       key, serial_key, ord)
ORDER BY u.ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key, queue, run_after <= now() AS due
),
wanted AS MATERIALIZED ({wanted})
SELECT i.id, i.idempotency_key, i.queue, CASE WHEN i.due THEN w.wanted END
FROM inserted AS i LEFT JOIN wanted AS w USING (queue)
"""
INSERT_JOBS = _INSERT_JOBS.format(wanted=WAKEUPS_WANTED, **_UNTRACED)
INSERT_JOBS_TRACED = _INSERT_JOBS.format(wanted=WAKEUPS_WANTED, **_TRACED)

# A workflow (workflow.py, docs/workflows.md): its jobs and their dependency edges in one
# statement, so the whole graph commits or rolls back with the caller's transaction.
# - ``existing``: the dependencies that are jobs already in the table, read, not locked. This
#   statement writes only new rows: the new jobs, their edges, and for each edge to an existing
#   job a row of dbqueue_link_at_commit, which its deferred trigger (migration 0015) applies at
#   the caller's COMMIT: it appends the new dependent to that job's ``dependents`` and settles
#   the dependent against the job's newest state. Locking a running dependency here instead held
#   its row until the caller's transaction ended, and its worker's heartbeat, completion and
#   claims waited for it (their loop froze; past the lease, every job of that worker was swept).
#   Now the lock lives for the commit only; a completion that commits first is seen by the
#   trigger, one that comes after reads ``dependents`` (COMPLETE_JOBS).
# - Nothing is inserted when one of them is missing, dead or cancelled in this statement's
#   snapshot: the caller reads them back from the result and raises an error naming them. One
#   that dies or is cancelled before the commit cancels the dependent at the commit (unless
#   on_failure="run"), as it would have a moment later.
# - Ids are taken from the sequence first (in the order given), so that the edges, given as
#   positions in the batch, can name the new jobs in the same statement.
# - A job with dependencies not done yet starts ``waiting`` (the claim's index never sees it),
#   counting them in waiting_on; the others start pending, and wake the workers after the
#   commit (wakeup.py) when one waits on their queue (WAKEUPS_WANTED). One whose existing
#   dependencies are all done by the commit is made pending there (and the workers woken).
# - A workflow whose dependencies are all new jobs writes no link row: no trigger fires.
INSERT_WORKFLOW = """
WITH existing AS MATERIALIZED (
    SELECT id, state FROM dbqueue_job WHERE id = ANY(%(existing)s::bigint[])
),
accepted AS MATERIALIZED (
    SELECT count(*) = cardinality(%(existing)s::bigint[])
           AND NOT bool_or(state IN ('dead', 'cancelled')) IS TRUE AS ok
    FROM existing
),
ids AS MATERIALIZED (
    SELECT ord, nextval(pg_get_serial_sequence('dbqueue_job', 'id')) AS id
    FROM generate_series(1, cardinality(%(types)s::text[])) AS ord
    WHERE (SELECT ok FROM accepted)
),
edges AS MATERIALIZED (
    SELECT e.job_ord, e.dep_ord, e.dep_id, e.run_on_failure
    FROM unnest(%(edge_jobs)s::int[], %(edge_dep_ords)s::int[], %(edge_dep_ids)s::bigint[],
                %(edge_runs)s::boolean[]) AS e(job_ord, dep_ord, dep_id, run_on_failure)
),
counts AS MATERIALIZED (
    SELECT e.job_ord,
           count(*) FILTER (WHERE e.dep_ord IS NOT NULL OR x.state <> 'done') AS waiting_on
    FROM edges AS e LEFT JOIN existing AS x ON x.id = e.dep_id
    GROUP BY e.job_ord
),
inserted AS (
    INSERT INTO dbqueue_job (
        id, type, queue, payload, state, priority, run_after, attempts, max_attempts,
        lease_seconds, idempotency_key, errors, created_at, traceparent, waiting_on,
        dependents, serial_key
    )
    SELECT i.id, u.type, u.queue, u.payload::jsonb,
           CASE WHEN COALESCE(c.waiting_on, 0) > 0 THEN 'waiting' ELSE 'pending' END,
           u.priority, COALESCE(u.run_after, now() + u.delay * interval '1 second'),
           0, u.max_attempts, u.lease, NULL, '[]'::jsonb, now(), %(traceparent)s,
           COALESCE(c.waiting_on, 0),
           (SELECT array_agg(w.id ORDER BY w.id)
            FROM edges AS d JOIN ids AS w ON w.ord = d.job_ord WHERE d.dep_ord = u.ord),
           u.serial_key
    FROM unnest(
        %(types)s::text[], %(queues)s::text[], %(payloads)s::text[], %(priorities)s::smallint[],
        %(run_afters)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int[],
        %(leases)s::float8[], %(serial_keys)s::text[]
    ) WITH ORDINALITY AS u(type, queue, payload, priority, run_after, delay, max_attempts,
                           lease, serial_key, ord)
    JOIN ids AS i ON i.ord = u.ord
    LEFT JOIN counts AS c ON c.job_ord = u.ord
    RETURNING id, queue, state
),
linked AS (
    INSERT INTO dbqueue_dependency (job_id, depends_on_id, run_on_failure)
    SELECT j.id, COALESCE(d.id, e.dep_id), e.run_on_failure
    FROM edges AS e JOIN ids AS j ON j.ord = e.job_ord LEFT JOIN ids AS d ON d.ord = e.dep_ord
    RETURNING 1
),
at_commit AS (
    INSERT INTO dbqueue_link_at_commit (job_id, depends_on_id, run_on_failure)
    SELECT w.id, e.dep_id, e.run_on_failure
    FROM edges AS e JOIN ids AS w ON w.ord = e.job_ord
    WHERE e.dep_id IS NOT NULL
    ORDER BY e.dep_id, w.id
    RETURNING 1
),
wanted AS MATERIALIZED ({wanted})
SELECT 'job', i.id, i.state, i.queue, CASE WHEN i.state = 'pending' THEN w.wanted END,
       (SELECT count(*) FROM linked) + (SELECT count(*) FROM at_commit)
FROM inserted AS i LEFT JOIN wanted AS w USING (queue)
UNION ALL
SELECT 'dependency', id, state, NULL, NULL, 0 FROM existing
""".replace("{wanted}", WAKEUPS_WANTED)  # (the text has braces of its own)

# A job's dependencies and their results (``ctx.dependency_results()``); a pruned dependency
# is missing.
DEPENDENCY_RESULTS = """
SELECT j.id, j.result::text
FROM dbqueue_dependency AS e JOIN dbqueue_job AS j ON j.id = e.depends_on_id
WHERE e.job_id = %(id)s
"""

# The admin's view of a job's workflow: the jobs it waits on and the jobs waiting on it.
WORKFLOW_NEIGHBOURS = """
SELECT 'depends_on', j.id, j.type, j.state, e.run_on_failure
FROM dbqueue_dependency AS e JOIN dbqueue_job AS j ON j.id = e.depends_on_id
WHERE e.job_id = %(id)s
UNION ALL
SELECT 'dependent', j.id, j.type, j.state, e.run_on_failure
FROM dbqueue_dependency AS e JOIN dbqueue_job AS j ON j.id = e.job_id
WHERE e.depends_on_id = %(id)s
ORDER BY 1, 2
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
#   planner cannot turn the LIMIT subquery into a join it re-evaluates. The UPDATE finds them
#   by ``id = ANY(ARRAY(...))``, a primary-key probe per id whatever the table's size: joined
#   to the CTE instead, the planner guessed the LIMIT's rows and, on a table of a few hundred
#   rows (a quiet queue after retention), hashed the whole table into the update (a sequential
#   scan per claim: 0.9 ms of a wake-up's 1.3 ms), and planned about a third longer.
# - The lease comes from the row (set at enqueue from the job type), in database time.
# - %(token)s, random per claim, is the fence of every later write about these rows: (id, token)
#   cannot repeat, unlike (id, attempt, worker), which a requeue or a claim lost in a crash
#   can hand to the same worker twice.
# - commit_mode sets synchronous_commit for this statement's transaction only (%(commit)s is
#   'off' with ASYNC_COMMIT, else NULL: the server's setting). A session-wide SET would leak to
#   other clients through a transaction pooler; this travels with the statement.
# - It returns how long each job waited since it came due (run_after: enqueue, schedule or
#   retry), in database time, for the job_started signal and the wait metrics.
# - The claimed rows come back as ONE value: a JSON array of one array per job (NULL when nothing
#   was claimed). The client decodes a whole batch with one json.loads instead of twelve typed
#   values per job: with psycopg's pure-Python build that per-value decoding was most of the
#   claim loop's CPU (the payload arrives decoded along with the rest).
# - A paused queue (dbqueue_queue, docs/concepts.md#pausing-a-queue) is left out before its scan
#   runs (one primary key probe per queue, in its own MATERIALIZED CTE: left to itself the
#   planner may run the anti-join after the lateral scan, locking rows of a paused queue).
# - Serial keys (docs/concepts.md): a job with a serial key is a candidate only while no other
#   job of its key is running and no older one (lower id) is pending, so jobs of one key run one
#   at a time in enqueue order, a retrying older job holding back the newer ones. Waiting
#   (workflow) jobs do not count. The test is dbqueue_serial_turn() (migration 0011 says why a
#   function; migration 0016 how it decides): VOLATILE, so it looks with snapshots of its own,
#   newer than this statement's, and a yes holds the key (a transaction-level advisory lock,
#   tried, never waited for) until this claim commits. So a claim sees a job of the key that
#   another claim took and committed, and passes over the key while another claim is deciding
#   it; an older job that became pending after this statement began (a requeue, a workflow
#   release) is seen too. Of two jobs of a key in one batch, the newer sees the older pending;
#   one claim says yes to one job per key. A job without a key (serial_key IS NULL) never calls
#   it; a keyed one probes dbqueue_job_serial_idx (twice when it is its turn). A worker killed
#   mid-job holds its key until the sweeper takes the expired lease back. Cost: the scan passes over the blocked jobs of busy keys on its way to
#   claimable ones, so a long backlog behind one key in a shared queue makes every claim of that
#   queue read it (give such keys their own queue).
# - A keyed job holds its key for the fleet from its claim on, so it is never claimed ahead of a
#   free handler thread: of the candidates, at most %(threads)s keyed ones are taken (the rest
#   of the batch, the prefetch, is unkeyed); the worker hands them to its threads first, so each
#   starts at once instead of waiting in its buffer behind prefetched jobs while the key's other
#   jobs and the other workers wait for it. With no free thread the scan leaves keyed jobs out
#   (unlocked, their turn never tested); otherwise the keyed candidates left out stay pending,
#   locked only until this statement's transaction ends. The batch says which jobs are keyed
#   (the last element), because the end of one may make its key's next job claimable, which no
#   notification says, and because a batch that this rule may have cut short (as many keyed jobs
#   as free threads, or no free thread) must not be mistaken for an empty queue. (A UNION ALL
#   rather than a window over the candidates: measured cheaper, ~5% of a claim; a count of the
#   candidates cost as much again, so the worker infers the cut instead.)
# Planned once per session (PLANNED_ONCE): its plan does not depend on the values (the claim
# index for each queue, the primary key for the update).
CLAIM_JOBS = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      COALESCE(%(commit)s, current_setting('synchronous_commit')), true)
),
claimable AS MATERIALIZED (
    SELECT u.name, u.lim
    FROM unnest(%(queues)s::text[], %(limits)s::int[]) AS u(name, lim)
    WHERE NOT EXISTS (SELECT 1 FROM dbqueue_queue AS p WHERE p.name = u.name AND p.paused)
),
candidates AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_after, c.keyed
    FROM claimable AS q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_after, j.serial_key IS NOT NULL AS keyed
        FROM dbqueue_job AS j
        WHERE j.state = 'pending' AND j.queue = q.name AND j.run_after <= now()
          AND (j.serial_key IS NULL
               OR (%(threads)s > 0 AND dbqueue_serial_turn(j.serial_key, j.id)))
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT q.lim
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_after, c.id
    LIMIT %(limit)s
),
chosen AS MATERIALIZED (
    SELECT c.id FROM candidates AS c WHERE NOT c.keyed
    UNION ALL
    (SELECT c.id FROM candidates AS c WHERE c.keyed
     ORDER BY c.priority DESC, c.run_after, c.id
     LIMIT %(threads)s)
),
claimed AS (
    UPDATE dbqueue_job AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        worker_id = %(worker)s,
        lease_token = %(token)s,
        started_at = now(),
        leased_until = now() + j.lease_seconds * interval '1 second'
    FROM commit_mode
    WHERE j.id = ANY(ARRAY(SELECT id FROM chosen))
    RETURNING j.id, j.type, j.queue, j.payload, j.attempts, j.max_attempts, j.lease_seconds,
              j.idempotency_key, j.priority, j.created_at,
              EXTRACT(EPOCH FROM now() - j.run_after)::float8 AS wait, j.traceparent, j.run_after,
              j.serial_key IS NOT NULL AS keyed
)
SELECT json_agg(json_build_array(id, type, queue, payload, attempts, max_attempts,
                                 lease_seconds, idempotency_key, priority, created_at, wait,
                                 traceparent, keyed)
                ORDER BY priority DESC, run_after, id)::text
FROM claimed
"""

# The claim of a worker with a fleet-wide concurrency or rate limit configured: still one
# statement, around dbqueue_claim_within_limits() (migration 0010 says why it is a function: the
# counts must be read after the limiter locks, with a newer snapshot than this statement's;
# migration 0016 why that name, and why its claims never wait for each other but at the
# limiter rows of (a), in one order). Same columns as CLAIM_JOBS, ``keyed`` included, read by
# the function's own UPDATE (a subquery here read this statement's snapshot, taken before the
# function waited for its lock: a job enqueued meanwhile came back not keyed); after the jobs,
# at most one row with a NULL id that says what held the claim back (see store.claimed_rows).
# Parameters as CLAIM_JOBS, plus per queue its fleet-wide concurrency and rate limit (NULL:
# none) and the limited types with theirs.
CLAIM_LIMITED = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      COALESCE(%(commit)s, current_setting('synchronous_commit')), true)
)
SELECT f.*
FROM commit_mode,
     dbqueue_claim_within_limits(
         %(queues)s::text[], %(limits)s::int[], %(limit)s, %(worker)s, %(token)s,
         %(q_conc)s::int[], %(q_rate_n)s::int[], %(q_rate_period)s::float8[],
         %(q_rate_key)s::text[], %(t_names)s::text[], %(t_conc)s::int[], %(t_rate_n)s::int[],
         %(t_rate_period)s::float8[], %(t_rate_key)s::text[]
     ) AS f
"""

# Batched acknowledgement of successes. Fenced by (id, lease token) and state: a worker whose
# lease expired and whose job was claimed again matches nothing here, so it cannot overwrite the
# new holder's state. The ids it did not match come back missing from RETURNING. Committed like
# the claim (asynchronously with ASYNC_COMMIT: a completion lost in a crash only means the job
# runs again).
# Workflows (docs/workflows.md): the same statement releases the jobs waiting for the ones it
# completes, so "the last dependency is done -> the dependent is pending" commits with the
# completion or not at all, exactly once:
# - The dependents' ids come from the completed rows' own ``dependents`` column, as RETURNING
#   gives it from the newest row version: a completion that waited for the transaction of a
#   workflow adding a dependent to this job (it locks the row) still sees that dependent, which
#   an edge-table read with this statement's snapshot would miss.
# - Each dependent is locked once, in id order, and counts down by the number of its
#   dependencies completed here; two workers completing dependencies of the same jobs take the
#   locks in the same order (no deadlock), and the second one's UPDATE re-reads the row the first
#   one committed, so the counter goes down one completion after the other.
# - A dependent this statement cannot see at all was linked by a workflow whose commit (its
#   deferred trigger, migration 0015) ran while this statement waited for the completed row's
#   lock: its row is newer than this statement's snapshot. A dependent it sees ``cancelled``
#   may be coming back (a requeue of its failed dependency, in flight or committed since this
#   snapshot) and counting the dependency completed here as not done. ``late`` hands both to
#   dbqueue_release_late() (migration 0015), which locks them, waiting or cancelled, and whose
#   next statement sees every commit before that lock: it counts a waiting one's dependencies
#   again (the ones completed here counted as done). A requeue that comes after the lock sees
#   this completion committed. Dependents seen waiting are counted down here, under their lock,
#   and those seen in any other state (pending, running, finished) need nothing.
# - A job outside a workflow has no dependents (NULL): the CTEs after ``completed`` see no row,
#   and the function is not called.
# Cancelling (docs/concepts.md): a job whose cancel was asked for while it ran carries
# cancel_requested_at, and its success ends it ``cancelled`` with the result kept. One CASE on a
# column that is NULL for every other job, in the same statement, so the completion of an
# unmarked job costs what it did. Its dependents are not counted down here (``done`` is false):
# the workflow trigger of migration 0009 fires for its new state and cancels them (or releases
# those whose edge says run_on_failure), like for any other cancelled job.
# The result is one row (one value each to decode, as the claim's): the ids made done as a JSON
# array, the ids ended cancelled as a JSON object id -> who cancelled it ('' when nobody is
# recorded), NULL for none, and how many queues were woken.
# Planned once per session (PLANNED_ONCE). The states it matches, 'running' and 'waiting', are
# parameters so that a plan made without the values cannot use dbqueue_job_lease_idx or
# dbqueue_job_waiting_idx, partial indexes on those states: statistics taken while few jobs ran
# (or none waited) rate such an index at one row, and a plan made then would walk every running
# job for each completed one (every waiting job for each batch that releases a dependent) until
# the table is next analyzed (PostgreSQL plans it again then; autovacuum analyzes once a tenth
# of the rows changed, by default). The primary key, one probe per id, is the plan at every size
# (tests/integration/test_plans.py); the trigger's and dbqueue_release_late()'s statements,
# planned under the same mode, match theirs the same way (migration 0013).
COMPLETE_JOBS = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      COALESCE(%(commit)s, current_setting('synchronous_commit')), true)
),
completed AS (
    UPDATE dbqueue_job AS j
    SET state = CASE WHEN j.cancel_requested_at IS NULL THEN 'done' ELSE 'cancelled' END,
        finished_at = now(), leased_until = NULL, result = c.result::jsonb
    FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::text[])
             AS c(id, token, result),
         commit_mode
    WHERE j.id = c.id AND j.lease_token = c.token AND j.state = %(running)s
    RETURNING j.id, j.dependents, j.cancel_requested_at IS NULL AS done, j.cancelled_by
),
counts AS MATERIALIZED (
    SELECT d.id, count(*) AS n
    FROM completed AS c CROSS JOIN LATERAL unnest(c.dependents) AS d(id)
    WHERE c.done
    GROUP BY d.id
),
locked AS MATERIALIZED (
    SELECT j.id FROM dbqueue_job AS j
    WHERE j.id IN (SELECT id FROM counts) AND j.state = %(waiting)s
    ORDER BY j.id
    FOR NO KEY UPDATE
),
released AS (
    UPDATE dbqueue_job AS d
    SET waiting_on = d.waiting_on - n.n,
        state = CASE WHEN d.waiting_on = n.n THEN 'pending' ELSE 'waiting' END,
        run_after = CASE WHEN d.waiting_on = n.n THEN GREATEST(d.run_after, now())
                         ELSE d.run_after END
    FROM counts AS n
    WHERE d.id = n.id AND d.id IN (SELECT id FROM locked) AND d.state = %(waiting)s
    RETURNING d.queue, d.state
),
late AS (
    SELECT f.queue
    FROM (
        SELECT array_agg(c.id) AS ids FROM counts AS c
        WHERE NOT EXISTS (SELECT 1 FROM dbqueue_job AS v
                          WHERE v.id = c.id AND v.state <> 'cancelled')
    ) AS unseen
    CROSS JOIN LATERAL dbqueue_release_late(unseen.ids, ARRAY(SELECT id FROM completed
                                                              WHERE done)) AS f(queue)
    WHERE unseen.ids IS NOT NULL
)
SELECT (SELECT json_agg(id) FROM completed WHERE done)::text,
       (SELECT json_object_agg(id, COALESCE(cancelled_by, '')) FROM completed WHERE NOT done)::text,
       (SELECT count(pg_notify(%(channel)s, queue))
        FROM (SELECT queue FROM released WHERE state = 'pending' UNION SELECT queue FROM late)
             AS woken)
"""

# One failure: back to pending after a delay, or dead when the attempts are spent or the handler
# asked for no retry. Fenced like COMPLETE_JOBS. The error entry gets its time from the database.
# A job whose cancel was asked for while it ran ends cancelled instead, its error kept: a
# cancelled job is neither retried nor a dead letter (docs/concepts.md).
FAIL_JOB = """
UPDATE dbqueue_job
SET state = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN %(dead)s OR attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN cancel_requested_at IS NOT NULL OR %(dead)s
                            OR attempts >= max_attempts THEN now() END,
    run_after = CASE WHEN cancel_requested_at IS NOT NULL OR %(dead)s OR attempts >= max_attempts
                     THEN run_after ELSE now() + %(delay)s * interval '1 second' END,
    leased_until = NULL,
    errors = errors || jsonb_build_array(%(error)s::jsonb || jsonb_build_object('at', now()))
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
RETURNING state, run_after, cancelled_by
"""

# A run that stopped because it was cancelled: the handler raised JobCancelled (through
# ctx.raise_if_cancelled() or of its own accord: then "handler" is recorded as who cancelled
# it), an async handler's task was cancelled, or the worker learned of the cancel before the
# run started and never started it. Fenced like the rest; durable like a failure.
END_CANCELLED = """
UPDATE dbqueue_job
SET state = 'cancelled', finished_at = now(), leased_until = NULL,
    cancel_requested_at = COALESCE(cancel_requested_at, now()),
    cancelled_by = COALESCE(cancelled_by, %(by)s)
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
RETURNING state, cancelled_by
"""

# A claimed job whose type this worker has no handler for. During a rolling deploy a worker still
# on the old code can claim a job of a type only the new code knows: it goes back to pending
# without spending the attempt, after %(delay)s seconds, for a worker that knows it. A job that
# has existed for longer than %(grace)s seconds is not waiting for a deploy (its handler was
# removed or renamed): it is dead at once. Either way the error is recorded.
# A job whose cancel was asked for meanwhile ends cancelled.
DEFER_UNKNOWN_TYPE = """
UPDATE dbqueue_job
SET state = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN created_at < now() - %(grace)s * interval '1 second'
                 THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN cancel_requested_at IS NOT NULL
                            OR created_at < now() - %(grace)s * interval '1 second' THEN now() END,
    attempts = CASE WHEN cancel_requested_at IS NOT NULL
                         OR created_at < now() - %(grace)s * interval '1 second'
                    THEN attempts ELSE attempts - 1 END,
    run_after = CASE WHEN cancel_requested_at IS NOT NULL
                          OR created_at < now() - %(grace)s * interval '1 second' THEN run_after
                     ELSE now() + %(delay)s * interval '1 second' END,
    leased_until = NULL,
    errors = errors || jsonb_build_array(%(error)s::jsonb || jsonb_build_object('at', now()))
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
RETURNING state, run_after
"""

# What became of jobs a write did not match: a retried acknowledgement whose first try committed
# but whose reply was lost matches nothing the second time. The token tells whether the row's
# last write was this run's own (the sweeper and releases clear it).
READ_BACK_JOBS = """
SELECT id, state, lease_token FROM dbqueue_job WHERE id = ANY(%(ids)s::bigint[])
"""

# Heartbeat: push the lease of every job this worker still runs forward by the job's lease.
# Fenced; a job missing from RETURNING was taken back by the sweeper and belongs to someone else.
# Each row also says whether a cancel was asked for: the heartbeat is the backstop that tells
# the worker within one HEARTBEAT_INTERVAL when the cancel notification was missed, at no extra
# round trip.
EXTEND_LEASES = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      COALESCE(%(commit)s, current_setting('synchronous_commit')), true)
)
UPDATE dbqueue_job AS j
SET leased_until = now() + j.lease_seconds * interval '1 second'
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS h(id, token), commit_mode
WHERE j.id = h.id AND j.lease_token = h.token AND j.state = 'running'
RETURNING j.id, j.cancel_requested_at IS NOT NULL
"""

# Graceful shutdown: hand jobs that never finished back without spending the attempt the claim
# took. Fenced like the rest. A job whose cancel was asked for is not handed back: it ends
# cancelled (the SET expressions read the row's old values).
RELEASE_JOBS = """
UPDATE dbqueue_job AS j
SET state = CASE WHEN j.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
    attempts = CASE WHEN j.cancel_requested_at IS NULL THEN j.attempts - 1 ELSE j.attempts END,
    finished_at = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE now() END,
    leased_until = NULL,
    worker_id = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE j.worker_id END,
    lease_token = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE j.lease_token END
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS r(id, token)
WHERE j.id = r.id AND j.lease_token = r.token AND j.state = 'running'
RETURNING j.id, j.state
"""

# After a lost connection: a claim can commit while its reply is lost, which leaves jobs running
# under this worker that it never heard of (they would sit out their lease and spend an attempt
# that never ran). Hand back every job this worker holds except those it knows. Served by the
# partial index on running jobs. A job whose cancel was asked for ends cancelled instead.
RELEASE_UNKNOWN_JOBS = """
UPDATE dbqueue_job
SET state = CASE WHEN cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
    attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END,
    finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE now() END,
    leased_until = NULL, worker_id = NULL, lease_token = NULL
WHERE state = 'running' AND worker_id = %(worker)s
  AND NOT (lease_token = ANY(%(known)s::bigint[]))
RETURNING id
"""

# The backend of a session, taken when it connects: its pid and start (a pid alone may be reused
# by a later backend). Read again after a lost connection (TERMINATE_LOST_BACKEND).
SESSION_BACKEND = """
SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
"""

# After a lost connection, before RELEASE_UNKNOWN_JOBS: end the session's old backend and wait
# until it is gone. The client side may be gone while the backend still runs the last statement
# (waiting on a lock, or for its commit): a claim it commits after the release has looked is
# never released, and its jobs sit out their lease and spend an attempt. Once that backend is
# gone, its transaction has committed or rolled back, and the release's snapshot sees which.
# No row: it is gone already. A false: still there after the wait (try again).
TERMINATE_LOST_BACKEND = """
SELECT pg_terminate_backend(pid, %(wait_ms)s) FROM pg_stat_activity
WHERE pid = %(pid)s AND backend_start = %(started)s
"""

# The sweeper: jobs whose lease ran out (their worker died or hung) go back to pending, after the
# default backoff with full jitter, or to dead when their attempts are spent. The attempt that
# expired counts and is recorded as an error. (The exponent is clamped so power() cannot overflow.) Bounded, and SKIP LOCKED so several workers sweeping
# at once split the work instead of queueing behind each other. A job whose cancel was asked
# for (its worker died before it learned, or before it wrote the end) ends cancelled.
# A django.tasks job also returns its task's path, for the name it is logged under.
RESCUE_EXPIRED = """
WITH expired AS MATERIALIZED (
    SELECT id FROM dbqueue_job
    WHERE state = 'running' AND leased_until < now()
    ORDER BY leased_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE dbqueue_job AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                            OR j.attempts >= j.max_attempts THEN now() END,
    run_after = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempts >= j.max_attempts
                     THEN j.run_after
                     ELSE now() + random() * LEAST(%(cap)s, %(base)s * power(%(factor)s,
                                                   LEAST(GREATEST(j.attempts - 1, 0), 50)))
                                  * interval '1 second' END,
    leased_until = NULL,
    lease_token = NULL,
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
RETURNING j.id, j.type, j.attempts, j.state, j.worker_id, j.queue, j.cancelled_by,
          CASE WHEN j.type = 'django.tasks' AND jsonb_typeof(j.payload -> 'task') = 'string'
               THEN j.payload ->> 'task' END
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
    WHERE dbqueue_delivery.state = 'failed'
RETURNING id, (extract(epoch FROM updated_at) * 1000000)::bigint
"""

SELECT_DELIVERY = """
SELECT id, state, provider_reference, error, job_id, attempt, created_at, updated_at
FROM dbqueue_delivery WHERE key = %(key)s
"""

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
WHERE key = %(key)s AND state = 'recorded'
  AND (%(holder)s::boolean IS NOT TRUE
       OR (job_id IS NOT DISTINCT FROM %(job_id)s::bigint AND attempt = %(attempt)s::int
           AND (%(recorded_at)s::bigint IS NULL
                OR (extract(epoch FROM updated_at) * 1000000)::bigint = %(recorded_at)s::bigint)))
RETURNING id
"""

# A person settles unconfirmed deliveries from the admin: only 'recorded' rows move, so a record
# that its job settled meanwhile keeps the job's word.
SETTLE_DELIVERIES_BY_ID = """
UPDATE dbqueue_delivery
SET state = %(state)s, error = %(error)s,
    updated_at = GREATEST(now(), updated_at + interval '1 microsecond')
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'recorded'
RETURNING id
"""

# Operator actions -------------------------------------------------------------------------------
# Each takes explicit ids and moves only the rows whose state allows it; the caller reports how
# many moved and how many were left alone. Requeue and run-now return each job's queue, for the
# wake-up their callers send after the commit (NOTIFY_WORKERS).

# Dead or cancelled -> pending, attempts reset. The error history stays: it is the record of
# what went wrong, and the next failures are appended after it. A "Requeued" entry marks where
# the history starts again at attempt 1 (SET reads the row's old state and attempts); it has
# the shape of an error entry, so that everything listing errors shows it as it is. The cancel
# mark goes (a pending job carries none); who cancelled it stays in that entry's message.
#
# Unique keys: a requeued job would take its unique key again if it is "active" or never
# started. It is left alone (its key is reported by REQUEUE_BLOCKED_BY_UNIQUE) when another job
# holds the key now, or when a newer job of the same selection with the same key is requeued in
# its place: two live jobs with one key would break the promise, and clearing the key would run
# a duplicate silently. A holder enqueued concurrently can still make the unique index refuse the
# UPDATE; store.requeue() then tries again, and this test sees the holder.
REQUEUE_JOBS = (
    """
UPDATE dbqueue_job AS j
SET state = 'pending', attempts = 0, run_after = now(), finished_at = NULL,
    leased_until = NULL, worker_id = NULL, cancel_requested_at = NULL, cancelled_by = NULL,
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempts,
        'class', 'Requeued',
        'message', 'requeued from ' || state
                   || COALESCE(' (cancelled by ' || cancelled_by || ')', '')
                   || ' after ' || attempts || ' attempt(s); attempts start again at 1',
        'traceback', '',
        'worker', NULL,
        'requeued', true,
        'at', now()))
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state IN ('dead', 'cancelled')
  AND (j.unique_key IS NULL OR NOT (j.unique_while = 'active' OR j.started_at IS NULL)
       OR (NOT EXISTS (SELECT 1 FROM dbqueue_job AS o
                       WHERE o.unique_key = j.unique_key AND """
    + _unique_held("o.")
    + """)
           AND NOT EXISTS (SELECT 1 FROM dbqueue_job AS p
                           WHERE p.id = ANY(%(ids)s::bigint[]) AND p.id > j.id
                             AND p.unique_key = j.unique_key AND p.state IN ('dead', 'cancelled')
                             AND (p.unique_while = 'active' OR p.started_at IS NULL))))
RETURNING j.id, j.queue
"""
)

# Which of these dead or cancelled jobs a requeue left alone because another job holds their
# unique key now: (id, key, holder id, holder state), for the operator's message.
REQUEUE_BLOCKED_BY_UNIQUE = (
    """
SELECT j.id, j.unique_key, o.id, o.state
FROM dbqueue_job AS j JOIN dbqueue_job AS o
  ON o.unique_key = j.unique_key AND o.id <> j.id AND """
    + _unique_held("o.")
    + """
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state IN ('dead', 'cancelled')
  AND j.unique_key IS NOT NULL
ORDER BY j.id
"""
)

# Pending but scheduled for later -> due now.
RUN_JOBS_NOW = """
UPDATE dbqueue_job SET run_after = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending' AND run_after > now()
RETURNING id, queue
"""

# cancel(): pending or waiting -> cancelled at once; running -> marked (cancel_requested_at),
# and it stays running: its handler is under way, on a worker that learns of the mark from the
# cancel notification (sent after the commit, wakeup.jobs_cancelled) or its next heartbeat,
# and whatever the run's outcome, the write that ends it ends it cancelled (COMPLETE_JOBS,
# FAIL_JOB, END_CANCELLED, RESCUE_EXPIRED, the releases). Marking again keeps the first request
# and its author. The workflow trigger cancels the jobs waiting for a cancelled one
# (docs/workflows.md); a running job's dependents wait for its end.
# A running job is not written here: this statement writes a row of dbqueue_cancel_at_commit,
# whose deferred trigger (migration 0015) marks the job at the caller's COMMIT, so the caller's
# transaction holds the running row's lock for its commit only (held from here, it stopped the
# job's worker: its heartbeat, completion and claims wait for it). The same goes for a job this
# statement saw pending or waiting and that a worker claimed meanwhile (the UPDATE re-reads it
# and leaves it). At the commit the trigger marks it if it still runs, cancels it if it waits
# again (a retry), and leaves it if it finished meanwhile. An id missing from the result is
# unknown.
CANCEL_JOBS = """
WITH moved AS (
    UPDATE dbqueue_job AS j
    SET state = 'cancelled', finished_at = now(), waiting_on = 0,
        cancel_requested_at = now(), cancelled_by = %(by)s
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state IN ('pending', 'waiting')
    RETURNING j.id
),
requested AS (
    INSERT INTO dbqueue_cancel_at_commit (job_id, cancelled_by)
    SELECT j.id, %(by)s FROM dbqueue_job AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state IN ('pending', 'waiting', 'running')
      AND j.id NOT IN (SELECT id FROM moved)
    ORDER BY j.id
    RETURNING job_id
)
SELECT id, 'cancelled' FROM moved
UNION ALL
SELECT job_id, 'running' FROM requested
UNION ALL
SELECT id, 'finished' FROM dbqueue_job
WHERE id = ANY(%(ids)s::bigint[]) AND id NOT IN (SELECT id FROM moved)
  AND id NOT IN (SELECT job_id FROM requested)
"""

# Deletes finished jobs (done, dead, cancelled) only: the state test sits in the DELETE itself,
# so a job requeued since it was selected is left alone. A deleted job's own dependency edges go
# with it (one index probe per job; a job that others depended on keeps its edges until those
# are deleted, so they can still read its result while it exists). Delivery records keep the job's id (no
# foreign key in the database), as they do when retention prunes a job.
DELETE_FINISHED_JOBS = """
WITH deleted AS (
    DELETE FROM dbqueue_job
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('done', 'dead', 'cancelled')
    RETURNING id
),
edges AS (
    DELETE FROM dbqueue_dependency WHERE job_id IN (SELECT id FROM deleted) RETURNING 1
)
SELECT id FROM deleted
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
# The workflow edges of a deleted job go with it (see DELETE_FINISHED_JOBS).
PRUNE_FINISHED = """
WITH deleted AS (
    DELETE FROM dbqueue_job
    WHERE id IN (
        SELECT id FROM dbqueue_job
        WHERE state = %(state)s AND finished_at < now() - %(age)s * interval '1 second'
        ORDER BY finished_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id
),
edges AS (
    DELETE FROM dbqueue_dependency WHERE job_id IN (SELECT id FROM deleted) RETURNING 1
)
SELECT count(*) FROM deleted
"""

# Status --------------------------------------------------------------------------------------------
# Counts per queue and state of the live states (pending, waiting, running, dead), the oldest due pending
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
UNION ALL
SELECT queue, 'waiting', count(*), 0, NULL, 0
FROM dbqueue_job WHERE state = 'waiting' GROUP BY queue
ORDER BY 1, 2
"""

# Flow control ----------------------------------------------------------------------------------
# Pause or resume a queue for the whole fleet: the claims read dbqueue_queue (CLAIM_JOBS,
# dbqueue_claim_within_limits). A resume also wakes the queue's workers, in the same transaction
# (delivered at its commit; an operator action, not a hot path): payload "<count>:<queue>" as
# wakeup.payload builds it, counting the due jobs up to a bound, so a group wakes as many
# workers as there are jobs.
PAUSE_QUEUE = """
INSERT INTO dbqueue_queue (name, paused, changed_at, changed_by)
VALUES (%(name)s, true, now(), %(by)s)
ON CONFLICT (name) DO UPDATE
    SET paused = true, changed_at = now(), changed_by = EXCLUDED.changed_by
RETURNING paused
"""

RESUME_QUEUE = """
WITH resumed AS (
    INSERT INTO dbqueue_queue (name, paused, changed_at, changed_by)
    VALUES (%(name)s, false, now(), %(by)s)
    ON CONFLICT (name) DO UPDATE
        SET paused = false, changed_at = now(), changed_by = EXCLUDED.changed_by
    RETURNING name
)
SELECT pg_notify(%(channel)s, (
           SELECT count(*) FROM (SELECT 1 FROM dbqueue_job
                                 WHERE state = 'pending' AND queue = %(name)s
                                   AND run_after <= now() LIMIT 1000) AS due
       ) || ':' || name)
FROM resumed
"""

# The admin's queue page lists a row per configured queue: create the missing ones, unpaused.
ENSURE_QUEUES = """
INSERT INTO dbqueue_queue (name, paused, changed_by)
SELECT name, false, '' FROM unnest(%(names)s::text[]) AS name
ON CONFLICT (name) DO NOTHING
"""

# What the status command and the admin show of each queue's flow: paused or not (with who and
# when), jobs running now, and per limiter row its rate window (starts in the period, and
# when the oldest of them leaves it: RATE_WINDOW). Small tables and the running partial index.
FLOW_STATE = """
SELECT 'queue', q.name, q.paused::int, q.changed_at, q.changed_by, NULL::float8
FROM dbqueue_queue AS q
UNION ALL
SELECT 'running-queue', queue, count(*)::int, NULL, NULL, NULL
FROM dbqueue_job WHERE state = 'running' GROUP BY queue
UNION ALL
SELECT 'running-type', type, count(*)::int, NULL, NULL, NULL
FROM dbqueue_job WHERE state = 'running' GROUP BY type
"""

# One rate window: the starts within %(period)s seconds and when the window has room again
# (NULL when it has room now). Served by the limiter's unique key.
RATE_WINDOW = """
SELECT x.room, x.reopen
FROM dbqueue_limiter AS l, dbqueue_rate_room(l.starts, %(limit)s, %(period)s) AS x
WHERE l.scope = %(scope)s AND l.name = %(name)s AND l.part = %(part)s
"""

# Metrics ---------------------------------------------------------------------------------------
# Every gauge of the table in one statement, as (kind, name, label, value) rows: per queue the due,
# scheduled, waiting (on workflow dependencies), running, stuck and dead jobs and the oldest due
# job's age; per worker in the registry (dbqueue_worker, unexpired) the jobs it holds and the
# seconds since its last heartbeat; per queue and host the workers serving it that are not
# stale; the unconfirmed delivery records. Like
# STATUS_COUNTS, each part reads one state through that state's partial index (claim, lease,
# dead-per-queue, unconfirmed deliveries), never the finished rows, so the cost follows the live
# backlog and not the history. Done, sent and failed rows are left out for that reason: counting
# them would scan what retention keeps; the workers' counters say how many finished. Paused
# queues (a few rows of dbqueue_queue) give the seconds since each was paused.
METRICS_SNAPSHOT = """
SELECT 'queue', p.queue, v.label, v.value
FROM (
    SELECT queue,
           count(*) FILTER (WHERE run_after <= now()) AS due,
           count(*) FILTER (WHERE run_after > now()) AS scheduled,
           EXTRACT(EPOCH FROM now() - min(run_after) FILTER (WHERE run_after <= now())) AS oldest
    FROM dbqueue_job WHERE state = 'pending' GROUP BY queue
) AS p
CROSS JOIN LATERAL (VALUES ('due', p.due::float8), ('scheduled', p.scheduled::float8),
                           ('oldest_due_seconds', p.oldest::float8)) AS v(label, value)
UNION ALL
SELECT 'queue', r.queue, v.label, v.value
FROM (
    SELECT queue, count(*) AS running, count(*) FILTER (WHERE leased_until < now()) AS stuck
    FROM dbqueue_job WHERE state = 'running' GROUP BY queue
) AS r
CROSS JOIN LATERAL (VALUES ('running', r.running::float8), ('stuck', r.stuck::float8))
    AS v(label, value)
UNION ALL
SELECT 'queue', queue, 'dead', count(*)::float8 FROM dbqueue_job WHERE state = 'dead' GROUP BY queue
UNION ALL
SELECT 'queue', queue, 'waiting', count(*)::float8
FROM dbqueue_job WHERE state = 'waiting' GROUP BY queue
UNION ALL
SELECT 'worker', w.worker_id, v.label, v.value
FROM (
    SELECT w.worker_id, COALESCE(r.jobs, 0) AS jobs,
           EXTRACT(EPOCH FROM now() - w.heartbeat_at) AS heartbeat_age
    FROM dbqueue_worker AS w
    LEFT JOIN (SELECT worker_id, count(*) AS jobs FROM dbqueue_job WHERE state = 'running'
               GROUP BY worker_id) AS r ON r.worker_id = w.worker_id
    WHERE w.expires_at > now()
) AS w
CROSS JOIN LATERAL (VALUES ('jobs', w.jobs::float8), ('heartbeat_age_seconds',
                                                       w.heartbeat_age::float8)) AS v(label, value)
UNION ALL
SELECT 'workers', q.queue, w.host, (count(*) FILTER (WHERE w.stale_at > now()))::float8
FROM dbqueue_worker AS w CROSS JOIN LATERAL unnest(w.queues) AS q(queue)
WHERE w.expires_at > now()
GROUP BY q.queue, w.host
UNION ALL
SELECT 'delivery', 'recorded', 'count', count(*)::float8
FROM dbqueue_delivery WHERE state = 'recorded'
UNION ALL
SELECT 'queue', name, 'paused_seconds',
       GREATEST(EXTRACT(EPOCH FROM now() - COALESCE(changed_at, now())), 0)::float8
FROM dbqueue_queue WHERE paused
"""

# The worker registry (presence.py) -----------------------------------------------------------

# A worker says it is alive: once at start, then once per HEARTBEAT_INTERVAL, on its own
# connection (no extra connection, no session state: fine behind PgBouncer in transaction
# mode). Its own row only, so it never waits on another worker; it waits only on a sweep
# deleting its expired row, which it then inserts again. Written like the heartbeat, with the
# worker's commit mode: losing the last one in a crash costs nothing, the next one rewrites it.
# started_at is kept from the first insert. The deadlines are database time, as the readers
# compare them with now().
ANNOUNCE_WORKER = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      COALESCE(%(commit)s, current_setting('synchronous_commit')), true)
)
INSERT INTO dbqueue_worker AS w (worker_id, host, pid, version, queues, concurrency, execution,
                                 group_pid, state, started_at, heartbeat_at, stale_at,
                                 expires_at, running)
SELECT %(worker)s, %(host)s, %(pid)s, %(version)s, %(queues)s::text[], %(concurrency)s,
       %(execution)s, %(group_pid)s, %(state)s, now(), now(),
       now() + %(stale)s * interval '1 second', now() + %(expire)s * interval '1 second',
       %(running)s
FROM commit_mode
ON CONFLICT (worker_id) DO UPDATE
SET state = EXCLUDED.state, heartbeat_at = now(), stale_at = EXCLUDED.stale_at,
    expires_at = EXCLUDED.expires_at, running = EXCLUDED.running
RETURNING w.started_at
"""

# A clean stop: the worker is gone at once.
WITHDRAW_WORKER = "DELETE FROM dbqueue_worker WHERE worker_id = %(worker)s RETURNING worker_id"

# The sweeper: rows of workers that stopped beating (kill -9, a lost host) past their expiry.
# Every listing already hides them (LIVE_WORKERS); this only keeps the table small. Several
# sweepers at once delete the same few rows; the loser finds them gone, which is harmless. The
# expiry test is the DELETE's own WHERE, so a row that its worker's heartbeat refreshed while
# this waited for its lock is re-checked in its new version and kept (a test of it in a
# subquery or CTE would read the old version and delete a live worker's row:
# tests/integration/test_worker_registry.py).
FORGET_EXPIRED_WORKERS = (
    "DELETE FROM dbqueue_worker WHERE expires_at < now() RETURNING worker_id, heartbeat_at"
)

# The registry as shown by jobqueue_status, the admin and the metrics: unexpired rows, each with
# whether it is stale, the seconds since its last heartbeat, and the jobs the job table says it
# runs now (the running rows counted by worker_id, one pass over the running jobs' partial
# index).
LIVE_WORKERS = """
SELECT w.worker_id, w.host, w.pid, w.version, w.queues, w.concurrency, w.execution, w.group_pid,
       w.state, w.started_at, w.heartbeat_at, w.stale_at < now(),
       EXTRACT(EPOCH FROM now() - w.heartbeat_at)::float8, w.running, COALESCE(r.jobs, 0)
FROM dbqueue_worker AS w
LEFT JOIN (SELECT worker_id, count(*) AS jobs FROM dbqueue_job WHERE state = 'running'
           GROUP BY worker_id) AS r ON r.worker_id = w.worker_id
WHERE w.expires_at > now()
ORDER BY w.host, w.started_at, w.worker_id
LIMIT %(limit)s
"""

# Scheduler -------------------------------------------------------------------------------------
# Two kinds of entry: DBQUEUE["SCHEDULE"]'s, whose state is a row of dbqueue_schedule by name, and
# stored ones, whose definition and state share a row of dbqueue_schedule_entry (so that a worker
# that locks the row to tick it reads the definition in force, and an edit that locks it first
# is waited for: see schedule_entries.py).

# First sight of a settings entry: it starts from now (no tick before the fleet knew it).
ENSURE_SCHEDULE = """
INSERT INTO dbqueue_schedule (name, last_tick, updated_at) VALUES (%(name)s, now(), now())
ON CONFLICT (name) DO NOTHING
"""

# One worker at a time ticks an entry: the others skip the locked row instead of waiting, and the
# tick's idempotency key still makes one job should two ever compute the same tick.
LOCK_SCHEDULE = """
SELECT last_tick, now() FROM dbqueue_schedule WHERE name = %(name)s FOR UPDATE SKIP LOCKED
"""

# last_enqueued: the tick of the newest job enqueued (NULL: this pass enqueued none, keep it).
ADVANCE_SCHEDULE = """
UPDATE dbqueue_schedule
SET last_tick = %(tick)s, last_enqueued = COALESCE(%(enqueued)s, last_enqueued), updated_at = now()
WHERE name = %(name)s
"""

_ENTRY_COLUMNS = """e.id, e.name, e.last_tick, e.job_type, e.cron, e.every, e.timezone,
       e.payload::text, e.queue, e.priority, e.catch_up, e.catch_up_window, e.misfire_grace"""

# A scheduler pass reads everything in one plain statement (no lock, no transaction id): the
# settings entries' states (always one row at least, the LEFT JOIN, so that the caller gets the
# database's now() too; id NULL) and the enabled stored entries with their definitions.
SCHEDULE_STATE = f"""
SELECT NULL::bigint, s.name, s.last_tick, NULL::text, NULL::text, NULL::float8, NULL::text,
       NULL::text, NULL::text, NULL::smallint, NULL::text, NULL::float8, NULL::float8, n.now
FROM (SELECT now() AS now) AS n LEFT JOIN dbqueue_schedule AS s ON true
UNION ALL
SELECT {_ENTRY_COLUMNS}, now()
FROM dbqueue_schedule_entry AS e WHERE e.enabled
"""

# A stored entry that came due, locked to tick it, like LOCK_SCHEDULE. FOR UPDATE returns the
# row's newest committed version (an edit committed after the pass's read is seen here), and
# re-checks "enabled" on it: an entry disabled meanwhile returns nothing. A row an edit holds is
# skipped: the edit enqueues what came due under the old definition itself.
LOCK_SCHEDULE_ENTRY = f"""
SELECT {_ENTRY_COLUMNS}, now()
FROM dbqueue_schedule_entry AS e WHERE e.id = %(id)s AND e.enabled FOR UPDATE SKIP LOCKED
"""

# An edit locks the row and waits for a worker that is ticking it (which then committed the ticks
# it enqueued: the edit reads the newest last_tick). Its instant is statement_timestamp(), not
# now(): a transaction that began before that worker's would otherwise settle up to a moment
# the worker already passed.
LOCK_SCHEDULE_ENTRY_FOR_EDIT = f"""
SELECT {_ENTRY_COLUMNS}, statement_timestamp(), e.enabled
FROM dbqueue_schedule_entry AS e WHERE e.id = %(id)s FOR UPDATE
"""

ADVANCE_SCHEDULE_ENTRY = """
UPDATE dbqueue_schedule_entry
SET last_tick = %(tick)s, last_enqueued = COALESCE(%(enqueued)s, last_enqueued)
WHERE id = %(id)s
"""

# For the status command and the admin: every settings entry's state.
SCHEDULE_STATUS = """
SELECT s.name, s.last_tick, s.last_enqueued, n.now
FROM (SELECT now() AS now) AS n LEFT JOIN dbqueue_schedule AS s ON true
"""

# Schema -------------------------------------------------------------------------------------------

# Which of the package's tables the database lacks (never migrated, or migrated elsewhere):
# to_regclass() is NULL for a name that resolves to no relation on the search path.
MISSING_TABLES = """
SELECT name FROM unnest(%(tables)s::text[]) AS name WHERE to_regclass(name) IS NULL
"""

# Which migrations of an app the database recorded as applied (Django's own table): asked only
# after a statement failed on a missing column or function, to name the migrations to apply.
APPLIED_MIGRATIONS = """
SELECT name FROM django_migrations WHERE app = %(app)s
"""

# django.tasks ------------------------------------------------------------------------------------

# A task's result is its job row; the type check keeps a result id from reading other jobs.
SELECT_TASK_RESULT = """
SELECT payload::text, state, created_at, started_at, finished_at, errors::text, result::text,
       worker_id, priority, queue
FROM dbqueue_job WHERE id = %(id)s AND type = %(type)s
"""

# Dashboard ---------------------------------------------------------------------------------------
# The name a job is shown and counted under (names.py): its type, or for a ``django.tasks`` job
# the path of its task as stored in the payload (text only: nothing is resolved or imported),
# cut to the 200 characters of a type. ``j`` is the job row.
JOB_NAME_SQL = """CASE WHEN j.type = 'django.tasks' AND jsonb_typeof(j.payload -> 'task') = 'string'
     THEN left(j.payload ->> 'task', 200) ELSE j.type END"""

# The failed attempts of the jobs that may have failed since %(from)s, one row per error entry,
# at the time it failed: (queue, name, at). An entry's "at" is the database's now() when it was
# written (FAIL_JOB, DEFER_UNKNOWN_TYPE, RESCUE_EXPIRED); an entry without one (written by
# hand) counts at the job's finish. The "Requeued" marker (REQUEUE_JOBS) is not a failed
# attempt. A job that failed at or after %(from)s is now, whatever happened to it since:
# - finished (done, dead or cancelled) at or after %(from)s: dbqueue_job_finished_idx;
# - pending with run_after at or after %(from)s: a failure, a requeue and a run-now set
#   run_after to now() or later, and a release keeps it; with an error, so that
#   dbqueue_job_retried_idx (pending rows with an error history) serves it, not a pass over
#   every pending row or, worse, a scan of the table;
# - running: few rows, dbqueue_job_lease_idx.
# Only the rows with an error are unpacked.
FAILED_ATTEMPTS_SQL = (
    """
SELECT j.queue, """
    + JOB_NAME_SQL
    + r""" AS type, f.at
FROM (
    SELECT queue, type, payload, errors, finished_at FROM dbqueue_job
    WHERE state IN ('done', 'dead', 'cancelled') AND finished_at >= %(from)s
    UNION ALL
    SELECT queue, type, payload, errors, finished_at FROM dbqueue_job
    WHERE state = 'pending' AND NOT (errors = '[]'::jsonb) AND run_after >= %(from)s
    UNION ALL
    SELECT queue, type, payload, errors, finished_at FROM dbqueue_job WHERE state = 'running'
) AS j
CROSS JOIN LATERAL (
    SELECT CASE WHEN e.value ->> 'at' ~ '^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d'
                THEN (e.value ->> 'at')::timestamptz ELSE j.finished_at END AS at
    FROM jsonb_array_elements(j.errors) AS e
    WHERE jsonb_typeof(e.value) = 'object' AND NOT (e.value ? 'requeued')
) AS f
WHERE j.errors <> '[]'::jsonb AND f.at >= %(from)s"""
)

# The rollup (rollup.py): once a minute one worker samples each queue's depth and counts the jobs
# that finished since the previous sample, per minute, queue and type, into dbqueue_finished, so
# that the dashboard reads a few thousand small rows instead of every finished job, and keeps
# its counts after retention deleted the jobs. One statement, so a crash cannot leave a sample
# without its counts:
# - The NOT EXISTS tests run once (one-time filters): a worker that finds this minute sampled
#   already costs one index probe, not a count of the backlog.
# - Two workers racing for a minute both insert; the unique index makes the second wait for the
#   first and then insert nothing, and "EXISTS (SELECT 1 FROM sample)" stops its counting too.
# - The counted range is [previous sample's minute, this minute): the previous pass counted up to
#   its own minute, exclusive, so ranges chain without overlap. With no sample within
#   %(catch_up)s seconds (a fresh install, or no worker for a day) it starts that far back.
# - Finished rows are read through dbqueue_job_finished_idx (state, finished_at): three range
#   scans of one minute each, in the steady state.
# - The wait of a finished job is its last claim's (started_at - run_after); width_bucket()
#   puts it in a bin of %(bounds)s (seconds), kept as {"bin": count}.
# - Failed attempts are counted once, in the minute each one failed: the error entries whose
#   "at" lies in the counted range (FAILED_ATTEMPTS_SQL), whatever became of the job since (still
#   retrying, running again, requeued, done). Counting a finished job's whole error history at
#   its end counted a requeued job's earlier failures twice, and its "Requeued" marker (not a
#   failed attempt) once more.
# - A django.tasks job is counted under its task's path, as stored (JOB_NAME_SQL).
# ROLLUP_DUE asks first whether the minute is still to do: PostgreSQL JIT-compiles
# ROLLUP_MINUTE's plan (its estimated cost is the backlog's) even when the guards skip every
# scan, which measured ~90 ms a pass against ~1 ms for the probe alone.
ROLLUP_DUE = """
SELECT NOT EXISTS (SELECT 1 FROM dbqueue_depth WHERE minute = date_trunc('minute', now()))
"""

ROLLUP_MINUTE = (
    """
WITH this AS MATERIALIZED (
    SELECT date_trunc('minute', now()) AS minute,
           NOT EXISTS (SELECT 1 FROM dbqueue_depth WHERE minute = date_trunc('minute', now()))
               AS todo
),
previous AS MATERIALIZED (
    SELECT COALESCE(max(d.minute), t.minute - %(catch_up)s * interval '1 second') AS minute
    FROM this AS t LEFT JOIN dbqueue_depth AS d
      ON d.minute < t.minute AND d.minute >= t.minute - %(catch_up)s * interval '1 second'
    WHERE t.todo
    GROUP BY t.minute
),
backlog AS MATERIALIZED (
    SELECT queue, count(*) FILTER (WHERE run_after <= now()) AS due,
           count(*) FILTER (WHERE run_after > now()) AS scheduled, 0 AS running
    FROM dbqueue_job WHERE state = 'pending' AND (SELECT todo FROM this) GROUP BY queue
    UNION ALL
    SELECT queue, 0, 0, count(*)
    FROM dbqueue_job WHERE state = 'running' AND (SELECT todo FROM this) GROUP BY queue
),
sample AS (
    INSERT INTO dbqueue_depth (minute, queue, due, scheduled, running)
    SELECT t.minute, q.queue, COALESCE(sum(b.due), 0), COALESCE(sum(b.scheduled), 0),
           COALESCE(sum(b.running), 0)
    FROM this AS t
    CROSS JOIN (SELECT unnest(%(queues)s::text[]) AS queue UNION SELECT queue FROM backlog) AS q
    LEFT JOIN backlog AS b ON b.queue = q.queue
    WHERE t.todo
    GROUP BY t.minute, q.queue
    ON CONFLICT (minute, queue) DO NOTHING
    RETURNING 1
),
finished AS MATERIALIZED (
    SELECT date_trunc('minute', j.finished_at) AS minute, j.queue, """
    + JOB_NAME_SQL
    + """ AS type,
           width_bucket(EXTRACT(EPOCH FROM j.started_at - j.run_after)::float8,
                        %(bounds)s::float8[]) AS bin,
           count(*) FILTER (WHERE j.state = 'done') AS done,
           count(*) FILTER (WHERE j.state = 'dead') AS dead,
           count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled,
           0 AS failed
    FROM dbqueue_job AS j, this AS t, previous AS p
    WHERE j.state IN ('done', 'dead', 'cancelled')
      AND j.finished_at >= p.minute AND j.finished_at < t.minute
      AND EXISTS (SELECT 1 FROM sample)
    GROUP BY 1, 2, 3, 4
    UNION ALL
    SELECT date_trunc('minute', a.at), a.queue, a.type, NULL, 0, 0, 0, count(*)
    FROM ("""
    + FAILED_ATTEMPTS_SQL.replace("%(from)s", "(SELECT minute FROM previous)")
    + """) AS a, this AS t
    WHERE a.at < t.minute AND EXISTS (SELECT 1 FROM sample)
    GROUP BY 1, 2, 3
),
rolled AS (
    INSERT INTO dbqueue_finished (
        minute, queue, type, done, dead, cancelled, failed_attempts, wait_histogram
    )
    SELECT minute, queue, type, sum(done), sum(dead), sum(cancelled), sum(failed),
           COALESCE(jsonb_object_agg(bin, done + dead) FILTER (WHERE bin IS NOT NULL
                                                              AND done + dead > 0), '{}')
    FROM finished
    GROUP BY minute, queue, type
    ON CONFLICT (minute, queue, type) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM sample), (SELECT count(*) FROM rolled)
"""
)

# The rollup's retention: rows older than the dashboard's longest window (and a margin), oldest
# first, bounded like PRUNE_FINISHED. Served by the unique indexes, which start with the minute.
PRUNE_DEPTH = """
WITH deleted AS (
    DELETE FROM dbqueue_depth WHERE id IN (
        SELECT id FROM dbqueue_depth WHERE minute < now() - %(age)s * interval '1 second'
        ORDER BY minute LIMIT %(limit)s
    )
    RETURNING 1
)
SELECT count(*) FROM deleted
"""

PRUNE_FINISHED_MINUTES = """
WITH deleted AS (
    DELETE FROM dbqueue_finished WHERE id IN (
        SELECT id FROM dbqueue_finished WHERE minute < now() - %(age)s * interval '1 second'
        ORDER BY minute LIMIT %(limit)s
    )
    RETURNING 1
)
SELECT count(*) FROM deleted
"""

# The dashboard's clock: the database's now(), the window's first minute, and the minute up to
# which the rollup has counted finished jobs (the last depth sample's minute; the window's start
# when there is none, so that the dashboard then counts everything from the job table itself).
DASHBOARD_CLOCK = """
SELECT now(), s.since, GREATEST(s.since, (SELECT max(minute) FROM dbqueue_depth
                                          WHERE minute >= s.since))
FROM (SELECT date_trunc('minute', now()) - %(window)s * interval '1 second'
                                        + interval '1 minute' AS since) AS s
"""

# Jobs finished per time bucket and name (JOB_NAME_SQL), and failed attempts in the bucket
# each one failed in (FAILED_ATTEMPTS_SQL): the rollup's minutes before %(split)s, and the job
# table itself from %(split)s on (the minute or so the rollup has not counted yet: a range scan
# of dbqueue_job_finished_idx). Buckets are numbered from %(since)s in steps of %(step)s seconds.
DASHBOARD_FINISHED = (
    """
SELECT floor(EXTRACT(EPOCH FROM r.at - %(since)s) / %(step)s)::int AS bucket, r.type,
       sum(r.done)::bigint, sum(r.dead)::bigint, sum(r.cancelled)::bigint, sum(r.failed)::bigint
FROM (
    SELECT minute AS at, type, done, dead, cancelled, failed_attempts AS failed
    FROM dbqueue_finished
    WHERE minute >= %(since)s AND minute < %(split)s
    UNION ALL
    SELECT j.finished_at, """
    + JOB_NAME_SQL
    + """, (j.state = 'done')::int, (j.state = 'dead')::int,
           (j.state = 'cancelled')::int, 0
    FROM dbqueue_job AS j
    WHERE j.state IN ('done', 'dead', 'cancelled') AND j.finished_at >= %(split)s
    UNION ALL
    SELECT a.at, a.type, 0, 0, 0, 1
    FROM ("""
    + FAILED_ATTEMPTS_SQL.replace("%(from)s", "%(split)s")
    + """) AS a
) AS r
GROUP BY 1, 2
"""
)

# Waits per time bucket as histogram bins (see ROLLUP_MINUTE), from the same two sources.
DASHBOARD_WAITS = """
SELECT floor(EXTRACT(EPOCH FROM r.at - %(since)s) / %(step)s)::int AS bucket, r.bin,
       sum(r.n)::bigint
FROM (
    SELECT f.minute AS at, h.key::int AS bin, h.value::int AS n
    FROM dbqueue_finished AS f CROSS JOIN LATERAL jsonb_each_text(f.wait_histogram) AS h
    WHERE f.minute >= %(since)s AND f.minute < %(split)s
    UNION ALL
    SELECT finished_at,
           width_bucket(EXTRACT(EPOCH FROM started_at - run_after)::float8, %(bounds)s::float8[]),
           1
    FROM dbqueue_job
    WHERE state IN ('done', 'dead') AND finished_at >= %(split)s AND started_at IS NOT NULL
) AS r
GROUP BY 1, 2
"""

# Queue depth per bucket: the largest sample of each queue in it.
DASHBOARD_DEPTH = """
SELECT floor(EXTRACT(EPOCH FROM minute - %(since)s) / %(step)s)::int AS bucket, queue,
       max(due), max(scheduled), max(running)
FROM dbqueue_depth
WHERE minute >= %(since)s
GROUP BY 1, 2
"""

# The workers holding jobs now (an idle worker holds no row, so it is not seen): running rows
# grouped by worker, through dbqueue_job_lease_idx. The last heartbeat is when the worker last
# extended a lease (leased_until - lease, as in METRICS_SNAPSHOT). Bounded by %(limit)s.
DASHBOARD_WORKERS = """
SELECT worker_id, array_agg(DISTINCT queue ORDER BY queue), count(*),
       count(*) FILTER (WHERE leased_until < now()),
       EXTRACT(EPOCH FROM now() - max(leased_until - lease_seconds * interval '1 second'))::float8
FROM dbqueue_job
WHERE state = 'running'
GROUP BY worker_id
ORDER BY worker_id
LIMIT %(limit)s
"""


# The statements a worker's Session runs with a generic plan, made once per connection
# (``plan_cache_mode = force_generic_plan``, connections.Session); every other statement is
# planned for each execution's own values. The two that run for every batch: planning them cost
# more than running them (0.5 and 0.9 ms against 1.3 and 1.0 ms for a batch of 50 in EXPLAIN
# ANALYZE). Each one here has a plan that fits every size of batch and table, which
# tests/integration/test_plans.py checks; a statement added here needs the same.
PLANNED_ONCE = frozenset({CLAIM_JOBS, COMPLETE_JOBS})
