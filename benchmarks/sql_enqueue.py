#!/usr/bin/env python
"""``enqueue()`` from Python against ``dbqueue_enqueue()`` from a raw psycopg connection.

Issue 28 ("Enqueue from plain SQL"): what does the SQL function cost a service in another
language, next to the Python call and next to a plain INSERT of the same row? Three sides write
``--jobs`` (5,000) single-job transactions each (``bench-noop``, a small JSON payload, queue
``default``), committed, timed from before the first to after the last commit:

  enqueue       ``transaction.atomic()`` + ``enqueue(type, payload)`` on Django's connection
  sql           psycopg: ``BEGIN; SELECT dbqueue.dbqueue_enqueue(%s, %s::jsonb); COMMIT``
  plain-insert  psycopg: ``BEGIN; INSERT INTO dbqueue_job (...) VALUES (...); COMMIT`` with the
                same columns (what the function runs, without its checks and its wake-up look)

No worker waits, so none of them notifies (the advisory-lock look is still paid by all but
plain-insert). The table is truncated before every run; the sides run in a rotated order each
repeat; the table shows medians with [min..max] and the ratios paired within a repeat.

    python benchmarks/sql_enqueue.py [--jobs 5000] [--repeat 3] [--database NAME] [--json FILE]
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

SIDES = ("enqueue", "sql", "plain-insert")
TYPE = "bench-noop"
SQL = "SELECT dbqueue.dbqueue_enqueue(%s, %s::jsonb)"
PLAIN_INSERT = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at
)
VALUES (%s, 'default', %s::jsonb, 'pending', 0, now(), 0, 10, 60, '[]'::jsonb, now())
RETURNING id
"""


def payload(i):
    return {"invoice_id": i, "email": f"customer-{i}@example.com"}


def enqueue_side(n):
    from django.db import transaction

    from django_dbqueue import enqueue

    started = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            enqueue(TYPE, payload(i))
    return time.perf_counter() - started


def raw_side(conn, statement, n):
    started = time.perf_counter()
    for i in range(n):
        with conn.transaction():
            conn.execute(statement, (TYPE, json.dumps(payload(i)))).fetchone()
    return time.perf_counter() - started


def run(side, conn, n):
    if side == "enqueue":
        return enqueue_side(n)
    return raw_side(conn, SQL if side == "sql" else PLAIN_INSERT, n)


def check(env, side, n):
    env.expect(side, pending=n)
    row = env.admin.execute(
        "SELECT count(DISTINCT payload), count(DISTINCT (type, queue, state, priority, attempts,"
        " max_attempts, lease_seconds, errors)) FROM dbqueue_job"
    ).fetchone()
    if row != (n, 1):
        raise bench.InvalidRun(f"{side}: the rows are not the jobs written: {row}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="single-job transactions")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", default="dbqueue_bench_sql")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if min(args.jobs, args.repeat) < 1:
        parser.error("--jobs and --repeat must be at least 1")
    args.synchronous_commit, args.django_prepared = "server", False

    db = bench.bench_database(args)
    bench.ensure_database(db, args.database)
    bench.setup_django(db)
    bench.close_django_connections()
    params = bench.libpq_params(db)
    import django_dbqueue

    print(f"package: {Path(django_dbqueue.__file__).parent}")
    print(
        f"database: {args.database}; {args.jobs} single-job transactions per side; repeat: "
        f"{args.repeat}; psycopg {psycopg.__version__} ({psycopg.pq.__impl__})"
    )
    results = {side: [] for side in SIDES}
    with (
        psycopg.connect(**params, autocommit=True) as admin,
        psycopg.connect(**params, autocommit=True) as conn,
    ):
        env = bench.Env(params=params, admin=admin)
        print(f"commit_ms: {env.commit_ms():.2f}")
        for rep in range(args.repeat):
            order = SIDES[rep % len(SIDES) :] + SIDES[: rep % len(SIDES)]
            for side in order:
                env.reset()
                seconds = run(side, conn, args.jobs)
                check(env, side, args.jobs)
                results[side].append(seconds)
                print(
                    f"  run {rep + 1} {side:>12}: {seconds * 1000:9.1f} ms "
                    f"({args.jobs / seconds:7,.0f} tx/s, {seconds / args.jobs * 1e6:6.1f} us/tx)",
                    flush=True,
                )

    summary = {}
    print()
    print(f"{'side':>12} {'us/tx (median)':>15} {'[min..max]':>16} {'tx/s':>8}")
    for side in SIDES:
        values = [s / args.jobs * 1e6 for s in results[side]]
        med = statistics.median(values)
        summary[side] = {"us_per_tx": med, "tx_per_s": 1e6 / med}
        spread = f"[{min(values):.1f}..{max(values):.1f}]"
        print(f"{side:>12} {med:15.1f} {spread:>16} {1e6 / med:8,.0f}")
    print()
    for ours, base in (("sql", "enqueue"), ("sql", "plain-insert"), ("enqueue", "plain-insert")):
        ratios = sorted(a / b for a, b in zip(results[ours], results[base], strict=True))
        med = statistics.median(ratios)
        summary[f"{ours}/{base}"] = {"ratio": med}
        print(
            f"{ours}/{base}: {med:.2f}x the time [{ratios[0]:.2f}..{ratios[-1]:.2f}] "
            "(paired within a repeat)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
