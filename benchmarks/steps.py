#!/usr/bin/env python
"""What a durable step costs: ``ctx.step("s", f)`` against calling ``f()`` directly, and a replay.

Each side drains ``--jobs`` jobs with the real ``run_jobqueue`` (a subprocess at the defaults,
non-burst, as ``drain_command.py`` and ``waits.py`` run it) and is timed in database time, from
the first job's ``started_at`` to the last one's ``finished_at`` (the worker's start-up and its
first poll are not counted). The handlers (benchmarks/benchapp/step_jobs.py) return the list of
their calls' results, the same on every side:

- plain-1, plain-5: ``bench-calls``, ``f(i)`` called 1 or 5 times directly;
- step-1, step-5: ``bench-steps``, the same calls as ``ctx.step("s", f, i)``: 1 or 5 steps of one
  name, each recorded (one ``INSERT`` in autocommit, a commit each) when it returns;
- replay-5: ``bench-steps`` with its 5 steps recorded before the drain (written into
  ``dbqueue_step`` with the backlog), so that every step returns its record and ``f`` never
  runs: what a job that runs again after its steps finished pays for them;
- query-5: ``bench-calls`` calling ``f`` 5 times after running, by hand on the job's connection,
  the one query that a run with steps makes to read its records (which are written beforehand,
  as for replay-5, so that it reads the same 5 rows): the reference that tells how much of a
  replay is that query.

The sides alternate, rotated each repeat; each side's jobs per second is given as a ratio of the
plain side with as many calls in the same repeat (step-1 / plain-1, step-5 / plain-5,
replay-5 / plain-5, and replay-5 / query-5), with the median and the spread, and the drain time each step adds (the
difference of the two sides' drain times over the steps run). A step's cost is mostly its
commit: ``commit_ms`` (a one-row UPDATE committed with a WAL flush, measured before each repeat)
is printed with the figures.

Each run is checked: every job done with the results its side must return (a replayed step
returns its record, which differs from what ``f`` returns), and ``dbqueue_step`` holding exactly
one record per step of the step sides (none added by a replay).

    python benchmarks/steps.py [--jobs 3000] [--repeat 3] [--database NAME] [--json FILE]
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

from benchmarks import bench, waits  # noqa: E402

# side -> (job type, calls per job, records written before the drain, the handler's own query)
SIDES = {
    "plain-1": ("bench-calls", 1, False, False),
    "step-1": ("bench-steps", 1, False, False),
    "plain-5": ("bench-calls", 5, False, False),
    "step-5": ("bench-steps", 5, False, False),
    "replay-5": ("bench-steps", 5, True, False),
    "query-5": ("bench-calls", 5, True, True),
}
RATIOS = (
    ("step-1", "plain-1"),
    ("step-5", "plain-5"),
    ("replay-5", "plain-5"),
    ("replay-5", "query-5"),
)
RESET = "TRUNCATE dbqueue_job, dbqueue_step, dbqueue_signal RESTART IDENTITY"
FILL = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at
)
SELECT %(type)s, %(queue)s, jsonb_build_object('i', g, 'n', %(calls)s, 'query', %(query)s),
       'pending', 0, now(), 0, 10, 60.0, '[]'::jsonb, now()
FROM generate_series(1, %(n)s) AS g
"""
# The records of every step of every job, as the steps' first runs would have written them,
# with results f() never returns (negative), so a result shows whether the step was replayed.
RECORD_ALL = """
INSERT INTO dbqueue_step (job_id, name, occurrence, result, attempt, finished_at)
SELECT j.id, 's', g, to_jsonb(-g), 1, now()
FROM dbqueue_job AS j, generate_series(1, %(calls)s) AS g
"""
SPAN = "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 FROM dbqueue_job"
WRONG_RESULTS = "SELECT count(*) FROM dbqueue_job WHERE result IS DISTINCT FROM %(want)s::jsonb"
STEP_RECORDS = "SELECT count(*), count(DISTINCT (job_id, name, occurrence)) FROM dbqueue_step"


def fill(env, side, n):
    job_type, calls, recorded, query = SIDES[side]
    env.admin.execute(RESET)
    env.admin.execute(
        FILL, {"type": job_type, "queue": bench.QUEUE, "calls": calls, "query": query, "n": n}
    )  # fmt: skip
    if recorded:
        env.admin.execute(RECORD_ALL, {"calls": calls})
    env.admin.execute("VACUUM ANALYZE dbqueue_job")
    env.admin.execute("VACUUM ANALYZE dbqueue_step")


