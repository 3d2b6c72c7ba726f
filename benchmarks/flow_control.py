"""Serial keys and unique keys against the plain paths (issue 10), in the same invocation.

- **drain**: one in-process ``Worker(burst=True)`` at default settings (bench.py's drain)
  drains N no-op jobs without keys, then N no-op jobs spread over ``--keys`` serial keys
  (interleaved: job i has key i % keys, so each key's jobs wait behind each other). The keyed
  run is checked: per key, no job started before the previous one (by id) had finished.
- **fleet**: ``--fleet-jobs`` (300) jobs that each sleep ``--sleep`` (50 ms), drained by 3
  worker processes (``Worker(concurrency=4)``, 12 threads, 0.2 s poll, no LISTEN), timed from
  "go" until every job is done. Side "serial": the jobs spread over ``--fleet-keys`` (10) serial
  keys, interleaved, so at most 10 run at once and the best possible time is
  jobs / keys * sleep; side "unkeyed": the same jobs without keys. Each worker's share of the
  jobs is printed: a worker holding keys it cannot run yet starves the others.
- **enqueue**: one transaction per job, ``enqueue("bench-noop", ...)`` against the same with
  ``unique_key=<distinct>`` and ``unique_while="pending"`` (every call inserts: the price of the
  conflict-checked INSERT), and with ``serial_key=<one of --keys>``.

Each run starts from empty, vacuumed tables; ``--repeat`` alternates the sides and reports
medians.

    python benchmarks/flow_control.py
    python benchmarks/flow_control.py --jobs 20000 --enqueues 3000 --keys 100 --repeat 3
    python benchmarks/flow_control.py --only fleet --repeat 3
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench import (  # noqa: E402
    QUEUE,
    Env,
    bench_database,
    close_django_connections,
    drain_ours,
    ensure_database,
    libpq_params,
    setup_django,
)

# bench.py's FILL, with a serial key per job.
FILL_SERIAL = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at, serial_key
)
SELECT 'bench-noop', %(queue)s, jsonb_build_object('i', g), 'pending', 0, now(), 0, 10, 60.0,
       '[]'::jsonb, now(), 'k' || (g %% %(keys)s)
FROM generate_series(1, %(n)s) AS g
"""

# The fleet's jobs: each sleeps, keyed (10 keys, interleaved) or not.
FILL_FLEET = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at, serial_key
)
SELECT 'bench-sleep', %(queue)s, jsonb_build_object('sleep', %(sleep)s::float8), 'pending', 0,
       now(), 0, 10, 60.0, '[]'::jsonb, now(),
       CASE WHEN %(keys)s > 0 THEN 'k' || (g %% greatest(%(keys)s, 1)) END
FROM generate_series(1, %(n)s) AS g
"""

# Jobs of a key that started before the previous one of the key (by id) had finished.
OUT_OF_TURN = """
SELECT count(*) FROM (
    SELECT started_at, lag(finished_at) OVER (PARTITION BY serial_key ORDER BY id) AS previous
    FROM dbqueue_job
) AS runs
WHERE started_at < previous
"""


def drain_serial(env, n, keys):
    from django_dbqueue.worker import Worker

    env.reset()
    env.admin.execute(FILL_SERIAL, {"queue": QUEUE, "n": n, "keys": keys})
    env.admin.execute("VACUUM ANALYZE dbqueue_job")
    worker = Worker(burst=True)
    started = time.perf_counter()
    worker.run()
    seconds = time.perf_counter() - started
    close_django_connections()
    env.expect("drain (serial keys)", done=n)
    wrong = env.admin.execute(OUT_OF_TURN).fetchone()[0]
    if wrong:
        raise RuntimeError(f"{wrong} jobs started before the previous job of their key finished")
    return n / seconds


def fleet_child(args):
    """One worker process of the fleet workload: set up, say ready, run from "go" to "stop".

    Not a burst run: a burst worker ends on an empty claim, and with serial keys a claim can
    come back empty while other workers hold every key that has work left."""
    import threading

    db = bench_database(args)
    setup_django(db, migrate=False, dbqueue={"STATUS_INTERVAL": 0, "POLL_INTERVAL": 0.2})
    from django_dbqueue.worker import Worker

    worker = Worker(concurrency=4, listen=False)
    worker.session.execute("SELECT 1", {})
    print("ready", flush=True)
    sys.stdin.readline()
    thread = threading.Thread(target=worker.run)
    thread.start()
    sys.stdin.readline()
    worker.stop()
    thread.join()
    print(worker.claimed_total, flush=True)
    return 0


def drain_fleet(env, args, side):
    """Returns (jobs/s, each worker's share of the jobs)."""
    env.reset()
    keys = args.fleet_keys if side == "serial" else 0
    env.admin.execute(
        FILL_FLEET, {"queue": QUEUE, "n": args.fleet_jobs, "keys": keys, "sleep": args.sleep}
    )
    env.admin.execute("VACUUM ANALYZE dbqueue_job")
    command = [sys.executable, __file__, "--child", "--database", args.database]
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    done = "SELECT count(*) FROM dbqueue_job WHERE state = 'done'"
    deadline = started + 120
    while env.admin.execute(done).fetchone()[0] < args.fleet_jobs:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"fleet drain ({side}): not done after 120 s")
        time.sleep(0.005)
    seconds = time.perf_counter() - started
    for child in children:
        child.stdin.write("stop\n")
        child.stdin.flush()
    shares = sorted(int(child.communicate()[0].strip() or 0) for child in children)
    env.expect(f"fleet drain ({side})", done=args.fleet_jobs)
    if keys and env.admin.execute(OUT_OF_TURN).fetchone()[0]:
        raise RuntimeError("a job started before the previous job of its key finished")
    return args.fleet_jobs / seconds, shares


