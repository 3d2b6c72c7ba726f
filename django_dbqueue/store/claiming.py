"""The claim: the statement that takes up to a batch of due jobs across a worker's queues
(with or without fleet-wide limits), the rows it returns, the lease token, and the count of
due jobs."""

import datetime
import secrets
from dataclasses import dataclass

from .. import decoding
from ..connections import PlannedOnce
from ..exceptions import UnreadableJob
from ._db import _commit, _execute, claimed_cte, int_array, text_array
from .fair import CLAIM_FAIR, fair_params


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: int
    type: str
    queue: str
    payload: object  # decoded JSON
    attempt: int
    max_attempts: int
    lease_seconds: float
    idempotency_key: str | None
    priority: int
    created_at: object
    wait: float = 0.0  # seconds from run_after (due) to the claim, in database time
    traceparent: str | None = None  # the enqueuer's W3C trace context, if it had one
    keyed: bool = False  # it has a serial key: its end may let its key's next job be claimed
    fair_key: str | None = None  # its fair key, from the fair claim only (store/fair.py)
    fair_pos: int = 0  # its key's place in the fair claim's walk; 0: not a fair queue's


def new_token():
    """A lease token: random, positive, fits PostgreSQL's bigint."""
    return secrets.randbits(63) or 1


def claim(
    using,
    *,
    worker_id,
    queues,
    limits,
    limit,
    token,
    async_commit=False,
    flow=None,
    threads=None,
    fair=None,
    cursors=None,
):
    """Claim up to ``limit`` due jobs from ``queues`` (``limits``: the cap of each queue) under
    lease ``token`` (see :func:`new_token`), at most ``threads`` of them with a serial key.
    ``flow``: the fleet-wide limits (``flow.claim_params``), or ``None`` for the plain claim.
    ``fair``: per queue whether it is fair (``None``: none is), ``cursors`` the last fair key
    served per fair queue (store/fair.py)."""
    statement = claim_statement(
        worker_id=worker_id,
        queues=queues,
        limits=limits,
        limit=limit,
        token=token,
        async_commit=async_commit,
        flow=flow,
        threads=threads,
        fair=fair,
        cursors=cursors,
    )
    return read_claimed(using, _execute(using, *statement), worker_id=worker_id, token=token)


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
#   claim loop's CPU (the payload arrives decoded along with the rest). A reply that will not
#   decode (a row Python cannot read: read_claimed) is read back row by row instead.
# - A paused queue (dbqueue_queue, docs/concepts/flow-control.md#pausing-a-queue) is left out before its scan
#   runs (one primary key probe per queue, in its own MATERIALIZED CTE: left to itself the
#   planner may run the anti-join after the lateral scan, locking rows of a paused queue).
# - Serial keys (docs/concepts/keys.md): a job with a serial key is a candidate only while no other
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
# Planned once per session (connections.PlannedOnce): its plan does not depend on the values
# (the claim index for each queue, the primary key for the update).
CLAIM_JOBS = PlannedOnce(f"""
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit'::text,
                      COALESCE(%(commit)s::text, current_setting('synchronous_commit'::text)),
                      true)
),
claimable AS MATERIALIZED (
    SELECT u.name, u.lim
    FROM ROWS FROM (pg_catalog.unnest(%(queues)s::text[]), pg_catalog.unnest(%(limits)s::int[]))
        AS u(name, lim)
    WHERE NOT EXISTS (SELECT 1 FROM dbqueue_queue AS p WHERE p.name::text = u.name AND p.paused)
),
candidates AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_after, c.keyed
    FROM claimable AS q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_after, j.serial_key IS NOT NULL AS keyed
        FROM dbqueue_job AS j
        WHERE j.state::text = 'pending' AND j.queue::text = q.name AND j.run_after <= now()
          AND (j.serial_key IS NULL
               OR (%(threads)s::int > 0 AND dbqueue_serial_turn(j.serial_key::text, j.id)))
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
     LIMIT %(threads)s::int)
),
{claimed_cte()}
SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
           id, type, queue, payload, attempts, max_attempts, lease_seconds, idempotency_key,
           priority, created_at, wait, traceparent, keyed)
       ORDER BY priority DESC, run_after, id)::text
FROM claimed
""")

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
# created_at comes as text (JSON's ISO 8601, in UTC), decoded by claimed_rows: psycopg's typed
# value of a timestamp outside Python's years (10000, BC) fails the fetch of the whole reply.
CLAIM_LIMITED = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit'::text,
                      COALESCE(%(commit)s::text, current_setting('synchronous_commit'::text)),
                      true)
)
SELECT f.id, f.type, f.queue, f.payload, f.attempts, f.max_attempts, f.lease_seconds,
       f.idempotency_key, f.priority,
       pg_catalog.to_json(f.created_at AT TIME ZONE 'UTC') #>> '{}'::text[],
       f.wait, f.traceparent, f.keyed
