#!/usr/bin/env python
"""The producer's own CPU per enqueuing transaction, counted in instructions (callgrind).

``fleet.py`` measures 8 producers at once in transactions per second; on a 2-core machine they
are bound by their own Python CPU, and on a shared virtual machine the rate of the same code
moves by half from one minute to the next. Instructions do not: ``valgrind --tool=callgrind``
counts the same total for the same code and inputs whatever else the machine does. So this
script counts what one producer process executes per transaction, for the sides of
``fleet.py`` (the same functions: ``fleet.django_transaction`` / ``psycopg_transaction``):

  ours         ``transaction.atomic()``: the invoice INSERT on Django's cursor, ``enqueue()``
               (no worker waits, so no wake-up is sent: fleet.py's "ours")
  django-bare  baseline (a): the same invoice INSERT and a bare job INSERT without NOTIFY, on
               Django's cursor in ``transaction.atomic()``
  psycopg      baseline (b): the same two statements on a plain psycopg connection

Each side runs in a process of its own under callgrind twice, with 200 warm-up transactions
and then with ``--count`` more; the difference divided by ``--count`` is the cost of one
transaction, free of start-up and import. ``--compare PATH`` also counts "ours" of another
checkout (the previous landing, say) in the same invocation. The server's CPU is not in
these figures (fleet.py reports it from /proc).

    python benchmarks/enqueue_cost.py [--count 500] [--compare ../before]

Needs valgrind; uses bench.py's database (``dbqueue_bench``) on ``DATABASE_URL``'s server.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import fleet  # noqa: E402
from benchmarks.bench import bench_database, ensure_database  # noqa: E402

SIDES = ["django-bare", "ours", "psycopg"]
WARM_UP = 200

# What each counted process runs: the side's transaction from ``repo``'s fleet.py.
CHILD = """
import argparse, sys
sys.path.insert(0, sys.argv[1])
from benchmarks import fleet
from benchmarks.bench import bench_database, libpq_params
db = bench_database(argparse.Namespace(
    database=sys.argv[4], synchronous_commit="server", django_prepared=False))
side = sys.argv[2]
if side.startswith(("ours", "django")):
    fleet.setup_django(db, migrate=False)
    run, _ = fleet.django_transaction(side)
else:
    run, _ = fleet.psycopg_transaction(side, libpq_params(db))
for i in range(int(sys.argv[3])):
    run(i)
"""


def count(repo, side, n, database):
    """Instructions of one process running ``n`` transactions of ``side`` from ``repo``."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-c",
        CHILD,
        str(repo),
        side,
        str(n),
        database,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{side} ({repo}) failed under valgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_transaction(repo, side, n, database):
    base = count(repo, side, WARM_UP, database)
    return (count(repo, side, WARM_UP + n, database) - base) / n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=500, help="transactions counted per side")
    parser.add_argument("--compare", metavar="PATH", help="also count 'ours' of this checkout")
    parser.add_argument("--database", default="dbqueue_bench")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    if shutil.which("valgrind") is None:
        raise SystemExit("enqueue_cost.py needs valgrind (apt-get install valgrind)")
    if args.compare and not (Path(args.compare) / "benchmarks" / "fleet.py").exists():
        parser.error(f"--compare {args.compare}: no benchmarks/fleet.py there")
    db = bench_database(
        argparse.Namespace(
            database=args.database, synchronous_commit="server", django_prepared=False
        )
    )
    ensure_database(db, args.database)
    fleet.setup_django(db)  # migrated once here, by this checkout; the counted ones do not
    print(
        f"client instructions per transaction, {args.count} counted after {WARM_UP} warm-up "
        f"(valgrind --tool=callgrind; python {sys.version.split()[0]})"
    )
    rows = [(side, REPO, side) for side in SIDES]
    if args.compare:
        rows.append((f"ours ({args.compare})", Path(args.compare).resolve(), "ours"))
    figures = {}
    for label, repo, side in rows:
        figures[label] = per_transaction(repo, side, args.count, args.database)
        print(f"  {label:<28} {figures[label] / 1000:>9,.1f} k", flush=True)
    bare = figures["django-bare"]
    print(
        f"ours/django-bare  {figures['ours'] / bare:.3f}x  (client CPU; 1.000x is the "
        "bare INSERT's cost)"
    )
    if args.compare:
        before = figures[f"ours ({args.compare})"]
        print(
            f"ours ({args.compare})/django-bare  {before / bare:.3f}x;  "
            f"ours/ours ({args.compare})  {figures['ours'] / before:.3f}x"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")  # the same dict layouts in every process
    sys.exit(main())
