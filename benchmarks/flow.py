#!/usr/bin/env python
"""Flow control's price, on the local PostgreSQL, every side in the same invocation.

- drain: ``--jobs`` (10,000) pending no-op jobs in one queue, drained by 2 worker processes
  (``Worker(burst=True, concurrency=10)``, defaults otherwise), timed from the moment both are
  told to start (Django set up, connections open) until both have exited, every job done.
  Side "unlimited": the queue has no option. Side "limited": ``global_concurrency: 10`` on the
  queue, so the two workers (20 handler threads) share 10 slots through
  ``dbqueue_claim_limited``. Side "capped": no fleet-wide limit, each worker capped at 5 jobs of
  the queue (the per-worker ``concurrency`` option), so at most 10 are in flight too, through the
  plain claim. limited/unlimited is what a limit of 10 costs no-op jobs; limited/capped is the
  part of it due to the fleet-wide machinery rather than to holding only 10 jobs at once.
- claim: the plain claim's cost (a worker with no limit configured), this branch's
  ``CLAIM_JOBS`` (with the paused-queue probe) against the same statement without it (the
  claim as it was before flow control, kept below as ``CLAIM_BEFORE``): ``--claims`` claims of
  10 jobs each on one connection, prepared, alternating the two statements in slices.

The sides alternate which goes first between repeats; medians are reported with the spread.

    python benchmarks/flow.py [--jobs 10000] [--claims 2000] [--repeat 3] [--database NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from benchmarks import bench  # noqa: E402

QUEUE = bench.QUEUE
RESET = "TRUNCATE dbqueue_job, dbqueue_limiter, dbqueue_queue RESTART IDENTITY"
# "capped": the same 10 jobs in flight at most, by each worker's own cap (5 + 5) and the plain
# claim: what holding only 10 at once costs by itself, without the fleet-wide machinery.
SIDES = {
    "unlimited": {},
    "limited": {"global_concurrency": 10},
    "capped": {"concurrency": 5},
}

# The claim before flow control (main at 59a697a): CLAIM_JOBS without the claimable CTE.
# A frozen copy on purpose: the "before" side of the claim-cost comparison must not follow
# CLAIM_JOBS as it changes.
CLAIM_BEFORE = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      COALESCE(%(commit)s, current_setting('synchronous_commit')), true)
),
candidates AS MATERIALIZED (
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
    lease_token = %(token)s,
    started_at = now(),
    leased_until = now() + j.lease_seconds * interval '1 second'
FROM candidates, commit_mode
WHERE j.id = candidates.id
RETURNING j.id, j.type, j.queue, j.payload::text, j.attempts, j.max_attempts, j.lease_seconds,
          j.idempotency_key, j.priority, j.created_at,
          EXTRACT(EPOCH FROM now() - j.run_after)::float8, j.traceparent
"""


def child_main(args):
    """One worker process: set up, say ready, wait for "go", drain, exit."""
    db = bench.bench_database(args)
    # A worker held back by the limit with nothing in flight looks again at its poll; both
    # sides poll at 0.2 s so that the last claims of a burst run do not wait 2 s.
    bench.setup_django(
        db,
        migrate=False,
        dbqueue={"QUEUES": {QUEUE: SIDES[args.child]}, "STATUS_INTERVAL": 0, "POLL_INTERVAL": 0.2},
    )
    from django_dbqueue.worker import Worker

    worker = Worker(burst=True, concurrency=10, listen=False)
    worker.session.execute("SELECT 1", {})
    print("ready", flush=True)
    sys.stdin.readline()
    worker.run()
    print(f"claims {worker.claims} empty {worker.empty_claims}", flush=True)
    return 0


def drain(env, args, side):
    env.admin.execute(RESET)
    env.admin.execute(bench.FILL, {"queue": QUEUE, "n": args.jobs})
    env.admin.execute("VACUUM ANALYZE dbqueue_job")
    command = [sys.executable, __file__, "--child", side, "--database", args.database]
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    outputs = [child.communicate()[0].strip() for child in children]
    seconds = time.perf_counter() - started
    env.expect(f"drain ({side})", done=args.jobs)
    return args.jobs / seconds, outputs