def check(env, side, n):
    job_type, calls, recorded, _query = SIDES[side]
    steps = job_type == "bench-steps"
    env.expect(side, done=n)
    want = [-i if recorded and steps else i for i in range(1, calls + 1)]
    wrong = env.admin.execute(WRONG_RESULTS, {"want": json.dumps(want)}).fetchone()[0]
    if wrong:
        raise bench.InvalidRun(f"{side}: {wrong} jobs without the result {want}")
    records, distinct = env.admin.execute(STEP_RECORDS).fetchone()
    expected = n * calls if steps or recorded else 0
    if records != expected or distinct != records:
        raise bench.InvalidRun(
            f"{side}: {records} step records ({distinct} distinct), expected {expected}"
        )


def run_side(env, side, n, database, deadline):
    fill(env, side, n)
    proc = waits.start_worker(database)
    try:
        waits.wait_for(env, proc, waits.LEFT, 0, deadline, f"{side}: jobs left")
        seconds = env.admin.execute(SPAN).fetchone()[0]
    finally:
        waits.stop(proc)
    check(env, side, n)
    return {"seconds": seconds, "jobs_per_s": n / seconds}


def summarize(results, n):
    """``{side: {...}}`` and ``{"a/b": {...}}``: medians, spreads, paired ratios."""
    out = {}
    for side, runs in results.items():
        values = [r["jobs_per_s"] for r in runs]
        out[side] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    for a, b in RATIOS:
        pairs = list(zip(results[a], results[b], strict=True))
        ratios = sorted(x["jobs_per_s"] / y["jobs_per_s"] for x, y in pairs)
        steps = n * SIDES[a][1]
        # Drain time the steps added, per step run (or replayed), in microseconds.
        extra = sorted((x["seconds"] - y["seconds"]) / steps * 1e6 for x, y in pairs)
        out[f"{a}/{b}"] = {
            "ratio": statistics.median(ratios),
            "ratio_min": ratios[0],
            "ratio_max": ratios[-1],
            "us_per_step": statistics.median(extra),
            "us_min": extra[0],
            "us_max": extra[-1],
        }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per side and run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", default="dbqueue_bench_steps")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds per run at most")
    parser.add_argument("--json", metavar="FILE", help="every run and the summary as JSON")
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

    began = time.monotonic()
    print(f"package: {Path(django_dbqueue.__file__).parent}")
    print(f"database: {args.database}; jobs: {args.jobs} per side and run; repeat: {args.repeat}")
    names = list(SIDES)
    results = {side: [] for side in names}
    commits = []
    with psycopg.connect(**params, autocommit=True) as admin:
        env = bench.Env(params=params, admin=admin)
        for rep in range(args.repeat):
            commits.append(env.commit_ms())
            print(f"repeat {rep + 1}: commit_ms {commits[-1]:.2f}")
            for side in names[rep % len(names) :] + names[: rep % len(names)]:
                run = run_side(env, side, args.jobs, args.database, args.deadline)
                results[side].append(run)
                print(f"  {side:>8}: {run['jobs_per_s']:9,.0f} jobs/s ({run['seconds']:.2f}s)")
    summary = summarize(results, args.jobs)
    print()
    print(f"{'side':>8} {'jobs/s (median)':>16} {'min':>9} {'max':>9}")
    for side in names:
        row = summary[side]
        print(f"{side:>8} {row['median']:16,.0f} {row['min']:9,.0f} {row['max']:9,.0f}")
    print()
    print(
        f"{'ratio':>19} {'median':>7} {'[min..max]':>14} {'drain us per step':>18} {'[min..max]':>16}"
    )
    for a, b in RATIOS:
        row = summary[f"{a}/{b}"]
        print(
            f"{a + ' / ' + b:>19} {row['ratio']:6.2f}x [{row['ratio_min']:.2f}..{row['ratio_max']:.2f}]"
            f" {row['us_per_step']:+18.0f} [{row['us_min']:+.0f}..{row['us_max']:+.0f}]"
        )
    print(
        f"commit_ms median {statistics.median(commits):.2f} [{min(commits):.2f}..{max(commits):.2f}]"
        f"; took {time.monotonic() - began:.0f}s"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"jobs": args.jobs, "commit_ms": commits, "runs": results, "summary": summary},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