FROM commit_mode,
     dbqueue_claim_within_limits(
         %(queues)s::text[], %(limits)s::int[], %(limit)s::int, %(worker)s::text,
         %(token)s::bigint,
         %(q_conc)s::int[], %(q_rate_n)s::int[], %(q_rate_period)s::float8[],
         %(q_rate_key)s::text[], %(t_names)s::text[], %(t_conc)s::int[], %(t_rate_n)s::int[],
         %(t_rate_period)s::float8[], %(t_rate_key)s::text[]
     ) AS f
"""


def claim_statement(
    *,
    worker_id,
    queues,
    limits,
    limit,
    token,
    async_commit=False,
    flow=None,
    threads=None,
    fair=None,
    cursors=None,
):
    """:func:`claim`'s statement and parameters, for a Session's ``execute_pipelined``.

    ``threads``: the handler threads free now, the most jobs with a serial key the claim takes
    (a keyed job is never prefetched: it would hold its key while it waits); None: ``limit``.
    ``fair``: per queue whether it is fair, or None; a worker with a fair queue and no
    fleet-wide limit runs the fair claim (store/fair.py); under a limit, the limited claim,
    which knows no fairness (docs/fairness.md says so, and a check warns).
    """
    params = {
        "worker": worker_id,
        "queues": text_array(queues),
        "limits": int_array(limits),
        "limit": limit,
        "threads": limit if threads is None else threads,
        "token": token,
        "commit": _commit(async_commit),
    }
    if flow is None:
        if fair is not None:
            return CLAIM_FAIR, {
                **params,
                **fair_params(queues, fair, cursors or {}),
            }
        return CLAIM_JOBS, params
    return CLAIM_LIMITED, {**params, **flow}


class ClaimedRows(list):
    """The claimed jobs, and what held a limited claim back: ``held`` (a concurrency limit is
    full) and ``reopen_in`` (seconds until a rate window has room; ``None``: no rate limit
    held it back). ``unreadable``: ``(ClaimedRow, UnreadableJob)`` of each job the claim took
    whose row Python cannot read (read_claimed's slow path): not in the list, never run; the
    worker fails it dead. ``reread``: why the slow path was taken (the fast path's error)."""

    held = False
    reopen_in = None
    keyed = 0  # how many jobs have a serial key
    unreadable = ()
    reread = None


# A due job's wait (seconds since run_after) of this size or more says that its run_after may be
# before Python's year 1 (now minus year 1 is about 6.4e10 s): the claim is then read back row by
# row, where run_after itself is checked (a false alarm costs that one read back, nothing else).
WAIT_SUSPECT = 6.0e10


def claimed_rows(rows):
    """The claimed jobs as ClaimedRows. CLAIM_JOBS returns one value, a JSON array of one
    array per job (or NULL); CLAIM_LIMITED typed rows (the payload and created_at as text), then
    one closing row saying what held the claim back. Decodes the whole reply at once (the fast
    path); raises (ValueError, RecursionError, ...) when any value of it will not decode or
    looks out of Python's range: then :func:`read_claimed` reads the rows back one by one."""
    claimed = ClaimedRows()
    if rows and len(rows[0]) == 1:
        batch = rows[0][0]
        for item in decoding.fast_loads(batch) if batch is not None else ():
            item[6] = float(item[6])  # lease_seconds: JSON writes 60.0 as 60
            item[9] = datetime.datetime.fromisoformat(item[9]).astimezone(datetime.UTC)
            if not item[10] < WAIT_SUSPECT:  # also raises for "Infinity" (run_after -infinity)
                raise ValueError(f"job #{item[0]} came due {item[10]} seconds ago")
            if len(item) > 12 and item[12]:
                claimed.keyed += 1
            claimed.append(ClaimedRow(*item))
        return claimed
    for row in rows:
        if row[0] is None:  # CLAIM_LIMITED's closing row
            _closing(claimed, row)
        else:
            row = list(row)
            row[3] = decoding.fast_loads(row[3])  # payload
            row[9] = datetime.datetime.fromisoformat(row[9]).replace(tzinfo=datetime.UTC)
            if not row[10] < WAIT_SUSPECT:
                raise ValueError(f"job #{row[0]} came due {row[10]} seconds ago")
            if len(row) > 12 and row[12]:
                claimed.keyed += 1
            claimed.append(ClaimedRow(*row))
    return claimed


def _closing(claimed, row):
    claimed.held = row[1] == "held"
    claimed.reopen_in = row[10]


def read_claimed(db, rows, *, worker_id, token, known=()):
    """The rows of a claim made on ``db`` by ``worker_id`` under ``token``, as ClaimedRows:
    decoded at once (:func:`claimed_rows`), or, when that fails, read back from the table one
    row at a time (the slow path, READ_CLAIMED), each value decoded on its own, so that a job
    whose row Python cannot read lands in ``unreadable`` and the others come back as usual.
    ``known``: ids already taken under ``token`` (a batch top-up's claim), left out of the read
    back. Commits nothing: the claim did."""
    try:
        return claimed_rows(rows)
    except Exception as exc:  # anything the decoding raised: the rows are read back instead
        claimed = reread_claimed(db, worker_id=worker_id, token=token, known=known)
        claimed.reread = exc
        for row in rows or ():
            if len(row) > 1 and row[0] is None:
                _closing(claimed, row)
        return claimed


# The slow path of a claim whose reply would not decode at once (read_claimed): the jobs this
# claim took, found by the claim's own marks (its worker and lease token, on running rows), every
# value that may not decode sent as text, to be decoded on its own: the payload as jsonb's text,
# created_at and run_after as JSON writes them in UTC (ISO 8601 whatever the session's DateStyle,
# "...BC", "10000-...", "infinity"), the wait by epochs (a subtraction of an infinite timestamp
# would fail the statement). Rare, so it is planned each time: the running rows are few and
# dbqueue_job_lease_idx holds only them. In the claim's order, as far as the table tells it (a
# fair claim's places in its walk are not kept: that claim moves no cursor).
READ_CLAIMED = """
SELECT id, type, queue, payload::text, attempts, max_attempts, lease_seconds, idempotency_key,
       priority, pg_catalog.to_json(created_at AT TIME ZONE 'UTC') #>> '{}'::text[],
       (EXTRACT(EPOCH FROM started_at) - EXTRACT(EPOCH FROM run_after))::float8, traceparent,
       serial_key IS NOT NULL, fair_key,
       pg_catalog.to_json(run_after AT TIME ZONE 'UTC') #>> '{}'::text[]
FROM dbqueue_job
WHERE state::text = 'running' AND lease_token = %(token)s::bigint
  AND worker_id::text = %(worker)s::text AND NOT (id = ANY(%(known)s::bigint[]))
ORDER BY priority DESC, run_after, id
"""


def reread_claimed(db, *, worker_id, token, known=()):
    """The slow path of :func:`read_claimed`: ClaimedRows with the readable jobs, and in
    ``unreadable`` each job with the UnreadableJob that names its column and reason."""
    claimed = ClaimedRows()
    claimed.unreadable = []
    params = {"token": token, "worker": worker_id, "known": int_array(known)}
    for row in _execute(db, READ_CLAIMED, params):
        (id_, type_, queue, payload, attempt, max_attempts, lease, key, priority, created_at,
         wait, traceparent, keyed, fair_key, run_after) = row  # fmt: skip
        if keyed:
            claimed.keyed += 1
        try:
            decoding.timestamp(run_after, "run_after")
            job = ClaimedRow(
                id_, type_, queue, decoding.json_value(payload, "payload"), attempt,
                max_attempts, float(lease), key, priority,
                decoding.timestamp(created_at, "created_at"), wait, traceparent, keyed,
                fair_key,
            )  # fmt: skip
        except UnreadableJob as exc:
            job = ClaimedRow(
                id_, type_, queue, None, attempt, max_attempts, float(lease), key, priority,
                None, 0.0, traceparent, keyed, fair_key,
            )  # fmt: skip
            claimed.unreadable.append((job, exc))
        else:
            claimed.append(job)
    return claimed


# The worker's status line: due backlog of its queues, counted up to a bound so that a huge
# backlog costs no more than the bound.
COUNT_DUE = """
SELECT count(*) FROM (
    SELECT 1 FROM dbqueue_job
    WHERE state::text = 'pending' AND queue::text = ANY(%(queues)s::text[]) AND run_after <= now()
    LIMIT %(bound)s::int
) AS due
"""


def count_due(using, queues, bound=10000):
    return _execute(using, COUNT_DUE, {"queues": list(queues), "bound": bound})[0][0]
