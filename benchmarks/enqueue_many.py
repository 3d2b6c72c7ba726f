#!/usr/bin/env python
"""``enqueue_many()`` against a plain multi-row INSERT and a plain COPY of the same rows.

Issue 28 ("A faster bulk enqueue"; River's InsertManyFast is the anchor): is COPY worth a path
of its own in ``enqueue_many``? Three sides write the same jobs (``bench-noop``, a small JSON
payload each, queue ``default``) into the package's ``dbqueue_job`` table:

  enqueue_many  ``transaction.atomic()`` + ``enqueue_many(items)`` on Django's connection
  plain-insert  psycopg: one ``INSERT ... SELECT FROM unnest(...)`` of the same columns
                (type, queue, payload, priority, max_attempts, lease_seconds; the constant
                columns and the times written by the statement, as the package's INSERT does)
  plain-copy    psycopg: ``cursor.copy("COPY dbqueue_job (...) FROM STDIN")`` + ``write_row``
                per job, the same values (run_after and created_at from the columns' defaults)

Two workloads, each side in its own transaction(s), committed, timed from before the call to
after the commit (payload encoding of the plain sides included: they get the same Python dicts):

  batch   ``--jobs`` (10,000) jobs in one transaction
  small   ``--small-batches`` (100) transactions of ``--small-jobs`` (100) jobs each: what most
          callers do, which a faster bulk path must not make slower

The table is truncated, vacuumed and analysed before every run (autovacuum is off on the
benchmark machine, so nothing else cleans the dead tuples of the previous run), and a
CHECKPOINT is taken. The sides run in a rotated order each repeat; the table shows medians with
[min..max], and enqueue_many's time as a ratio of each plain side's, paired within a repeat.

    python benchmarks/enqueue_many.py [--jobs 10000] [--small-batches 100] [--small-jobs 100]
                                      [--repeat 3] [--database NAME] [--json FILE]

``benchmarks/against.py`` runs it against an earlier commit too (before/after a change).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from benchmarks import bench  # noqa: E402

SIDES = ("enqueue_many", "plain-insert", "plain-copy")
WORKLOADS = ("batch", "small")
TYPE = "bench-noop"
PRIORITY, MAX_ATTEMPTS, LEASE = 0, 10, 60.0  # bench-noop's values at the default settings

PLAIN_INSERT = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at
)
SELECT u.type, u.queue, u.payload::jsonb, 'pending', u.priority, now(), 0, u.max_attempts,
       u.lease, '[]'::jsonb, now()
FROM unnest(%(types)s::text[], %(queues)s::text[], %(payloads)s::text[],
            %(priorities)s::smallint[], %(max_attempts)s::int[], %(leases)s::float8[])
     AS u(type, queue, payload, priority, max_attempts, lease)
"""
PLAIN_COPY = """
COPY dbqueue_job (
    type, queue, payload, state, priority, attempts, max_attempts, lease_seconds, errors
) FROM STDIN
"""


def payload(i):
    return {"invoice_id": i, "email": f"customer-{i}@example.com"}


def enqueue_many_side(first, n):
    from django.db import transaction

    from django_dbqueue import enqueue_many

    items = [(TYPE, payload(i)) for i in range(first, first + n)]
    started = time.perf_counter()
    with transaction.atomic():
        jobs = enqueue_many(items)
    elapsed = time.perf_counter() - started
    if len(jobs) != n:
        raise bench.InvalidRun(f"enqueue_many returned {len(jobs)} jobs, not {n}")
    return elapsed


def plain_insert_side(conn, first, n):
    payloads = [payload(i) for i in range(first, first + n)]
    started = time.perf_counter()
    with conn.transaction():
        conn.execute(
            PLAIN_INSERT,
            {
                "types": [TYPE] * n,
                "queues": [bench.QUEUE] * n,
                "payloads": [json.dumps(p) for p in payloads],
                "priorities": [PRIORITY] * n,
                "max_attempts": [MAX_ATTEMPTS] * n,
                "leases": [LEASE] * n,
            },
        )
    return time.perf_counter() - started


def plain_copy_side(conn, first, n):
    payloads = [payload(i) for i in range(first, first + n)]
    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur, cur.copy(PLAIN_COPY) as copy:
        for p in payloads:
            copy.write_row(
                (
                    TYPE,
                    bench.QUEUE,
                    json.dumps(p),
                    "pending",
                    PRIORITY,
                    0,
                    MAX_ATTEMPTS,
                    LEASE,
                    "[]",
                )
            )
    return time.perf_counter() - started