def claim_loop(conn, statement, n, worker):
    """``n`` claims of 10 jobs, each read into ClaimedRows as the worker does (the statement
    before returns typed rows, today's one JSON value); returns seconds per claim."""
    from django_dbqueue import store

    params = {
        "worker": worker,
        "queues": [QUEUE],
        "limits": [10],
        "limit": 10,
        "threads": 10,
        "token": 1,
        "commit": "off",
    }
    started = time.perf_counter()
    for _ in range(n):
        rows = store.claimed_rows(conn.execute(statement, params, prepare=True).fetchall())
        assert len(rows) == 10, len(rows)
    return (time.perf_counter() - started) / n


def claims(env, args):
    try:  # the store/ package (issue 26); against.py runs this script on older commits too
        from django_dbqueue.store import claiming as sql
    except ImportError:
        from django_dbqueue import sql

    env.admin.execute(RESET)
    slices = 10
    per_slice = max(1, args.claims // slices)
    env.admin.execute(bench.FILL, {"queue": QUEUE, "n": 2 * 10 * per_slice * slices + 100})
    env.admin.execute("VACUUM ANALYZE dbqueue_job")
    times = {"before": [], "after": []}
    with psycopg.connect(**env.params, autocommit=True) as conn:
        for i in range(slices):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for side in order:
                statement = CLAIM_BEFORE if side == "before" else sql.CLAIM_JOBS
                times[side].append(claim_loop(conn, statement, per_slice, side))
    return {side: statistics.median(t) * 1e6 for side, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", default="dbqueue_bench")
    parser.add_argument("--only", default="drain,claim")
    parser.add_argument("--child", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.synchronous_commit = "server"
    args.django_prepared = False
    if args.child:
        return child_main(args)
    db = bench.bench_database(args)
    bench.ensure_database(db, args.database)
    bench.setup_django(db)
    params = bench.libpq_params(db)
    only = set(args.only.split(","))
    with psycopg.connect(**params, autocommit=True) as admin:
        env = bench.Env(params, admin)
        print(f"load average {os.getloadavg()[0]:.2f}, cpus {os.cpu_count()}")
        rates = {side: [] for side in SIDES}
        micro = {"before": [], "after": []}
        for repeat in range(args.repeat):
            if "drain" in only:
                order = list(SIDES) if repeat % 2 == 0 else list(reversed(SIDES))
                for side in order:
                    rate, outputs = drain(env, args, side)
                    rates[side].append(rate)
                    print(
                        f"[{repeat + 1}/{args.repeat}] drain {side:9} {rate:8.0f} jobs/s  "
                        f"({'; '.join(outputs)})",
                        flush=True,
                    )
            if "claim" in only:
                result = claims(env, args)
                for side, us in result.items():
                    micro[side].append(us)
                print(
                    f"[{repeat + 1}/{args.repeat}] claim before {result['before']:.1f} us  "
                    f"after {result['after']:.1f} us",
                    flush=True,
                )
        if "drain" in only:
            med = {side: statistics.median(v) for side, v in rates.items()}
            print(
                f"drain, 2 workers x concurrency 10, {args.jobs} jobs: unlimited "
                f"{med['unlimited']:.0f} jobs/s [{min(rates['unlimited']):.0f}-"
                f"{max(rates['unlimited']):.0f}], limited (global_concurrency 10) "
                f"{med['limited']:.0f} jobs/s [{min(rates['limited']):.0f}-"
                f"{max(rates['limited']):.0f}], capped (5 per worker) {med['capped']:.0f} jobs/s "
                f"[{min(rates['capped']):.0f}-{max(rates['capped']):.0f}]; limited/unlimited "
                f"{med['limited'] / med['unlimited']:.2f}, limited/capped "
                f"{med['limited'] / med['capped']:.2f}"
            )
        if "claim" in only:
            med = {side: statistics.median(v) for side, v in micro.items()}
            print(
                f"plain claim of 10 (no limit configured): before flow control "
                f"{med['before']:.1f} us, with the pause probe {med['after']:.1f} us; "
                f"after/before {med['after'] / med['before']:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