def enqueue_side(env, n, side, keys):
    from django.db import connection, transaction

    from django_dbqueue import enqueue

    env.reset()
    connection.ensure_connection()
    started = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            if side == "plain":
                enqueue("bench-noop", {"i": i})
            elif side == "unique":
                enqueue("bench-noop", {"i": i}, unique_key=f"u{i}", unique_while="pending")
            else:
                enqueue("bench-noop", {"i": i}, serial_key=f"k{i % keys}")
    seconds = time.perf_counter() - started
    close_django_connections()
    env.expect(f"enqueue ({side})", pending=n)
    return n / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--enqueues", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", default="drain,enqueue")
    parser.add_argument("--database", default="dbqueue_bench")
    parser.add_argument("--synchronous-commit", default=None, choices=["on", "off"])
    parser.add_argument("--django-prepared", action="store_true")
    parser.add_argument("--fleet-jobs", type=int, default=300)
    parser.add_argument("--fleet-keys", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return fleet_child(args)
    db = bench_database(args)
    ensure_database(db, args.database)
    setup_django(db)
    env = Env(libpq_params(db), psycopg.connect(**libpq_params(db), autocommit=True))
    only = set(args.only.split(","))
    results = {}
    for run in range(args.repeat):
        sides = []
        if "drain" in only:
            sides += [("drain", "plain"), ("drain", "serial")]
        if "enqueue" in only:
            sides += [("enqueue", "plain"), ("enqueue", "unique"), ("enqueue", "serial")]
        if "fleet" in only:
            sides += [("fleet", "unkeyed"), ("fleet", "serial")]
        if run % 2:
            sides.reverse()
        for workload, side in sides:
            if workload == "fleet":
                value, shares = drain_fleet(env, args, side)
                results.setdefault((workload, side), []).append(value)
                print(f"run {run + 1} fleet {side}: {value:,.0f} jobs/s, shares {shares}")
                continue
            if workload == "drain":
                value = (
                    drain_ours(env, args.jobs)["value"]
                    if side == "plain"
                    else drain_serial(env, args.jobs, args.keys)
                )
            else:
                value = enqueue_side(env, args.enqueues, side, args.keys)
            results.setdefault((workload, side), []).append(value)
            print(f"run {run + 1} {workload} {side}: {value:,.0f} jobs/s")
    print(f"\nmedians of {args.repeat} run(s), one process, {args.keys} keys")
    if ("fleet", "serial") in results:
        best = args.fleet_keys / args.sleep
        m = statistics.median(results[("fleet", "serial")])
        print(
            f"  fleet    serial   {m:10,.0f} jobs/s   {m / best:5.2f}x of the best possible "
            f"({args.fleet_keys} keys / {args.sleep * 1000:g} ms = {best:,.0f} jobs/s)"
        )
    if ("fleet", "unkeyed") in results:
        m = statistics.median(results[("fleet", "unkeyed")])
        print(f"  fleet    unkeyed  {m:10,.0f} jobs/s   (12 threads, no keys)")
    for workload, plain in (("drain", "plain"), ("enqueue", "plain")):
        if (workload, plain) not in results:
            continue
        base = statistics.median(results[(workload, plain)])
        for (w, side), values in results.items():
            if w == workload:
                m = statistics.median(values)
                print(f"  {workload:8} {side:8} {m:10,.0f} jobs/s   {m / base:5.2f}x of plain")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
