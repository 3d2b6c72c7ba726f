"""Serial keys and unique keys against the plain paths (issue 10), in the same invocation.

- **drain**: one in-process ``Worker(burst=True)`` at default settings (bench.py's drain)
  drains N no-op jobs without keys, then N no-op jobs spread over ``--keys`` serial keys
  (interleaved: job i has key i % keys, so each key's jobs wait behind each other). The keyed
  run is checked: per key, no job started before the previous one (by id) had finished.
- **enqueue**: one transaction per job, ``enqueue("bench-noop", ...)`` against the same with
  ``unique_key=<distinct>`` and ``unique_while="pending"`` (every call inserts: the price of the
  conflict-checked INSERT), and with ``serial_key=<one of --keys>``.

Each run starts from empty, vacuumed tables; ``--repeat`` alternates the sides and reports
medians.

    python benchmarks/flow_control.py
    python benchmarks/flow_control.py --jobs 20000 --enqueues 3000 --keys 100 --repeat 3
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
    args = parser.parse_args()
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
        if run % 2:
            sides.reverse()
        for workload, side in sides:
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
