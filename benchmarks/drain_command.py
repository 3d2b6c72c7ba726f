#!/usr/bin/env python
"""The drain as users deploy it: the real ``run_jobqueue`` command, against plain-SQL loops.

``bench.py``'s drain runs an in-process burst ``Worker``; a regression in the command's own
process (its connections, its wake-up, its loop when not in burst mode) does not show there.
This one starts ``python -m django run_jobqueue`` as a subprocess, with no flags and every
DBQUEUE setting at its default (``benchmarks/drain_settings.py``), non-burst, on a backlog of
``--jobs`` pending no-op jobs written beforehand, and stops it with SIGTERM once every job is
done. Beside it, in the same invocation and on the same table, two plain psycopg loops claim
``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n)`` with n = 10 and
n = 100, run the no-op inline and complete each batch with one UPDATE.

Every side is timed the same way, in database time: from the first job's ``started_at`` to the
last job's ``finished_at``. So the command's start-up (Django, migrations check, connections)
is not counted, and neither is its wait for the first poll. The sides alternate, in a rotated
order each repeat; the median of ``--repeat`` runs is printed with the spread, and the
command's figure as a ratio of each loop's. While the command drains, the script also counts
the connections open on the bench database other than its own (the worker process's).

    python benchmarks/drain_command.py [--jobs 20000] [--repeat 3] [--database NAME]
                                       [--worker-args "--concurrency 10"] [--json FILE]

``benchmarks/against.py`` runs this script (or any other) against an earlier commit too.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
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

SIDES = ("command", "batch-10", "batch-100")
SPAN = "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 FROM dbqueue_job"
LEFT = "SELECT count(*) FROM dbqueue_job WHERE state <> 'done'"
OTHER_CONNECTIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
"""


def drain_loop(env, n, batch):
    """A plain psycopg loop claiming ``batch`` jobs at a time."""
    env.reset(fill=n)
    with psycopg.connect(**env.params, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                bench.BASE_CLAIM, {"worker": "baseline", "queue": bench.QUEUE, "limit": batch}
            ).fetchall()
            if not rows:
                break
            for _job_id, job_type, payload, _attempt in rows:
                bench.BASE_HANDLERS[job_type](json.loads(payload))
            conn.execute(bench.BASE_COMPLETE, {"ids": [row[0] for row in rows]})
    env.expect(f"drain (batch-{batch})", done=n)
    return {"seconds": env.admin.execute(SPAN).fetchone()[0]}


def drain_command(env, n, database, worker_args, deadline):
    """``run_jobqueue`` at the defaults, as a subprocess, until every job is done."""
    env.reset(fill=n)
    child_env = dict(os.environ)
    child_env.update(
        DJANGO_SETTINGS_MODULE="benchmarks.drain_settings",
        DBQUEUE_BENCH_DATABASE=database,
        PYTHONPATH=str(REPO) + os.pathsep + child_env.get("PYTHONPATH", ""),
    )
    cmd = [sys.executable, "-m", "django", "run_jobqueue", *shlex.split(worker_args)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    connections = 0
    try:
        stop_at = time.monotonic() + deadline
        while True:
            left = env.admin.execute(LEFT).fetchone()[0]
            connections = max(connections, env.admin.execute(OTHER_CONNECTIONS).fetchone()[0])
            if left == 0:
                break
            if proc.poll() is not None:
                raise bench.InvalidRun(f"run_jobqueue exited with {proc.returncode}: {left} left")
            if time.monotonic() > stop_at:
                raise bench.InvalidRun(f"run_jobqueue: {left} jobs left after {deadline}s")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
    if proc.returncode != 0:
        tail = err.decode(errors="replace")[-2000:]
        raise bench.InvalidRun(f"run_jobqueue exited with {proc.returncode}:\n{tail}")
    env.expect("drain (command)", done=n)
    return {"seconds": env.admin.execute(SPAN).fetchone()[0], "connections": connections}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", default="dbqueue_bench_drain")
    parser.add_argument("--worker-args", default="", help="extra run_jobqueue arguments")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds per run at most")
    parser.add_argument("--json", metavar="FILE")
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
                if side == "command":
                    run = drain_command(
                        env, args.jobs, args.database, args.worker_args, args.deadline
                    )
                else:
                    run = drain_loop(env, args.jobs, int(side.split("-")[1]))
                run["jobs_per_s"] = args.jobs / run["seconds"]
                results[side].append(run)
                extra = f", {run['connections']} connections" if "connections" in run else ""
                print(
                    f"  run {rep + 1} {side:>9}: {run['jobs_per_s']:9,.0f} jobs/s{extra}",
                    flush=True,
                )

    def med(side):
        return statistics.median(r["jobs_per_s"] for r in results[side])

    print()
    print(f"{'side':>10} {'jobs/s (median)':>16} {'min':>9} {'max':>9}")
    for side in SIDES:
        values = [r["jobs_per_s"] for r in results[side]]
        print(f"{side:>10} {med(side):16,.0f} {min(values):9,.0f} {max(values):9,.0f}")
    print()
    for loop in ("batch-10", "batch-100"):
        ratios = sorted(
            c["jobs_per_s"] / b["jobs_per_s"]
            for c, b in zip(results["command"], results[loop], strict=True)
        )
        print(
            f"command / {loop}: {statistics.median(ratios):.2f}x "
            f"[{ratios[0]:.2f}..{ratios[-1]:.2f}] (run by run)"
        )
    conns = max(r["connections"] for r in results["command"])
    print(f"connections of the run_jobqueue process, at most: {conns}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
