"""The fair claim (docs/fairness.md): the claim of a worker that serves a fair queue, taking its
jobs round-robin by their ``fair_key`` so that one key's backlog does not delay another key's
job. A worker without a fair queue never runs it: its claim is ``CLAIM_JOBS``, as before."""

from ..conf import SHARED_FAIR_KEY
from ..connections import PlannedOnce
from ._db import claimed_cte, text_array

# The serial-key rule of CLAIM_JOBS (store/claiming.py explains it), the same in both claims.
_SERIAL_TURN = (
    "(j.serial_key IS NULL"
    " OR (%(threads)s::int > 0 AND dbqueue_serial_turn(j.serial_key::text, j.id)))"
)
# The same test without its side effects (no advisory lock, nothing remembered; migration 0016):
# for a look that locks nothing, that a job might start (the walk's key test, keyless_head).
_SERIAL_FREE = (
    "(j.serial_key IS NULL"
    " OR (%(threads)s::int > 0 AND dbqueue_serial_free(j.serial_key::text, j.id)))"
)
# The place of the keyless jobs in the walk: after every key (a walk visits at most this many).
_KEYLESS_POS = 1_000_000_000


# The fair claim: one statement for up to %(limit)s jobs across the worker's queues, fair and
# plain, with CLAIM_JOBS's commit mode, pause test, serial keys, lease, token and JSON reply.
# - The plain queues of the worker (%(fair)s false) are scanned exactly as CLAIM_JOBS scans them.
# - dbqueue_job_fair_idx holds the pending jobs WITH a fair key only (migration 0025): a job
#   without one (every plain queue's) writes no entry in it. enqueue() gives a fair queue's
#   jobs without a key the shared key '' (conf.SHARED_FAIR_KEY), which sorts first.
# - A fair queue's keys are walked round-robin from %(cursors)s, the last key the worker served
#   in it (the worker keeps it, per queue, from the replies: no row is written for it): the
#   keys after it in ascending order, then from the first key ('') up to the cursor itself,
#   until the walk has found the queue's limit of OPEN keys or has been round once. Each step
#   is one probe of dbqueue_job_fair_idx for the next key with a due pending job (a skip scan),
#   so a claim reads about as many keys as it has slots, however many keys the queue has.
#   (A UNION ALL under LIMIT 1 runs its branches in turn and stops at the first row: each
#   branch is one index range, never a filter that would read on past the cursor.)
# - A key is open when one of its due jobs may start: no serial key, or (for a free thread)
#   its serial key's turn, asked with dbqueue_serial_free() (no lock taken, nothing
#   remembered: the fetch below asks dbqueue_serial_turn() for the jobs it takes). The job the
#   key probe found settles it when it has no serial key (ready: no second look); otherwise
#   the look (s) reads the key's jobs in claim order up to the first that may start: for a key whose due jobs all wait
#   for their serial turn, all of them, as the plain claim reads a blocked backlog. A key that
#   is not open takes no place among the limit's keys and gives no job: keys whose jobs wait
#   for their turn (a tenant's serial key while its job runs) cannot fill the walk and leave
#   another key's due job unclaimed, claim after claim (tests/integration/test_fair_serial.py).
#   With every key blocked, the walk goes round once and claims nothing: a claim then reads
#   every key's blocked jobs once, as the plain claim would read them all.
# - Each OPEN key visited gives its first ceil(limit / keys visited) due jobs in claim order
#   (priority, run_after, id), locked with SKIP LOCKED (a job another worker is claiming is
#   passed over, as in CLAIM_JOBS); the candidates are ranked within their key, and the batch
#   takes rank 1 of every key in walk order before rank 2 of any: one claim of 100 from 100
#   keys is one job of each. Priority orders the jobs within a key; across keys the walk does.
# - The generic plan is made once per connection, often on an empty table or with one key's
#   statistics, where every index looks alike: nothing in it may depend on the estimates. So
#   a key's jobs are asked for with a range (>= and <= the key, never =) in the order of the
#   fair index, key first: only that index gives the order; the claim index would need a sort
#   of the queue's backlog. (With "fair_key = key" the planner dropped the key from the order
#   as constant and, on one key's statistics, read the key's jobs from the claim index, filtering
#   out every other key's: 3,000 rows per claim in tests/integration/test_fair_queues.py.)
# - Jobs with no key at all (NULL: written by dbqueue_enqueue() in SQL, or before
#   the queue was made fair) are in no fair index. They are one more key, last in the walk,
#   found among the queue's first (its limit) due pending jobs in claim order that may start
#   (keyless_head: the claim index, read as CLAIM_JOBS reads it, no row locked): such a job is
#   claimed when a plain claim would take it, no later, even behind a blocked serial backlog.
#   The look passes over every job with a serial key and a fair key (those are the walk's,
#   which asks for their turn), so that a blocked backlog costs it a heap read per job and no
#   turn test; a keyless job with a serial key is asked with dbqueue_serial_free(). (Passing
#   over a keyed job that might start only brings a keyless job forward, never later.) A claim that finds none pays that short scan. Each
#   is then locked by its primary key, one probe per job (keyless): a single scan of
#   "id = ANY(...)" was planned, on an empty table, as a read of the claim index filtering on
#   the ids, which read the whole backlog.
# - The reply adds to each job its fair key and its place in the walk (0 for a plain queue);
#   the worker's next cursor in a queue is the key of the last place it was served from.
# - Scheduled jobs (run_after in the future) are not keys yet: a key probe passes over the
#   not-due entries of a key, and a queue whose keys hold many jobs scheduled for later pays
#   for reading past them.
def _claim_fair(of_type=""):
    # The job a key probe found may start as it is (no serial key, of the type asked for).
    _READY = f"(j.serial_key IS NULL{of_type})"
    return PlannedOnce(f"""
WITH RECURSIVE commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit'::text,
                      COALESCE(%(commit)s::text, current_setting('synchronous_commit'::text)),
                      true)
),
claimable AS MATERIALIZED (
    SELECT u.name, u.lim, u.fair, u.cursor
    FROM ROWS FROM (pg_catalog.unnest(%(queues)s::text[]), pg_catalog.unnest(%(limits)s::int[]),
                    pg_catalog.unnest(%(fair)s::boolean[]), pg_catalog.unnest(%(cursors)s::text[]))
        AS u(name, lim, fair, cursor)
    WHERE u.lim > 0
      AND NOT EXISTS (SELECT 1 FROM dbqueue_queue AS p WHERE p.name::text = u.name AND p.paused)
),
plain AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_after, c.keyed, q.name AS queue, q.lim
    FROM claimable AS q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_after, j.serial_key IS NOT NULL AS keyed
        FROM dbqueue_job AS j
        WHERE j.state::text = 'pending' AND j.queue::text = q.name AND j.run_after <= now()
          AND {_SERIAL_TURN}{of_type}
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT q.lim
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE NOT q.fair
),
keyless_head AS MATERIALIZED (
    SELECT q.name AS queue, q.lim, h.id
    FROM claimable AS q
    CROSS JOIN LATERAL (
        SELECT j.id, j.fair_key
        FROM dbqueue_job AS j
        WHERE j.state::text = 'pending' AND j.queue::text = q.name AND j.run_after <= now()
          AND (CASE WHEN j.fair_key IS NULL THEN {_SERIAL_FREE}
                    ELSE j.serial_key IS NULL END){of_type}
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT q.lim
    ) AS h
    WHERE q.fair AND h.fair_key IS NULL
),
keyless AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_after, c.keyed, h.queue, h.lim, {_KEYLESS_POS} AS pos
    FROM keyless_head AS h
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_after, j.serial_key IS NOT NULL AS keyed
        FROM dbqueue_job AS j
        WHERE j.id = h.id AND j.state::text = 'pending' AND j.fair_key IS NULL
          AND j.run_after <= now() AND {_SERIAL_TURN}{of_type}
        FOR UPDATE SKIP LOCKED
    ) AS c
),
walk (queue, lim, cursor, pos, key, phase, served, open) AS (
    SELECT q.name, q.lim, q.cursor, 0, q.cursor, 0, 0, false
    FROM claimable AS q
    WHERE q.fair
  UNION ALL
    SELECT w.queue, w.lim, w.cursor, w.pos + 1, n.key, n.phase,
           w.served + (n.ready OR s.id IS NOT NULL)::int, n.ready OR s.id IS NOT NULL
    FROM walk AS w
    CROSS JOIN LATERAL (
        (SELECT j.fair_key::text AS key, 0 AS phase, {_READY} AS ready
         FROM dbqueue_job AS j
         WHERE w.phase = 0 AND j.state::text = 'pending' AND j.fair_key IS NOT NULL
           AND j.queue::text = w.queue AND j.fair_key::text > w.key AND j.run_after <= now()
         ORDER BY j.fair_key
         LIMIT 1)
        UNION ALL
        (SELECT j.fair_key::text, 1, {_READY}
         FROM dbqueue_job AS j
         WHERE w.phase = 0 AND j.state::text = 'pending' AND j.fair_key IS NOT NULL
           AND j.queue::text = w.queue AND j.fair_key::text <= w.cursor AND j.run_after <= now()
         ORDER BY j.fair_key
         LIMIT 1)
        UNION ALL
        (SELECT j.fair_key::text, 1, {_READY}
         FROM dbqueue_job AS j
         WHERE w.phase = 1 AND j.state::text = 'pending' AND j.fair_key IS NOT NULL
           AND j.queue::text = w.queue AND j.fair_key::text > w.key AND j.fair_key::text <= w.cursor
           AND j.run_after <= now()
         ORDER BY j.fair_key
         LIMIT 1)
        LIMIT 1
    ) AS n
    LEFT JOIN LATERAL (
        SELECT j.id
        FROM dbqueue_job AS j
        WHERE NOT n.ready AND j.state::text = 'pending' AND j.fair_key IS NOT NULL
          AND j.queue::text = w.queue AND j.fair_key::text >= n.key AND j.fair_key::text <= n.key
          AND j.run_after <= now() AND {_SERIAL_FREE}{of_type}
        ORDER BY j.fair_key, j.priority DESC, j.run_after, j.id
        LIMIT 1
    ) AS s ON true
    WHERE w.served < w.lim
),
fair_keys AS MATERIALIZED (
    SELECT w.queue, w.lim, w.pos, w.key,
           ((w.lim + count(*) OVER (PARTITION BY w.queue) - 1)
            / count(*) OVER (PARTITION BY w.queue))::int AS share
    FROM walk AS w
    WHERE w.pos > 0 AND w.open
),
fair AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_after, c.keyed, k.queue, k.lim, k.pos
    FROM fair_keys AS k
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_after, j.serial_key IS NOT NULL AS keyed
        FROM dbqueue_job AS j
        WHERE j.state::text = 'pending' AND j.fair_key IS NOT NULL
          AND j.queue::text = k.queue AND j.fair_key::text >= k.key AND j.fair_key::text <= k.key
          AND j.run_after <= now() AND {_SERIAL_TURN}{of_type}
        ORDER BY j.fair_key, j.priority DESC, j.run_after, j.id
        LIMIT k.share
        FOR UPDATE SKIP LOCKED
    ) AS c
),
ranked AS MATERIALIZED (
    SELECT x.*,
           row_number() OVER (PARTITION BY x.queue, x.pos
                              ORDER BY x.priority DESC, x.run_after, x.id) AS rank
    FROM (SELECT id, priority, run_after, keyed, queue, lim, pos FROM fair
          UNION ALL
          SELECT id, priority, run_after, keyed, queue, lim, pos FROM keyless
          UNION ALL
          SELECT id, priority, run_after, keyed, queue, lim, 0 FROM plain) AS x
),
candidates AS MATERIALIZED (
    SELECT r.id, r.keyed, r.rank, r.pos, r.priority, r.run_after
    FROM (SELECT r.*, row_number() OVER (PARTITION BY r.queue
                                         ORDER BY r.rank, r.pos, r.priority DESC,
                                                  r.run_after, r.id) AS in_queue
          FROM ranked AS r) AS r
    WHERE r.in_queue <= r.lim
    ORDER BY r.rank, r.pos, r.priority DESC, r.run_after, r.id
    LIMIT %(limit)s
),
chosen AS MATERIALIZED (
    SELECT c.id, c.rank, c.pos FROM candidates AS c WHERE NOT c.keyed
    UNION ALL
    (SELECT c.id, c.rank, c.pos FROM candidates AS c WHERE c.keyed
     ORDER BY c.rank, c.pos, c.priority DESC, c.run_after, c.id
     LIMIT %(threads)s::int)
),
{claimed_cte(", j.fair_key")}
SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
           c.id, c.type, c.queue, c.payload, c.attempts, c.max_attempts, c.lease_seconds,
           c.idempotency_key, c.priority, c.created_at, c.wait, c.traceparent, c.keyed,
           c.fair_key, h.pos)
       ORDER BY h.rank, h.pos, c.priority DESC, c.run_after, c.id)::text
FROM claimed AS c JOIN chosen AS h ON h.id = c.id
""")


