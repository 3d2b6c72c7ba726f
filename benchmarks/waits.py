#!/usr/bin/env python
"""What a snooze, a durable sleep and a wait for a signal cost, against plain jobs.

Each side drains ``--jobs`` jobs with the real ``run_jobqueue`` (a subprocess at the defaults,
non-burst, as ``drain_command.py`` runs it) and is timed in database time, from the first job's
``started_at`` to the last one's ``finished_at``:

- plain: ``bench-noop``, one run each;
- snooze: ``bench-snooze-once``, which snoozes for no time on its first run (two runs each);
- sleep: ``bench-sleep-once``, a durable ``ctx.sleep`` of 1 ms (its record, then a replay);
- signal: ``bench-signal-once``: the jobs run to their wait; ``signal_job`` is sent to each, all
  in one transaction (timed apart: signals per second); the resumed drain is timed from that
  commit to the last finish (the first runs, to the wait, are not in this side's figure).

The sides alternate, rotated each repeat; medians with their spread, and each side's jobs per
second as a ratio of the plain side's in the same repeat.

    python benchmarks/waits.py [--jobs 5000] [--repeat 3] [--database NAME]
"""

from __future__ import annotations

import argparse
import os
import signal as signals
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

SIDES = ("plain", "snooze", "sleep", "signal")
TYPES = {
    "plain": "bench-noop",
    "snooze": "bench-snooze-once",
    "sleep": "bench-sleep-once",
    "signal": "bench-signal-once",
}
FILL = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at
)
SELECT %(type)s, %(queue)s, jsonb_build_object('i', g), 'pending', 0, now(), 0, 10, 60.0,
       '[]'::jsonb, now()
FROM generate_series(1, %(n)s) AS g
"""
SPAN = "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 FROM dbqueue_job"
RESUMED_SPAN = """
SELECT EXTRACT(EPOCH FROM max(finished_at) - %(since)s::timestamptz)::float8 FROM dbqueue_job
"""
LEFT = "SELECT count(*) FROM dbqueue_job WHERE state <> 'done'"
SUSPENDED = """
SELECT count(*) FROM dbqueue_job
WHERE state = 'pending' AND wait_reason = 'signal:go' AND wait_token = lease_token
"""


def reset(env, side, n):
    env.reset()
    env.admin.execute("TRUNCATE dbqueue_step, dbqueue_signal")
    env.admin.execute(FILL, {"type": TYPES[side], "queue": bench.QUEUE, "n": n})
    env.admin.execute("VACUUM ANALYZE dbqueue_job")


def start_worker(database):
    child_env = dict(os.environ)
    child_env.update(
        DJANGO_SETTINGS_MODULE="benchmarks.drain_settings",
        DBQUEUE_BENCH_DATABASE=database,
        PYTHONPATH=str(REPO) + os.pathsep + child_env.get("PYTHONPATH", ""),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "django", "run_jobqueue"],
        cwd=REPO,
        env=child_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_for(env, proc, query, want, deadline, what):
    stop_at = time.monotonic() + deadline
    while (got := env.admin.execute(query).fetchone()[0]) != want:
        if proc.poll() is not None:
            raise bench.InvalidRun(f"run_jobqueue exited with {proc.returncode} ({what})")
        if time.monotonic() > stop_at:
            raise bench.InvalidRun(f"{what}: {got} after {deadline}s")
        time.sleep(0.05)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signals.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
    if proc.returncode != 0:
        raise bench.InvalidRun(f"run_jobqueue exited with {proc.returncode}:\n{err[-2000:]!r}")


def run_side(env, side, n, database, deadline):
    reset(env, side, n)
    proc = start_worker(database)
    result = {}
    try:
        if side != "signal":
            wait_for(env, proc, LEFT, 0, deadline, f"{side}: jobs left")
            result["seconds"] = env.admin.execute(SPAN).fetchone()[0]
        else:
            wait_for(env, proc, SUSPENDED, n, deadline, "signal: jobs waiting")
            result["seconds"], result["signals_per_s"] = signal_all(env, proc, n, deadline)
    finally:
        stop(proc)
    env.expect(side, done=n)
    result["jobs_per_s"] = n / result["seconds"]
    return result


def signal_all(env, proc, n, deadline):
    """Send every waiting job its signal through the public API, in one transaction (timed:
    signals per second), so that all of them come due at its commit; then time the resumed
    drain from that commit to the last finish."""
    from django.db import transaction

    from django_dbqueue import signal_job

    ids = [row[0] for row in env.admin.execute("SELECT id FROM dbqueue_job ORDER BY id")]
    started = time.perf_counter()
    with transaction.atomic():
        for job_id in ids:
            if signal_job(job_id, "go") is None:
                raise bench.InvalidRun(f"signal: job {job_id} took no signal")
    sent = time.perf_counter() - started
    since = env.admin.execute("SELECT now()").fetchone()[0]
    bench.close_django_connections()
    wait_for(env, proc, LEFT, 0, deadline, "signal: jobs left")
    span = env.admin.execute(RESUMED_SPAN, {"since": since}).fetchone()[0]
    return span, n / sent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", default="dbqueue_bench_waits")
    parser.add_argument("--deadline", type=float, default=300.0)
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
                run = run_side(env, side, args.jobs, args.database, args.deadline)
                results[side].append(run)
                extra = (
                    f", signal_job {run['signals_per_s']:,.0f}/s" if "signals_per_s" in run else ""
                )
                print(f"  run {rep + 1} {side:>7}: {run['jobs_per_s']:9,.0f} jobs/s{extra}")
    print()
    print(f"{'side':>8} {'jobs/s (median)':>16} {'min':>9} {'max':>9} {'/ plain':>16}")
    for side in SIDES:
        values = [r["jobs_per_s"] for r in results[side]]
        ratios = sorted(
            r["jobs_per_s"] / p["jobs_per_s"]
            for r, p in zip(results[side], results["plain"], strict=True)
        )
        print(
            f"{side:>8} {statistics.median(values):16,.0f} {min(values):9,.0f} "
            f"{max(values):9,.0f} {statistics.median(ratios):6.2f}x "
            f"[{ratios[0]:.2f}..{ratios[-1]:.2f}]"
        )
    sends = [r["signals_per_s"] for r in results["signal"]]
    print(f"signal_job, all in one transaction: {statistics.median(sends):,.0f}/s (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
