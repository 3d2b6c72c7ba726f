#!/usr/bin/env python
"""Fair queues (docs/fairness.md): one tenant's backlog against 100 other tenants' single jobs.

For each side, a real ``run_jobqueue`` process (``benchmarks/fair_settings.py``: every setting at
its default) runs while one tenant enqueues ``--backlog`` no-op jobs in one statement, then 100
other tenants enqueue one job each (one statement each). On the ``plain`` side the jobs go to the
plain queue ``default``, on the ``fair`` side to the fair queue ``tenants``; every job carries
its tenant as ``fair_key``. Figures, in database time: how long each of the 100 waited from its
enqueue to its start (``started_at - created_at``: p50, max), and the drain rate of the whole
backlog (jobs / (last finished_at - first started_at)). The sides alternate, rotated each repeat.

    python benchmarks/fair_queues.py [--backlog 50000] [--tenants 100] [--repeat 2]
                                     [--database NAME] [--claims]

``--claims``: also time the fair claim statement itself (EXPLAIN ANALYZE, rolled back, batch
of 50) on a queue with 1, 100 and 10,000 keys, and the plain claim beside it.

``--blocked``: time the claim of 50 (50 free threads) on a queue where N keys (100, 1,000,
10,000) each have a job running and two waiting for their serial turn (serial key = fair key),
sorted before 100 free keys of one job each: the fair walk passes over the blocked keys (each
read once, as the plain claim reads their blocked jobs), and how many jobs each claim took.
"""

from __future__ import annotations

import argparse
import os
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

BACKLOG = """
INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                         max_attempts, lease_seconds, errors, created_at, fair_key)
SELECT 'bench-noop', %(queue)s, '{}', 'pending', 0, now(), 0, 10, 60, '[]', now(), 'big'
FROM generate_series(1, %(n)s)
"""
ONE = """
INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                         max_attempts, lease_seconds, errors, created_at, fair_key)
VALUES ('bench-noop', %(queue)s, '{}', 'pending', 0, now(), 0, 10, 60, '[]', now(), %(key)s)
"""
WAITS = """
SELECT EXTRACT(EPOCH FROM started_at - created_at)::float8 FROM dbqueue_job
WHERE fair_key <> 'big' ORDER BY 1
"""
SPAN = "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 FROM dbqueue_job"
LEFT = "SELECT count(*) FROM dbqueue_job WHERE state <> 'done'"
TENANTS_LEFT = "SELECT count(*) FROM dbqueue_job WHERE fair_key <> 'big' AND state <> 'done'"