CLAIM_FAIR = _claim_fair()

# The batch top-up on a fair queue (store/batches.py, docs/batches.md): the same claim for the
# one fair queue and one batch type, from the cursor the batch's own claim left, with no free
# thread (%(threads)s 0: no job with a serial key, as CLAIM_MORE_OF_TYPE). A key is open when
# it has a due job of the type; each key's jobs of other types are read past (as the plain
# top-up reads past them in a shared queue). A batch is then filled round-robin by key, one job
# of each waiting key before a second of any, not with one key's backlog in claim order.
# Planned once, as CLAIM_FAIR (not for each execution's values as CLAIM_MORE_OF_TYPE): planned
# for its values on a table whose statistics were an empty one's, its key probes read the table
# whole (tests/integration/test_batch_plans.py); the generic plan follows the index order.
CLAIM_MORE_FAIR = _claim_fair(" AND j.type::text = %(type)s::text")


def fair_params(queues, fair, cursors):
    """The fair claim's extra parameters: per queue of the worker whether it is fair, and the
    last key served in it ('' at first: the shared key, SHARED_FAIR_KEY, which sorts before every
    key a caller gives; the walk starts after it)."""
    return {
        "fair": "{" + ",".join("t" if f else "f" for f in fair) + "}",
        "cursors": text_array(
            [
                cursors.get(name, SHARED_FAIR_KEY) if f else ""
                for name, f in zip(queues, fair, strict=True)
            ]
        ),
    }
