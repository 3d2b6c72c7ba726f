#!/usr/bin/env python
"""``publish()`` to 1, 5 and 20 subscribers against the same jobs written by ``enqueue()`` and by
``enqueue_many()`` in one transaction (issue 28, publish and subscribe).

For each fan-out k, three sides write ``--events`` transactions each, committed, timed from before
the first to after the last commit, every transaction making k jobs (no-op subscribers, a small
JSON payload, queue ``default``):

  publish       ``publish("bench.fanout-k", payload)``: the event row and its k jobs, one statement
  enqueue       k ``enqueue(type_i, payload)`` calls
  enqueue_many  one ``enqueue_many([(type_i, payload) ...])`` call

No worker waits, so nobody is notified. Tables are truncated before each run; the sides run in a
rotated order each repeat; medians of jobs/s, and the ratios of publish's time to each other
side's, paired within a repeat.

    python benchmarks/publish.py [--events 400] [--repeat 3] [--database NAME] [--json FILE]
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

SIDES = ("publish", "enqueue", "enqueue_many")
FANOUTS = (1, 5, 20)


def register(k):
    from django_dbqueue import job, registry

    types = [f"bench-sub-{k}-{i}" for i in range(k)]
    for name in types:
        if registry.get(name) is None:
            job(name, subscribes=[f"bench.fanout-{k}"])(lambda ctx: None)
    return types


def payload(i):
    return {"invoice_id": i, "email": f"customer-{i}@example.com"}


def run(side, k, types, n):
    from django.db import transaction

    from django_dbqueue import enqueue, enqueue_many, publish

    event = f"bench.fanout-{k}"
    started = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            if side == "publish":
                publish(event, payload(i))
            elif side == "enqueue":
                for t in types:
                    enqueue(t, payload(i))
            else:
                enqueue_many([(t, payload(i)) for t in types])
    return time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=400, help="transactions per side and k")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", default="dbqueue_bench_publish")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if min(args.events, args.repeat) < 1:
        parser.error("--events and --repeat must be at least 1")
    args.synchronous_commit, args.django_prepared = "server", False

    db = bench.bench_database(args)
    bench.ensure_database(db, args.database)
    bench.setup_django(db)
    bench.close_django_connections()
    params = bench.libpq_params(db)
    import django_dbqueue

    print(f"package: {Path(django_dbqueue.__file__).parent}")
    print(
        f"database: {args.database}; {args.events} transactions per side and fan-out; "
        f"repeat: {args.repeat}"
    )
    results = {(k, side): [] for k in FANOUTS for side in SIDES}
    with psycopg.connect(**params, autocommit=True) as admin:
        env = bench.Env(params=params, admin=admin)
        print(f"commit_ms: {env.commit_ms():.2f}")
        for k in FANOUTS:
            types = register(k)
            for rep in range(args.repeat):
                order = SIDES[rep % len(SIDES) :] + SIDES[: rep % len(SIDES)]
                for side in order:
                    env.reset()
                    admin.execute("TRUNCATE dbqueue_event RESTART IDENTITY")
                    seconds = run(side, k, types, args.events)
                    jobs = admin.execute("SELECT count(*) FROM dbqueue_job").fetchone()[0]
                    if jobs != k * args.events:
                        raise bench.InvalidRun(f"{side} k={k}: {jobs} jobs, not {k * args.events}")
                    results[(k, side)].append(seconds)
                    print(
                        f"  k={k:>2} run {rep + 1} {side:>12}: "
                        f"{k * args.events / seconds:9,.0f} jobs/s",
                        flush=True,
                    )
    summary = {}
    print()
    print(f"{'k':>3} {'side':>12} {'jobs/s (median)':>16} {'[min..max]':>20}")
    for (k, side), values in results.items():
        rates = [k * args.events / s for s in values]
        summary[f"{k}:{side}"] = {"jobs_per_s": statistics.median(rates)}
        print(
            f"{k:>3} {side:>12} {statistics.median(rates):16,.0f} "
            f"{f'[{min(rates):,.0f}..{max(rates):,.0f}]':>20}"
        )
    print()
    for k in FANOUTS:
        for base in ("enqueue", "enqueue_many"):
            ratios = sorted(
                b / a for a, b in zip(results[(k, "publish")], results[(k, base)], strict=True)
            )
            med = statistics.median(ratios)
            summary[f"{k}:publish_vs_{base}"] = {"speedup": med}
            print(
                f"k={k:>2} publish is {med:.2f}x as fast as {base} "
                f"[{ratios[0]:.2f}..{ratios[-1]:.2f}] (paired within a repeat)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
