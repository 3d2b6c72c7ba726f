#!/usr/bin/env python
"""What a wake-up adds to the commit of a transaction that enqueued, on one connection.

Two ways to end the same small transaction (``SELECT 1`` inside it), each timed over
``--n`` transactions, alternating in ``--rounds`` rounds, on a plain psycopg connection of the
local PostgreSQL (``DATABASE_URL``; its database is only read, never written):

  commit            the COMMIT alone (no wake-up: the floor)
  commit+statement  the COMMIT, then the wake-up as a statement of its own
                    (``wakeups.NOTIFY`` through a psycopg cursor: the on_commit hook's way,
                    what ``transaction.atomic()`` does; the COMMIT and the wake-up in one libpq
                    pipeline, which this script also timed, went with Django's private
                    ``connection._commit`` that it needed: docs/wakeups.md)

Reported per side: client CPU (``time.process_time``) and wall time per transaction, medians of
the rounds, and each side's extra over the bare COMMIT. The notifications go to a channel of
this script's own, which nothing listens on.

    python benchmarks/commit_wakeup.py [--n 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import environ
import psycopg

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from django_dbqueue.store import wakeups  # noqa: E402 - after the path set-up above

CHANNEL = "dbqueue_bench_commit_wakeup"
PAYLOADS = ["1:default"]


def connect():
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    db = environ.Env.db_url_config(url)
    return psycopg.connect(
        host=db.get("HOST") or None,
        port=db.get("PORT") or None,
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        dbname=db.get("NAME") or "postgres",
    )


def sides(conn):
    def commit():
        conn.execute("SELECT 1")
        conn.commit()

    def commit_statement():
        conn.execute("SELECT 1")
        conn.commit()
        conn.autocommit = True
        psycopg.Cursor(conn).execute(
            wakeups.NOTIFY, {"channel": CHANNEL, "payloads": PAYLOADS}, prepare=False
        )
        conn.autocommit = False

    return {
        "commit": commit,
        "commit+statement": commit_statement,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="transactions per side and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    conn = connect()
    runs = sides(conn)
    cpu = {name: [] for name in runs}
    wall = {name: [] for name in runs}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(args.n):
                runs[name]()
            cpu[name].append(1e6 * (time.process_time() - c0) / args.n)
            wall[name].append(1e6 * (time.perf_counter() - t0) / args.n)
    conn.close()
    base_cpu, base_wall = statistics.median(cpu["commit"]), statistics.median(wall["commit"])
    print(
        f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), {args.n} tx x {args.rounds} rounds"
    )
    print(f"{'side':18s} {'CPU us/tx':>10s} {'extra':>7s} {'wall us/tx':>11s} {'extra':>7s}")
    for name in runs:
        c, w = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"{name:18s} {c:10.0f} {c - base_cpu:+7.0f} {w:11.0f} {w - base_wall:+7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
