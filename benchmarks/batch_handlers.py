#!/usr/bin/env python
"""Batch handlers against plain handlers: the real ``run_jobqueue`` command drains ``--jobs``
no-op jobs of a ``batch_size=100`` type (``bench-batch-noop``), and the same backlog of the
plain no-op type (``bench-noop``), in one invocation.

Both sides are ``benchmarks/drain_command.py``'s drain: ``python -m django run_jobqueue`` as a
subprocess, non-burst, every setting at its default, timed in database time from the first
job's ``started_at`` to the last job's ``finished_at``; the backlog is written beforehand (the
batch side's rows are the plain fill retyped in one UPDATE). The sides alternate, in a rotated
order each repeat; the median of ``--repeat`` runs is printed with the spread, and the batch
side as a ratio of the plain side, run by run.

    python benchmarks/batch_handlers.py [--jobs 20000] [--repeat 3] [--database NAME]
                                        [--worker-args "--concurrency 10"]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from benchmarks import bench, drain_command  # noqa: E402

SIDES = ("plain", "batch-100")
RETYPE = "UPDATE dbqueue_job SET type = 'bench-batch-noop' WHERE state = 'pending'"


def drain(env, side, args):
    """``run_jobqueue`` drains the backlog of ``side``'s type."""
    reset = env.reset

    def retyped_reset(fill=0, sleep=None):
        reset(fill=fill, sleep=sleep)
        env.admin.execute(RETYPE)
        env.admin.execute("VACUUM ANALYZE dbqueue_job")

    if side != "plain":
        env.reset = retyped_reset
    try:
        return drain_command.drain_command(
            env, args.jobs, args.database, args.worker_args, args.deadline
        )
    finally:
        env.reset = reset


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", default="dbqueue_bench_batches")
    parser.add_argument("--worker-args", default="", help="extra run_jobqueue arguments")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds per run at most")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.repeat < 1:
        parser.error("--jobs and --repeat must be at least 1")
    args.synchronous_commit, args.django_prepared = "server", False

    db = bench.bench_database(args)
    bench.ensure_database(db, args.database)
    bench.setup_django(db, dbqueue={"QUEUES": {"default": {}}})
    bench.close_django_connections()
    params = bench.libpq_params(db)
    import django_dbqueue

    print(f"package: {Path(django_dbqueue.__file__).parent}")
    print(f"database: {args.database}; jobs: {args.jobs}; repeat: {args.repeat}")
    results = {side: [] for side in SIDES}
    with psycopg.connect(**params, autocommit=True) as admin:
        env = bench.Env(params=params, admin=admin)
        for rep in range(args.repeat):
            order = SIDES[rep % len(SIDES) :] + SIDES[: rep % len(SIDES)]
            for side in order:
                run = drain(env, side, args)
                run["jobs_per_s"] = args.jobs / run["seconds"]
                results[side].append(run)
                print(f"  run {rep + 1} {side:>9}: {run['jobs_per_s']:9,.0f} jobs/s", flush=True)

    print()
    print(f"{'side':>10} {'jobs/s (median)':>16} {'min':>9} {'max':>9}")
    for side in SIDES:
        values = [r["jobs_per_s"] for r in results[side]]
        print(
            f"{side:>10} {statistics.median(values):16,.0f} {min(values):9,.0f} {max(values):9,.0f}"
        )
    ratios = sorted(
        b["jobs_per_s"] / p["jobs_per_s"]
        for b, p in zip(results["batch-100"], results["plain"], strict=True)
    )
    print()
    print(
        f"batch-100 / plain: {statistics.median(ratios):.2f}x "
        f"[{ratios[0]:.2f}..{ratios[-1]:.2f}] (run by run)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
