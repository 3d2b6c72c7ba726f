"""Workflows: the jobs and dependency edges of a graph inserted in one statement, a job's
dependency results, and its neighbours for the admin."""

from ._db import _execute
from .wakeups import WAKEUPS_WANTED

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
    SELECT count(*) = pg_catalog.cardinality(%(existing)s::bigint[])
           AND NOT bool_or(state::text IN ('dead', 'cancelled')) IS TRUE AS ok
    FROM existing
),
ids AS MATERIALIZED (
    SELECT ord, nextval(pg_get_serial_sequence('dbqueue_job'::text, 'id'::text)::regclass) AS id
    FROM generate_series(1, pg_catalog.cardinality(%(types)s::text[])) AS ord
    WHERE (SELECT ok FROM accepted)
),
edges AS MATERIALIZED (
    SELECT e.job_ord, e.dep_ord, e.dep_id, e.run_on_failure
    FROM ROWS FROM (pg_catalog.unnest(%(edge_jobs)s::int[]),
                    pg_catalog.unnest(%(edge_dep_ords)s::int[]),
                    pg_catalog.unnest(%(edge_dep_ids)s::bigint[]),
                    pg_catalog.unnest(%(edge_runs)s::boolean[]))
        AS e(job_ord, dep_ord, dep_id, run_on_failure)
),
counts AS MATERIALIZED (
    SELECT e.job_ord,
           count(*) FILTER (WHERE e.dep_ord IS NOT NULL OR x.state::text <> 'done') AS waiting_on
    FROM edges AS e LEFT JOIN existing AS x ON x.id = e.dep_id
    GROUP BY e.job_ord
),
inserted AS (
    INSERT INTO dbqueue_job (
        id, type, queue, payload, state, priority, run_after, attempts, max_attempts,
        lease_seconds, idempotency_key, errors, created_at, traceparent, waiting_on,
        dependents, serial_key, fair_key
    )
    SELECT i.id, u.type, u.queue, u.payload::jsonb,
           CASE WHEN COALESCE(c.waiting_on, 0) > 0 THEN 'waiting' ELSE 'pending' END,
           u.priority, COALESCE(u.run_after, now() + u.delay * interval '1 second'),
           0, u.max_attempts, u.lease, NULL, '[]'::jsonb, now(), %(traceparent)s,
           COALESCE(c.waiting_on, 0),
           (SELECT pg_catalog.array_agg(w.id ORDER BY w.id)
            FROM edges AS d JOIN ids AS w ON w.ord = d.job_ord WHERE d.dep_ord = u.ord),
           u.serial_key, u.fair_key
    FROM ROWS FROM (
        pg_catalog.unnest(%(types)s::text[]), pg_catalog.unnest(%(queues)s::text[]),
        pg_catalog.unnest(%(payloads)s::text[]), pg_catalog.unnest(%(priorities)s::smallint[]),
        pg_catalog.unnest(%(run_afters)s::timestamptz[]), pg_catalog.unnest(%(delays)s::float8[]),
        pg_catalog.unnest(%(max_attempts)s::int[]), pg_catalog.unnest(%(leases)s::float8[]),
        pg_catalog.unnest(%(serial_keys)s::text[]), pg_catalog.unnest(%(fair_keys)s::text[])
    ) WITH ORDINALITY AS u(type, queue, payload, priority, run_after, delay, max_attempts,
                           lease, serial_key, fair_key, ord)
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
SELECT 'job', i.id, i.state, i.queue, CASE WHEN i.state::text = 'pending' THEN w.wanted END,
       (SELECT count(*) FROM linked) + (SELECT count(*) FROM at_commit)
FROM inserted AS i LEFT JOIN wanted AS w ON w.queue = i.queue::text
UNION ALL
SELECT 'dependency', id, state, NULL, NULL, 0 FROM existing
""".replace("{wanted}", WAKEUPS_WANTED)  # (the text has braces of its own)


def insert_workflow(using, *, columns, edges, existing, traceparent=None):
    """Insert a workflow's jobs and edges in one statement (``INSERT_WORKFLOW``).

    ``edges``: ``(job position, dependency position or None, dependency id or None,
    run_on_failure)`` with 1-based positions in ``columns``; ``existing``: the ids of the
    dependencies already in the table. Returns ``(job ids in order with their state, {existing
    id: state}, [(queue, wake) of each job])`` (``wake``: None for a job created waiting, else as
    for :func:`insert_job`); no job ids when an existing dependency
    is missing, dead or cancelled (then nothing was written).
    """
    job_ords, dep_ords, dep_ids, runs = zip(*edges, strict=True) if edges else ((), (), (), ())
    params = {
        "traceparent": traceparent,
        "existing": list(existing),
        "edge_jobs": list(job_ords),
        "edge_dep_ords": list(dep_ords),
        "edge_dep_ids": list(dep_ids),
        "edge_runs": list(runs),
        **columns,
    }
    rows = _execute(using, INSERT_WORKFLOW, params)
    jobs = sorted((job_id, state) for kind, job_id, state, _, _, _ in rows if kind == "job")
    found = {job_id: state for kind, job_id, state, _, _, _ in rows if kind == "dependency"}
    wakes = [(queue, wake) for kind, _, _, queue, wake, _ in rows if kind == "job"]
    return jobs, found, wakes


# A job's dependencies and their results (``ctx.dependency_results()``); a pruned dependency
# is missing.
DEPENDENCY_RESULTS = """
SELECT j.id, j.result::text
FROM dbqueue_dependency AS e JOIN dbqueue_job AS j ON j.id = e.depends_on_id
WHERE e.job_id = %(id)s
"""


def dependency_results(using, job_id):
    """``{dependency id: result JSON text or None}`` of a job's dependencies still stored."""
    return dict(_execute(using, DEPENDENCY_RESULTS, {"id": job_id}))


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


def workflow_neighbours(using, job_id):
    """``[(relation, id, type, state, run_on_failure), ...]``: relation is ``depends_on`` (this
    job waits on that one) or ``dependent`` (that one waits on this job)."""
    return _execute(using, WORKFLOW_NEIGHBOURS, {"id": job_id})