def run(side, conn, batches, per_batch):
    """``batches`` transactions of ``per_batch`` jobs by ``side``; total seconds."""
    total = 0.0
    for b in range(batches):
        first = b * per_batch
        if side == "enqueue_many":
            total += enqueue_many_side(first, per_batch)
        elif side == "plain-insert":
            total += plain_insert_side(conn, first, per_batch)
        else:
            total += plain_copy_side(conn, first, per_batch)
    return total


def check(env, side, n):
    env.expect(side, pending=n)
    rows = env.admin.execute(
        "SELECT count(DISTINCT payload), bool_and(run_after <= now())::int, "
        "count(*) FILTER (WHERE errors <> '[]'::jsonb OR attempts <> 0) FROM dbqueue_job"
    ).fetchone()
    if rows != (n, 1, 0):
        raise bench.InvalidRun(f"{side}: rows are not the jobs written: {rows}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000, help="jobs of the one big batch")
    parser.add_argument("--small-batches", type=int, default=100)
    parser.add_argument("--small-jobs", type=int, default=100, help="jobs per small batch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="batch,small")
    parser.add_argument("--database", default="dbqueue_bench_many")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if min(args.jobs, args.small_batches, args.small_jobs, args.repeat) < 1:
        parser.error("--jobs, --small-batches, --small-jobs and --repeat must be at least 1")
    workloads = [w for w in args.only.split(",") if w]
    if not workloads or set(workloads) - set(WORKLOADS):
        parser.error(f"--only takes a subset of {','.join(WORKLOADS)}")
    args.synchronous_commit, args.django_prepared = "server", False

    db = bench.bench_database(args)
    bench.ensure_database(db, args.database)
    bench.setup_django(db)
    bench.close_django_connections()
    params = bench.libpq_params(db)
    import django_dbqueue

    print(f"package: {Path(django_dbqueue.__file__).parent}")
    print(
        f"database: {args.database}; batch: {args.jobs} jobs in one transaction; small: "
        f"{args.small_batches} x {args.small_jobs} jobs; repeat: {args.repeat}; "
        f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__})"
    )
    sizes = {"batch": (1, args.jobs), "small": (args.small_batches, args.small_jobs)}
    results = {w: {side: [] for side in SIDES} for w in workloads}
    with (
        psycopg.connect(**params, autocommit=True) as admin,
        psycopg.connect(**params, autocommit=True) as conn,
    ):
        env = bench.Env(params=params, admin=admin)
        print(f"commit_ms: {env.commit_ms():.2f}")
        for rep in range(args.repeat):
            order = SIDES[rep % len(SIDES) :] + SIDES[: rep % len(SIDES)]
            for workload in workloads:
                batches, per_batch = sizes[workload]
                for side in order:
                    env.reset()
                    seconds = run(side, conn, batches, per_batch)
                    check(env, side, batches * per_batch)
                    results[workload][side].append(seconds)
                    print(
                        f"  run {rep + 1} {workload:>5} {side:>12}: {seconds * 1000:9.1f} ms "
                        f"({batches * per_batch / seconds:9,.0f} jobs/s)",
                        flush=True,
                    )

    summary = {}
    print()
    print(f"{'workload':<8} {'side':>12} {'ms (median)':>12} {'[min..max]':>20} {'jobs/s':>9}")
    for workload in workloads:
        batches, per_batch = sizes[workload]
        n = batches * per_batch
        for side in SIDES:
            values = results[workload][side]
            med = statistics.median(values)
            summary[f"{workload} {side}"] = {"ms": med * 1000, "jobs_per_s": n / med}
            spread = f"[{min(values) * 1000:.1f}..{max(values) * 1000:.1f}]"
            print(f"{workload:<8} {side:>12} {med * 1000:12.1f} {spread:>20} {n / med:9,.0f}")
    print()
    for workload in workloads:
        for plain in ("plain-insert", "plain-copy"):
            ratios = sorted(
                ours / base
                for ours, base in zip(
                    results[workload]["enqueue_many"], results[workload][plain], strict=True
                )
            )
            med = statistics.median(ratios)
            summary[f"{workload} enqueue_many/{plain}"] = {"ratio": med}
            print(
                f"{workload:<8} enqueue_many/{plain}: {med:.2f}x the time "
                f"[{ratios[0]:.2f}..{ratios[-1]:.2f}] (paired within a repeat)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
