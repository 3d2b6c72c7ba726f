"""Workflows against the plain drain (issue 12), in the same invocation.

Drains, with one in-process ``Worker(burst=True)`` at default settings (bench.py's drain):

- **plain**: ``chords * (members + 1)`` independent no-op jobs (bench.py's FILL);
- **chords**: ``chords`` groups of ``members`` no-op jobs, each with a no-op callback that waits
  for all of them (``group(..., then=...)``, enqueued before the clock starts).

Both count every job and report jobs/s; the target is chords >= 0.7x plain. Each run starts
from empty, vacuumed tables; ``--repeat`` alternates the two sides and reports medians.

    python benchmarks/workflows.py                       # 1,000 chords of 10 members
    python benchmarks/workflows.py --chords 200 --repeat 3
    python benchmarks/workflows.py --stale-statistics    # plans made before the chords came
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench import (  # noqa: E402
    Env,
    bench_database,
    close_django_connections,
    drain_ours,
    ensure_database,
    libpq_params,
    setup_django,
)

TARGET = 0.7


def drain_chords(env, chords, members, plain=0, stale=False):
    """Drain ``chords`` chords and ``plain`` no-op jobs with one worker; jobs/s. ``stale``: the
    table's statistics are taken before the chords are enqueued (with the plain jobs only, and
    autovacuum kept off the table until the drain ends), as for a worker whose plans were made
    before a fan-out of workflows arrived."""
    from django.db import transaction

    from django_dbqueue import group
    from django_dbqueue.worker import Worker

    env.reset(fill=plain)  # analyzes what it wrote
    if stale:
        env.admin.execute("ALTER TABLE dbqueue_job SET (autovacuum_enabled = false)")
    try:
        with transaction.atomic():
            for _ in range(chords):
                group(*[("bench-noop", {})] * members, then=("bench-noop", {"callback": True}))
        close_django_connections()
        if not stale:
            env.admin.execute("VACUUM ANALYZE dbqueue_job")
            env.admin.execute("VACUUM ANALYZE dbqueue_dependency")
        worker = Worker(burst=True)
        started = time.perf_counter()
        worker.run()
        seconds = time.perf_counter() - started
        close_django_connections()
    finally:
        if stale:
            env.admin.execute("ALTER TABLE dbqueue_job RESET (autovacuum_enabled)")
    n = chords * (members + 1) + plain
    env.expect("drain (chords)", done=n)
    late = env.admin.execute(
        """
        SELECT count(*) FROM (
            SELECT c.id FROM dbqueue_job AS c
            JOIN dbqueue_dependency AS e ON e.job_id = c.id
            JOIN dbqueue_job AS m ON m.id = e.depends_on_id
            GROUP BY c.id, c.started_at HAVING c.started_at < max(m.finished_at)
        ) AS early
        """
    ).fetchone()[0]
    if late:
        raise RuntimeError(f"{late} callbacks started before all their members finished")
    return n / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chords", type=int, default=1000)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--database", default="dbqueue_bench")
    parser.add_argument("--synchronous-commit", default=None, choices=["on", "off"])
    parser.add_argument("--django-prepared", action="store_true")
    parser.add_argument(
        "--stale-statistics",
        action="store_true",
        help="take the statistics before the chords are enqueued, with as many plain jobs as "
        "the chords have members in the table (and both sides drain those too): the worker's "
        "plans are made from statistics that saw no waiting job",
    )
    args = parser.parse_args()
    db = bench_database(args)
    ensure_database(db, args.database)
    setup_django(db)
    env = Env(libpq_params(db), psycopg.connect(**libpq_params(db), autocommit=True))
    extra = args.chords * args.members if args.stale_statistics else 0
    n = args.chords * (args.members + 1) + extra
    plain, chords = [], []
    for run in range(args.repeat):
        order = ("plain", "chords") if run % 2 == 0 else ("chords", "plain")
        for side in order:
            if side == "plain":
                plain.append(drain_ours(env, n)["value"])
            else:
                chords.append(
                    drain_chords(env, args.chords, args.members, extra, args.stale_statistics)
                )
            print(f"run {run + 1} {side}: {(plain if side == 'plain' else chords)[-1]:,.0f} jobs/s")
    p, c = statistics.median(plain), statistics.median(chords)
    ratio = c / p
    verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
    print(f"\n{n:,} jobs per run, medians of {args.repeat} run(s), one worker process")
    print(f"  plain drain            {p:10,.0f} jobs/s")
    print(f"  {args.chords} chords of {args.members:<3}   {c:10,.0f} jobs/s")
    print(f"  chords/plain           {ratio:10.2f}x   (target >= {TARGET}x: {verdict})")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