def run_side(env, side, args):
    env.reset()
    queue = "tenants" if side == "fair" else "default"
    child_env = dict(os.environ)
    child_env.update(
        DJANGO_SETTINGS_MODULE="benchmarks.fair_settings",
        DBQUEUE_BENCH_DATABASE=args.database,
        PYTHONPATH=str(REPO) + os.pathsep + child_env.get("PYTHONPATH", ""),
    )
    cmd = [sys.executable, "-m", "django", "run_jobqueue", "--queues", queue]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        # The worker is up when it has registered itself (docs: the worker registry).
        deadline = time.monotonic() + 60
        while not env.admin.execute("SELECT count(*) FROM dbqueue_worker").fetchone()[0]:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise bench.InvalidRun(f"run_jobqueue did not start ({proc.returncode})")
            time.sleep(0.05)
        env.admin.execute(BACKLOG, {"queue": queue, "n": args.backlog})
        env.admin.execute("SELECT pg_notify('dbqueue', %s)", [queue])
        for i in range(args.tenants):
            env.admin.execute(ONE, {"queue": queue, "key": f"t{i:04}"})
        env.admin.execute("SELECT pg_notify('dbqueue', %s)", [queue])
        deadline = time.monotonic() + args.deadline
        tenants_done_at = None
        while True:
            if tenants_done_at is None and not env.admin.execute(TENANTS_LEFT).fetchone()[0]:
                tenants_done_at = time.monotonic()
            if not env.admin.execute(LEFT).fetchone()[0]:
                break
            if proc.poll() is not None:
                raise bench.InvalidRun(f"run_jobqueue exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise bench.InvalidRun(f"{side}: jobs left after {args.deadline}s")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    waits = [row[0] for row in env.admin.execute(WAITS).fetchall()]
    assert len(waits) == args.tenants, waits
    span = env.admin.execute(SPAN).fetchone()[0]
    return {
        "p50": statistics.median(waits),
        "max": max(waits),
        "jobs_per_s": (args.backlog + args.tenants) / span,
    }


def time_claims(env):
    """The fair claim's own cost (EXPLAIN ANALYZE, rolled back) with 1, 100 and 10,000 keys."""
    from django_dbqueue import store

    print("\nclaim of 50 on a backlog of 50,000 jobs of one key plus N keys of 5 jobs each")
    print(f"{'keys':>7} {'fair ms (median of 7)':>22} {'plain ms':>9}")
    for keys in (1, 100, 10_000):
        env.reset()
        env.admin.execute(BACKLOG, {"queue": "tenants", "n": 50_000})
        if keys > 1:
            env.admin.execute(
                """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after,
                       attempts, max_attempts, lease_seconds, errors, created_at, fair_key)
                   SELECT 'bench-noop', 'tenants', '{}', 'pending', 0, now(), 0, 10, 60, '[]',
                          now(), 'k' || (g %% %(keys)s)
                   FROM generate_series(1, %(n)s) AS g""",
                {"keys": keys - 1, "n": 5 * (keys - 1)},
            )
        env.admin.execute("VACUUM ANALYZE dbqueue_job")
        figures = {}
        for side, fair in (("fair", [True]), ("plain", None)):
            statement, params = store.claim_statement(
                worker_id="b",
                queues=["tenants"],
                limits=[50],
                limit=50,
                token=1,
                fair=fair,
                cursors={"tenants": "k5"},
            )
            times = []
            for _ in range(7):
                with env.admin.transaction(force_rollback=True):
                    rows = env.admin.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
                    times.append(rows.fetchone()[0][0]["Execution Time"])
            figures[side] = statistics.median(times)
        print(f"{keys:>7,} {figures['fair']:22.2f} {figures['plain']:9.2f}")


BLOCKED = """
INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                         max_attempts, lease_seconds, errors, created_at, fair_key, serial_key,
                         started_at, leased_until, worker_id, lease_token)
SELECT 'bench-noop', 'tenants', '{}', CASE WHEN s = 0 THEN 'running' ELSE 'pending' END, 0,
       now(), (s = 0)::int, 10, 60, '[]', now(), 'b' || lpad(g::text, 5, '0'),
       'b' || lpad(g::text, 5, '0'), CASE WHEN s = 0 THEN now() END,
       CASE WHEN s = 0 THEN now() + interval '1 hour' END,
       CASE WHEN s = 0 THEN 'other' END, CASE WHEN s = 0 THEN 7 END
FROM generate_series(1, %(keys)s) AS g, generate_series(0, 2) AS s
ORDER BY g, s
"""


def time_blocked(env):
    """The claim of 50 with N keys blocked on their serial turn ahead of 100 free keys."""
    from django_dbqueue import store

    print("\nclaim of 50 (50 threads), N keys each with 1 job running and 2 waiting their serial")
    print("turn, sorted before 100 free keys of 1 job each")
    print(f"{'keys':>7} {'fair ms':>8} {'fair got':>9} {'plain ms':>9} {'plain got':>10}")
    for keys in (100, 1_000, 10_000):
        env.reset()
        env.admin.execute(BLOCKED, {"keys": keys})
        for i in range(100):
            env.admin.execute(ONE, {"queue": "tenants", "key": f"f{i:04}"})
        env.admin.execute("VACUUM ANALYZE dbqueue_job")
        figures = {}
        for side, fair in (("fair", [True]), ("plain", None)):
            statement, params = store.claim_statement(
                worker_id="b",
                queues=["tenants"],
                limits=[50],
                limit=50,
                token=1,
                threads=50,
                fair=fair,
                cursors={"tenants": ""},
            )
            times, got = [], 0
            for _ in range(5):
                with env.admin.transaction(force_rollback=True):
                    rows = env.admin.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
                    times.append(rows.fetchone()[0][0]["Execution Time"])
                    got = env.admin.execute(
                        "SELECT count(*) FROM dbqueue_job WHERE worker_id = 'b'"
                    ).fetchone()[0]
            figures[side] = (statistics.median(times), got)
        (fair_ms, fair_got), (plain_ms, plain_got) = figures["fair"], figures["plain"]
        print(f"{keys:>7,} {fair_ms:8.2f} {fair_got:9} {plain_ms:9.2f} {plain_got:10}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=50_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--database", default="dbqueue_bench_fair")
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--claims", action="store_true")
    parser.add_argument("--blocked", action="store_true")
    args = parser.parse_args(argv)
    args.synchronous_commit, args.django_prepared = "server", False
    db = bench.bench_database(args)
    bench.ensure_database(db, args.database)
    bench.setup_django(db, dbqueue={"QUEUES": {"default": {}, "tenants": {"fair": True}}})
    bench.close_django_connections()
    params = bench.libpq_params(db)
    print(f"database: {args.database}; backlog: {args.backlog}; tenants: {args.tenants}")
    results = {"plain": [], "fair": []}
    with psycopg.connect(**params, autocommit=True) as admin:
        env = bench.Env(params=params, admin=admin)
        for rep in range(args.repeat):
            for side in ("plain", "fair") if rep % 2 == 0 else ("fair", "plain"):
                run = run_side(env, side, args)
                results[side].append(run)
                print(
                    f"  run {rep + 1} {side:>5}: tenants waited p50 {run['p50']:7.3f} s, "
                    f"max {run['max']:7.3f} s; drain {run['jobs_per_s']:8,.0f} jobs/s",
                    flush=True,
                )
        if not args.repeat:  # --repeat 0: the statement timings only
            results = {}
        if results:
            print()
            print(f"{'side':>6} {'p50 wait s':>11} {'max wait s':>11} {'drain jobs/s':>13}")
            for side, runs in results.items():
                print(
                    f"{side:>6} {statistics.median(r['p50'] for r in runs):11.3f} "
                    f"{statistics.median(r['max'] for r in runs):11.3f} "
                    f"{statistics.median(r['jobs_per_s'] for r in runs):13,.0f}"
                )
            fair_rate = statistics.median(r["jobs_per_s"] for r in results["fair"])
            plain_rate = statistics.median(r["jobs_per_s"] for r in results["plain"])
            print(f"drain fair / plain: {fair_rate / plain_rate:.2f}x")
        if args.claims:
            time_claims(env)
        if args.blocked:
            time_blocked(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
