#!/usr/bin/env python
"""django-dbqueue against a plain-SQL baseline, on the local PostgreSQL, in one invocation.

Three workloads, each run by both sides on the same ``dbqueue_job`` table (same indexes, same
CHECKs), truncated before every run:

- drain: 20,000 pending no-op jobs, one worker process. Ours is the real
  ``Worker(burst=True).run()`` at default settings, timed from start to return (every job done
  and acknowledged). The baseline is one psycopg connection claiming batches of 10 with
  ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 10)``, running the handlers
  inline and completing each batch with one UPDATE.
- drain-io: 3,000 pending jobs that each sleep 1 ms (``bench-sleep``: a handler waiting on I/O,
  which lets the claim loop run while it waits), one worker process. Ours: the real
  ``Worker(burst=True).run()`` at default settings (10 handler threads). The baseline: the same
  claim of batches of 10 (its thread count), the handlers run in a pool of 10 threads, the batch
  completed with one UPDATE once all ten have returned.
- enqueue: N transactions from one connection, each an invoice INSERT plus one job, committed.
  Ours: ``transaction.atomic()`` + the invoice INSERT on Django's cursor + ``enqueue()``. The
  baseline: psycopg's ``conn.transaction()`` + the same invoice INSERT + a bare job INSERT whose
  RETURNING calls ``pg_notify``. A third side, django-bare, runs the baseline's two statements
  in ``transaction.atomic()`` on Django's cursor (the same connection as ours), so that
  ours/django-bare is the queue's own cost and django-bare/base is Django's. The three sides
  alternate in 12 slices, so that all meet the same commit latency. ``--django-prepared`` gives
  Django's connection ``server_side_binding`` and ``prepare_threshold=5``, as psycopg has.
- wake-up: an idle worker in a thread of this process, and a producer (a child process by
  default) committing one job per transaction, waiting for its handler to start, then idling
  ~20 ms. Latency = handler start - commit return, both ``time.perf_counter()`` (on Linux the
  machine-wide CLOCK_MONOTONIC). Ours: ``Worker().run()`` at default settings (LISTEN, poll
  2 s). The baseline: LISTEN + a 5 s poll, claim and complete as in the drain.

Every figure comes from the same invocation, so the ratios hold even when the machine is busy;
``--repeat N`` runs both sides N times, alternating which goes first, and reports the median
(or ``--statistic best``) with the spread.

The schema comes from Django's ``migrate`` on a dedicated database (``dbqueue_bench`` by default,
created on first use), so the benchmark never touches other data. ``DATABASE_URL`` (django-environ
syntax) names the server; its database name is only used to reach the server.

    python benchmarks/bench.py [--jobs 20000] [--enqueues 5000] [--wakeups 200] [--repeat 3]
                               [--io-jobs 3000] [--json results.json]
                               [--only drain,drain-io,enqueue,wakeup]
                               [--django-prepared]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import django
import environ
import psycopg
from django.conf import settings

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
CHANNEL = "dbqueue"  # the default DBQUEUE["NOTIFY_CHANNEL"]; both sides notify on it
QUEUE = "default"
BASELINE_BATCH = 10
ENQUEUE_SLICES = 12  # the enqueue sides alternate in this many slices (every order twice)
# Django's DATABASES OPTIONS with --django-prepared: bind on the server and prepare a statement
# at its 5th execution, as a plain psycopg connection does (Django's default binds client-side
# and never prepares). Not libpq options: libpq_params() leaves them out.
DJANGO_PREPARED = {"server_side_binding": True, "prepare_threshold": 5}
# Keys of a DATABASES OPTIONS that Django consumes itself and libpq would reject.
DJANGO_ONLY_OPTIONS = {
    "server_side_binding",
    "prepare_threshold",
    "isolation_level",
    "assume_role",
    "pool",
}

# --------------------------------------------------------------------------------------------
# SQL shared by the sides (set-up and the invoice row) and the baseline's own statements
# --------------------------------------------------------------------------------------------
# Only the tables that exist: an earlier commit run by against.py may predate some of them.
RESET = """
DO $$
DECLARE names text;
BEGIN
    SELECT string_agg(quote_ident(t), ', ') INTO names
    FROM unnest(ARRAY['dbqueue_job', 'dbqueue_dependency', 'dbqueue_delivery', 'bench_invoice']) AS t
    WHERE to_regclass(t) IS NOT NULL;
    EXECUTE 'TRUNCATE ' || names || ' RESTART IDENTITY';
END $$
"""
PROBE_RESET = "TRUNCATE bench_commit_probe; INSERT INTO bench_commit_probe (id, n) VALUES (1, 0)"
PROBE = "UPDATE bench_commit_probe SET n = n + 1 WHERE id = 1"

# The drain's backlog, written the same way for both sides (what enqueue would have written).
FILL = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at
)
SELECT 'bench-noop', %(queue)s, jsonb_build_object('i', g), 'pending', 0, now(), 0, 10, 60.0,
       '[]'::jsonb, now()
FROM generate_series(1, %(n)s) AS g
"""

# FILL's jobs, each sleeping ``sleep`` seconds (the drain-io workload).
FILL_SLEEP = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at
)
SELECT 'bench-sleep', %(queue)s, jsonb_build_object('i', g, 'sleep', %(sleep)s::float8),
       'pending', 0, now(), 0, 10, 60.0, '[]'::jsonb, now()
FROM generate_series(1, %(n)s) AS g
"""

IO_SLEEP = 0.001  # seconds each drain-io job sleeps
IO_THREADS = 10  # the baseline's handler threads: our worker's default CONCURRENCY

INSERT_INVOICE = """
INSERT INTO bench_invoice (number, customer, amount_cents, created_at)
VALUES (%(number)s, %(customer)s, %(amount)s, now())
RETURNING id
"""

# DESIGN.md's claim, batch 10; ordered like the claim index (priority DESC: higher runs first).
BASE_CLAIM = """
UPDATE dbqueue_job
SET state = 'running', attempts = attempts + 1, worker_id = %(worker)s, started_at = now(),
    leased_until = now() + lease_seconds * interval '1 second'
WHERE id IN (
    SELECT id FROM dbqueue_job
    WHERE state = 'pending' AND queue = %(queue)s AND run_after <= now()
    ORDER BY priority DESC, run_after, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, type, payload::text, attempts
"""

BASE_COMPLETE = """
UPDATE dbqueue_job SET state = 'done', finished_at = now(), leased_until = NULL
WHERE id = ANY(%(ids)s) AND state = 'running'
"""

# A bare INSERT; the notification rides in the same statement (and is delivered at commit).
# The enqueue's django-bare side runs it too, on Django's cursor.
BASE_ENQUEUE = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at
)
VALUES (%(type)s, %(queue)s, %(payload)s::jsonb, 'pending', 0, now(), 0, 10, 60.0, '[]'::jsonb,
        now())
RETURNING id, pg_notify(%(channel)s, %(queue)s)
"""


# --------------------------------------------------------------------------------------------
# Set-up: database, Django, helpers
# --------------------------------------------------------------------------------------------
def libpq_params(db):
    """psycopg keyword arguments for a Django DATABASES entry (no Django involved).

    The OPTIONS that only Django understands (``server_side_binding`` ...) are left out: the
    baseline's connections keep psycopg's own defaults (which prepare at the 5th execution).
    """
    options = {
        key: value for key, value in db.get("OPTIONS", {}).items() if key not in DJANGO_ONLY_OPTIONS
    }
    params = {
        "dbname": db["NAME"],
        "user": db.get("USER"),
        "password": db.get("PASSWORD"),
        "host": db.get("HOST"),
        "port": db.get("PORT"),
        **options,
    }
    return {key: str(value) for key, value in params.items() if value not in (None, "")}


def bench_database(args):
    """The DATABASES entry of the bench database: DATABASE_URL's server, ``--database``'s name."""
    db = environ.Env.db_url_config(os.environ.get("DATABASE_URL", DEFAULT_URL))
    db["NAME"] = args.database
    if args.synchronous_commit == "off":  # both sides, every connection
        options = db.setdefault("OPTIONS", {})
        options["options"] = f"{options.get('options', '')} -c synchronous_commit=off".strip()
    if args.django_prepared:  # Django's connections only (libpq_params() drops these keys)
        db.setdefault("OPTIONS", {}).update(DJANGO_PREPARED)
    return db


def ensure_database(db, name):
    """Create database ``name`` through the server's ``postgres`` database when it is missing."""
    params = libpq_params({**db, "NAME": "postgres"})
    with psycopg.connect(**params, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
            print(f"created database {name}")


def setup_django(db, *, migrate=True, log_jobs=False, dbqueue=None):
    """Django for a benchmark process: the bench database, the package and the invoice app.
    ``dbqueue``: the DBQUEUE setting (default: the one queue, every other key at its default)."""
    # --log-jobs: the one-line-per-success log on, written to /dev/null, to price it.
    jobs_logging = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"null": {"class": "logging.FileHandler", "filename": os.devnull}},
        "loggers": {"django_dbqueue.jobs": {"handlers": ["null"], "level": "INFO"}},
    }
    settings.configure(
        **({"LOGGING": jobs_logging} if log_jobs else {}),
        DEBUG=False,
        SECRET_KEY="django-dbqueue-bench-not-a-secret",
        DATABASES={"default": db},
        INSTALLED_APPS=["django_dbqueue", "benchmarks.benchapp"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        DBQUEUE=dbqueue if dbqueue is not None else {"QUEUES": {QUEUE: {}}},
    )
    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


class InvalidRun(RuntimeError):
    """A run whose outcome is wrong (jobs left over, a job run out of turn): not a figure."""


@dataclass
class Env:
    """The bench database: libpq parameters and an admin connection for set-up and checks."""

    params: dict
    admin: psycopg.Connection
    _baseline: psycopg.Connection | None = None

    def baseline_connection(self):
        """The enqueue baseline's connection, kept across slices like Django keeps ours."""
        if self._baseline is None:
            self._baseline = psycopg.connect(**self.params, autocommit=True)
        return self._baseline

    def close_baseline_connection(self):
        if self._baseline is not None:
            self._baseline.close()
            self._baseline = None

    def reset(self, fill=0, sleep=None):
        """Empty the tables (and write ``fill`` pending no-op jobs, or jobs sleeping ``sleep``
        seconds) so every run starts equal."""
        self.admin.execute(RESET)
        if fill and sleep is not None:
            self.admin.execute(FILL_SLEEP, {"queue": QUEUE, "n": fill, "sleep": sleep})
        elif fill:
            self.admin.execute(FILL, {"queue": QUEUE, "n": fill})
        self.admin.execute("VACUUM ANALYZE dbqueue_job")
        self.admin.execute("VACUUM ANALYZE bench_invoice")
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            self.admin.execute("CHECKPOINT")  # no run pays for the previous run's dirty pages

    def commit_ms(self, samples=50):
        """Median round trip of a one-row UPDATE committed in autocommit, which flushes WAL: the
        price of durability at this moment, which other load on the machine moves a lot."""
        self.admin.execute(PROBE_RESET)
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            self.admin.execute(PROBE)
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000.0

    def states(self):
        rows = self.admin.execute("SELECT state, count(*) FROM dbqueue_job GROUP BY state")
        return dict(rows.fetchall())

    def expect(self, what, **counts):
        found = self.states()
        if found != counts:
            raise InvalidRun(f"{what}: expected job states {counts}, found {found}")


def close_django_connections():
    from django.db import connections

    connections.close_all()


# Baseline handlers: plain functions by type name, like a minimal worker's dispatch table.
BASE_STARTED: queue.SimpleQueue = queue.SimpleQueue()


def base_noop(payload):
    """Does nothing."""


def base_record_start(payload):
    started = time.perf_counter()
    BASE_STARTED.put((payload["seq"], started))


def base_sleep(payload):
    time.sleep(payload["sleep"])


BASE_HANDLERS = {
    "bench-noop": base_noop,
    "bench-wakeup": base_record_start,
    "bench-sleep": base_sleep,
}


def run_batch(conn, worker_id):
    """The baseline worker's step: claim up to 10, run them, complete them in one UPDATE."""
    rows = conn.execute(
        BASE_CLAIM, {"worker": worker_id, "queue": QUEUE, "limit": BASELINE_BATCH}
    ).fetchall()
    for _job_id, job_type, payload, _attempt in rows:
        BASE_HANDLERS[job_type](json.loads(payload))
    if rows:
        conn.execute(BASE_COMPLETE, {"ids": [row[0] for row in rows]})
    return len(rows)


# --------------------------------------------------------------------------------------------
# (a) drain
# --------------------------------------------------------------------------------------------
def drain_ours(env, n, sleep=None):
    """The real worker at default settings drains ``n`` jobs (no-op, or sleeping ``sleep`` s)."""
    from django_dbqueue.worker import Worker

    env.reset(fill=n, sleep=sleep)
    worker = Worker(burst=True)
    started = time.perf_counter()
    worker.run()
    seconds = time.perf_counter() - started
    close_django_connections()
    env.expect("drain (ours)" if sleep is None else "drain-io (ours)", done=n)
    return {"seconds": seconds, "value": n / seconds}


def drain_baseline(env, n):
    env.reset(fill=n)
    with psycopg.connect(**env.params, autocommit=True) as conn:
        started = time.perf_counter()
        while run_batch(conn, "baseline"):
            pass
        seconds = time.perf_counter() - started
    env.expect("drain (baseline)", done=n)
    return {"seconds": seconds, "value": n / seconds}


def drain_io_ours(env, n):
    return drain_ours(env, n, sleep=IO_SLEEP)


def drain_io_baseline(env, n):
    from concurrent.futures import ThreadPoolExecutor

    env.reset(fill=n, sleep=IO_SLEEP)
    claim = {"worker": "baseline", "queue": QUEUE, "limit": IO_THREADS}
    with (
        psycopg.connect(**env.params, autocommit=True) as conn,
        ThreadPoolExecutor(IO_THREADS) as pool,
    ):
        started = time.perf_counter()
        while rows := conn.execute(BASE_CLAIM, claim).fetchall():
            payloads = [(job_type, json.loads(payload)) for _, job_type, payload, _ in rows]
            list(pool.map(lambda job: BASE_HANDLERS[job[0]](job[1]), payloads))
            conn.execute(BASE_COMPLETE, {"ids": [row[0] for row in rows]})
        seconds = time.perf_counter() - started
    env.expect("drain-io (baseline)", done=n)
    return {"seconds": seconds, "value": n / seconds}


# --------------------------------------------------------------------------------------------
# (b) transactional enqueue
# --------------------------------------------------------------------------------------------
def invoice_values(i):
    return {"number": f"INV-{i:07d}", "customer": "Bench Customer Ltd", "amount": 1999 + i}


def enqueue_ours(env, numbers):
    """One transaction per invoice number: the invoice INSERT and ``enqueue()``, committed."""
    from django.db import connection, transaction

    from django_dbqueue import enqueue

    connection.ensure_connection()
    started = time.perf_counter()
    for i in numbers:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(INSERT_INVOICE, invoice_values(i))
                invoice_id = cursor.fetchone()[0]
            enqueue("bench-noop", {"invoice_id": invoice_id})
    return time.perf_counter() - started


def base_enqueue_values(invoice_id):
    """BASE_ENQUEUE's parameters, the same for the baseline and django-bare."""
    return {
        "type": "bench-noop",
        "queue": QUEUE,
        "payload": json.dumps({"invoice_id": invoice_id}),
        "channel": CHANNEL,
    }


def enqueue_django_bare(env, numbers):
    """Ours without the queue: the invoice INSERT and the baseline's bare job INSERT, both on
    Django's cursor (the connection ours uses) in ``transaction.atomic()``, committed."""
    from django.db import connection, transaction

    connection.ensure_connection()
    started = time.perf_counter()
    for i in numbers:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(INSERT_INVOICE, invoice_values(i))
            invoice_id = cursor.fetchone()[0]
            cursor.execute(BASE_ENQUEUE, base_enqueue_values(invoice_id))
            cursor.fetchone()
    return time.perf_counter() - started


def enqueue_baseline(env, numbers):
    """One transaction per invoice number: the invoice INSERT and a bare job INSERT, committed."""
    conn = env.baseline_connection()
    started = time.perf_counter()
    for i in numbers:
        with conn.transaction():
            invoice_id = conn.execute(INSERT_INVOICE, invoice_values(i)).fetchone()[0]
            conn.execute(BASE_ENQUEUE, base_enqueue_values(invoice_id)).fetchone()
    return time.perf_counter() - started


ENQUEUE_SIDES = {
    "ours": enqueue_ours,
    "django-bare": enqueue_django_bare,
    "baseline": enqueue_baseline,
}


def slice_orders(sides, slices):
    """The order of the sides in each slice: the rotations of ``sides``, then those of its
    reverse, over and over, so that every order comes up (every 6 slices for 3 sides) and each
    side runs first, last and after each other side equally often."""
    rotations = [sides[k:] + sides[:k] for k in range(len(sides))]
    orders = rotations + [order[::-1] for order in rotations]
    return [orders[k % len(orders)] for k in range(slices)]


def enqueue_pair(env, n, order):
    """All three sides, alternating in slices: a commit costs what the disk and the other load on
    the machine make it cost at that moment, so the slices put the sides under the same weather.
    ``order`` (ours and baseline) is the repeat's; django-bare goes between them."""
    env.reset()
    sides = (order[0], "django-bare", order[1])
    seconds = dict.fromkeys(sides, 0.0)
    bounds = [n * k // ENQUEUE_SLICES for k in range(ENQUEUE_SLICES + 1)]
    try:
        for k, slice_order in enumerate(slice_orders(sides, ENQUEUE_SLICES)):
            for side in slice_order:
                offset = n * list(ENQUEUE_SIDES).index(side)  # distinct invoice numbers per side
                numbers = range(offset + bounds[k], offset + bounds[k + 1])
                seconds[side] += ENQUEUE_SIDES[side](env, numbers)
    finally:
        close_django_connections()
        env.close_baseline_connection()
    env.expect("enqueue (all sides)", pending=len(sides) * n)
    return {side: {"seconds": seconds[side], "value": n / seconds[side]} for side in sides}


# --------------------------------------------------------------------------------------------
# (c) wake-up latency
# --------------------------------------------------------------------------------------------
# The producer commits one job per transaction. By default it is a child process (this script
# with --producer-for), so that its commit timestamps are never held up by the worker's threads
# holding this process's GIL (in-process, the handler was seen to start "before" the commit
# returned). Both processes read time.perf_counter(), which on Linux is CLOCK_MONOTONIC, one
# clock for the whole machine; the child's "ready" line carries its clock so the parent can check.
def wakeup_committer(side, params):
    """``commit(seq)``: one job per transaction, in autocommit (a one-statement transaction)."""
    if side == "ours":
        from django.db import connection

        from django_dbqueue import enqueue

        connection.ensure_connection()
        return lambda seq: enqueue("bench-wakeup", {"seq": seq})
    conn = psycopg.connect(**params, autocommit=True)

    def commit(seq):
        payload = json.dumps({"seq": seq})
        conn.execute(
            BASE_ENQUEUE,
            {"type": "bench-wakeup", "queue": QUEUE, "payload": payload, "channel": CHANNEL},
        ).fetchone()

    return commit


def producer_main(args):
    """The child process: commit a job for every seq read from stdin; at "end", print the times."""
    db = bench_database(args)
    if args.producer_for == "ours":
        setup_django(db, migrate=False)
    commit = wakeup_committer(args.producer_for, libpq_params(db))
    print(f"ready {time.perf_counter()!r}", flush=True)
    committed = {}
    for line in sys.stdin:
        if line.strip() == "end":
            break
        seq = int(line)
        commit(seq)
        committed[seq] = time.perf_counter()
    print(json.dumps(committed), flush=True)
    return 0


class ThreadProducer:
    def __init__(self, side, env):
        self._commit = wakeup_committer(side, env.params)
        self.committed = {}

    def commit(self, seq):
        self._commit(seq)
        self.committed[seq] = time.perf_counter()

    def finish(self):
        close_django_connections()
        return self.committed


class ProcessProducer:
    def __init__(self, side, child_args):
        command = [sys.executable, __file__, "--producer-for", side, *child_args]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        ready = self.proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            self.proc.kill()
            raise RuntimeError(f"wake-up: the producer process did not start ({ready!r})")
        skew = abs(time.perf_counter() - float(ready[1]))
        if skew > 1.0:
            self.proc.kill()
            raise RuntimeError(
                f"wake-up: the producer's clock is {skew:.1f} s off this process's; "
                "time.perf_counter() is not one machine-wide clock here: use --producer thread"
            )

    def commit(self, seq):
        self.proc.stdin.write(f"{seq}\n")
        self.proc.stdin.flush()

    def finish(self):
        out, _ = self.proc.communicate("end\n", timeout=30)
        return {int(seq): at for seq, at in json.loads(out).items()}


def time_wakeups(n, gap, producer, started):
    """One job at a time: commit, wait for its handler to start, idle for ``gap``; summary in ms."""
    while not started.empty():  # left over from a run that failed
        started.get_nowait()
    handler_started = {}
    try:
        for seq in range(n):
            producer.commit(seq)
            try:
                got, at = started.get(timeout=30)
            except queue.Empty:
                raise InvalidRun(f"wake-up: job {seq}'s handler did not start in 30 s") from None
            if got != seq:
                raise InvalidRun(f"wake-up: expected job {seq}, the handler ran {got}")
            handler_started[seq] = at
            time.sleep(gap * random.uniform(0.75, 1.25))  # idle again; no phase lock with polls
    finally:
        committed = producer.finish()
    ms = sorted((handler_started[seq] - committed[seq]) * 1000.0 for seq in range(n))
    return {
        "p50": statistics.median(ms),
        "p99": statistics.quantiles(ms, n=100, method="inclusive")[98],
        "min": ms[0],
        "max": ms[-1],
    }


def make_producer(kind, side, env, child_args):
    return ThreadProducer(side, env) if kind == "thread" else ProcessProducer(side, child_args)


def listening(worker):
    """The Event set while ``worker`` LISTENs: its session's, or (a listener thread; also in
    releases before the session listened) its listener's."""
    event = getattr(worker, "listening", None)
    if event is None and worker.listener is not None:
        event = worker.listener.connected
    return event


def wakeup_ours(env, n, gap, producer_kind, child_args):
    from benchmarks.benchapp.jobs import STARTED
    from django_dbqueue.worker import Worker

    env.reset()
    worker = Worker()  # default settings: LISTEN on, poll every POLL_INTERVAL
    thread = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not ((event := listening(worker)) is not None and event.wait(0.1)):
            if time.monotonic() > deadline:
                raise RuntimeError("wake-up (ours): the worker's listener never connected")
            time.sleep(0.01)
        producer = make_producer(producer_kind, "ours", env, child_args)
        time.sleep(0.2)  # let the claim that follows the listener's connection settle
        result = time_wakeups(n, gap, producer, STARTED)
    finally:
        worker.stop()
        thread.join(10)
        close_django_connections()
    env.expect("wake-up (ours)", done=n)
    return result


def wakeup_baseline(env, n, gap, producer_kind, child_args):
    env.reset()
    ready, stop = threading.Event(), threading.Event()

    def worker():
        with (
            psycopg.connect(**env.params, autocommit=True) as conn,
            psycopg.connect(**env.params, autocommit=True) as listen,
        ):
            listen.execute(f"LISTEN {CHANNEL}")
            ready.set()
            while not stop.is_set():
                while run_batch(conn, "baseline") == BASELINE_BATCH:
                    pass
                for _ in listen.notifies(timeout=5.0, stop_after=1):  # LISTEN + a 5 s poll
                    pass

    thread = threading.Thread(target=worker, name="bench-baseline-worker", daemon=True)
    thread.start()
    try:
        if not ready.wait(10):
            raise RuntimeError("wake-up (baseline): the worker never connected")
        producer = make_producer(producer_kind, "baseline", env, child_args)
        time.sleep(0.2)
        result = time_wakeups(n, gap, producer, BASE_STARTED)
    finally:
        stop.set()
        env.admin.execute("SELECT pg_notify(%s, 'stop')", [CHANNEL])
        thread.join(10)
    env.expect("wake-up (baseline)", done=n)
    return result


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    title: str
    workload: str
    key: str  # field of the run's result
    unit: str
    higher_is_better: bool
    target: str  # the target, judged by judge()
    bar: str  # DESIGN.md's long-term bar
    side: str = "ours"  # A: the side measured ...
    against: str = "baseline"  # B: ... against this one; the ratio is A/B

    @property
    def label(self):
        """The summary's key: the title, plus the sides when they are not ours and baseline."""
        if (self.side, self.against) == ("ours", "baseline"):
            return self.title
        return f"{self.title} {self.side}/{self.against}"


SHORT = {"baseline": "base"}  # side names in the table


ROWS = [
    Row("drain", "drain", "value", "jobs/s", True, ">= 1.0x base", ">= 2.0x base"),
    # Handlers that wait (1 ms): the claim loop must keep the threads fed while they sleep.
    Row("drain, 1 ms jobs", "drain-io", "value", "jobs/s", True, "-", "-"),
    Row("enqueue", "enqueue", "value", "tx/s", True, ">= 0.9x base", "-"),
    # DESIGN.md's "an enqueue costs within 5% of the baseline's bare INSERT": the queue's own
    # cost, so against the bare INSERT on the same (Django) connection, not against psycopg.
    Row(
        "enqueue",
        "enqueue",
        "value",
        "tx/s",
        True,
        "-",
        ">= 0.95x django-bare",
        against="django-bare",
    ),
    # Informational: what Django's connection costs against psycopg's, with no queue at all.
    Row(
        "enqueue",
        "enqueue",
        "value",
        "tx/s",
        True,
        "-",
        "-",
        side="django-bare",
    ),
    Row("wake-up p50", "wakeup", "p50", "ms", False, "< 2 ms", "<= 1.5 ms"),
    Row("wake-up p99", "wakeup", "p99", "ms", False, "-", "<= 3 ms"),
]


def judge(rule, value, ratio):
    """PASS/MISS for a rule such as '>= 1.0x base' (on the ratio), '< 2 ms', '<= 3 ms' (on the
    value); '' for '-'."""
    if rule == "-":
        return ""
    op, number, _what = rule.split()
    value = ratio if number.endswith("x") else value
    limit = float(number.rstrip("x"))
    ok = {">=": value >= limit, "<": value < limit, "<=": value <= limit}[op]
    return "PASS" if ok else "MISS"


def fmt(value, unit):
    return f"{value:,.3f}" if unit == "ms" else f"{value:,.0f}"


def summarize(runs, statistic):
    """Per row: the chosen statistic of each side, the spread, and the paired ratio."""
    summary = {}
    for row in ROWS:
        # "best": the highest throughput, the lowest latency, the best of the paired ratios.
        best = max if row.higher_is_better else min
        pick = statistics.median if statistic == "median" else best
        pairs = [
            (run[row.side][row.key], run[row.against][row.key])
            for run in runs
            if run["workload"] == row.workload and "invalid" not in run
        ]
        if not pairs:
            continue
        a_all = [a for a, _ in pairs]
        b_all = [b for _, b in pairs]
        ratios = [a / b for a, b in pairs]
        a, b, ratio = pick(a_all), pick(b_all), pick(ratios)
        summary[row.label] = {
            "title": row.title,
            "unit": row.unit,
            "side": row.side,  # A
            "against": row.against,  # B
            "a": a,
            "b": b,
            "ratio": ratio,  # A/B
            "a_all": a_all,
            "b_all": b_all,
            "ratio_all": ratios,
            "target": row.target,
            "target_result": judge(row.target, a, ratio),
            "bar": row.bar,
            "bar_result": judge(row.bar, a, ratio),
        }
    return summary


def print_table(summary, statistic, repeat):
    def spread(values, unit):
        if len(values) < 2:
            return ""
        return f" [{fmt(min(values), unit)}..{fmt(max(values), unit)}]"

    header = [
        "workload",
        "unit",
        "A/B",
        "A",
        "B",
        "ratio",
        "issue target",
        "",
        "DESIGN bar",
        "",
    ]
    lines = []
    for s in summary.values():
        ratios = s["ratio_all"]
        ratio_spread = f" [{min(ratios):.2f}..{max(ratios):.2f}]" if len(ratios) > 1 else ""
        valid = len(s["a_all"])
        title = s["title"]
        sides = "/".join(SHORT.get(side, side) for side in (s["side"], s["against"]))
        lines.append(
            [
                title if valid == repeat else f"{title} ({valid}/{repeat} valid)",
                s["unit"],
                sides,
                fmt(s["a"], s["unit"]) + spread(s["a_all"], s["unit"]),
                fmt(s["b"], s["unit"]) + spread(s["b_all"], s["unit"]),
                f"{s['ratio']:.2f}x" + ratio_spread,
                s["target"],
                s["target_result"],
                s["bar"],
                s["bar_result"],
            ]
        )
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    numeric = {3, 4, 5}
    for line in [header, *lines]:
        cells = [
            str(cell).rjust(width) if i in numeric else str(cell).ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
    what = "median" if statistic == "median" else "best"
    print(
        f"\n{what} of {repeat} run(s) per side; [min..max] over the runs; the ratio A/B is the "
        f"{what} of the ratios paired within each repeat (for latency, lower is better)."
    )
    if any(s["against"] == "django-bare" or s["side"] == "django-bare" for s in summary.values()):
        print(
            "enqueue: django-bare = the baseline's two statements in transaction.atomic() on "
            "Django's cursor; ours/django-bare is the queue's own cost on one Django connection "
            "(DESIGN.md's bar), django-bare/base is Django's connection against psycopg's "
            "(informational)."
        )


def machine_facts(env):
    from django_dbqueue import __version__

    def git(*args):
        try:
            out = subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
            )
            return out.stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"

    def show(name):
        return env.admin.execute(f"SHOW {name}").fetchone()[0]

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": f"{psycopg.__version__} ({psycopg.pq.__impl__})",
        "postgresql": show("server_version"),
        "synchronous_commit": show("synchronous_commit"),
        "shared_buffers": show("shared_buffers"),
        "commit_ms": round(env.commit_ms(), 3),
        "django_dbqueue": __version__,
        "git": git("rev-parse", "--short", "HEAD")
        + (" dirty" if git("status", "--porcelain") else ""),
    }


def in_turn(ours, baseline):
    """Both sides of a workload, one whole run after the other, in the given order."""

    def pair(env, size, order, *extra):
        functions = {"ours": ours, "baseline": baseline}
        return {side: functions[side](env, size, *extra) for side in order}

    return pair


# workload -> (runs both sides, the option that sizes it)
WORKLOADS = {
    "drain": (in_turn(drain_ours, drain_baseline), "jobs"),
    "drain-io": (in_turn(drain_io_ours, drain_io_baseline), "io_jobs"),
    "enqueue": (enqueue_pair, "enqueues"),
    "wakeup": (in_turn(wakeup_ours, wakeup_baseline), "wakeups"),
}


def describe(workload, side, result, size):
    if workload == "wakeup":
        return (
            f"{size} wake-ups: p50 {result['p50']:.3f} ms, p99 {result['p99']:.3f} ms, "
            f"max {result['max']:.3f} ms"
        )
    unit = "jobs/s" if workload.startswith("drain") else "tx/s"
    return f"{size} in {result['seconds']:.2f} s = {result['value']:,.0f} {unit}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="django-dbqueue vs a plain-SQL baseline: drain, enqueue, wake-up latency."
    )
    parser.add_argument("--jobs", type=int, default=20000, help="jobs to drain (default 20000)")
    parser.add_argument(
        "--io-jobs", type=int, default=3000, help="1 ms jobs to drain (default 3000)"
    )
    parser.add_argument(
        "--enqueues", type=int, default=5000, help="enqueue transactions (default 5000)"
    )
    parser.add_argument("--wakeups", type=int, default=200, help="wake-ups timed (default 200)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side (default 1)")
    parser.add_argument(
        "--statistic",
        choices=["median", "best"],
        default="median",
        help="what --repeat reports (default median)",
    )
    parser.add_argument(
        "--gap", type=float, default=0.02, help="seconds between wake-up jobs (default 0.02)"
    )
    parser.add_argument(
        "--log-jobs",
        action="store_true",
        help="log one line per success (django_dbqueue.jobs at INFO, to /dev/null)",
    )
    parser.add_argument(
        "--only",
        default="drain,drain-io,enqueue,wakeup",
        help="comma-separated workloads to run (default: drain,drain-io,enqueue,wakeup)",
    )
    parser.add_argument(
        "--database",
        default="dbqueue_bench",
        help="database to create (if missing) and use (default dbqueue_bench)",
    )
    parser.add_argument(
        "--producer",
        choices=["process", "thread"],
        default="process",
        help="wake-up: commit from a child process (default) or from a thread of this one",
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=["server", "off"],
        default="server",
        help="'off' runs both sides without waiting for WAL flushes, which shows the CPU and "
        "protocol cost alone (default: the server's setting)",
    )
    parser.add_argument(
        "--django-prepared",
        action="store_true",
        help="give Django's connections (ours, django-bare) OPTIONS server_side_binding=True "
        "and prepare_threshold=5, like the psycopg baseline's defaults (default: Django's "
        "defaults, client-side binding and no prepared statements)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--producer-for", choices=["ours", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = set(args.only) - set(WORKLOADS)
    if unknown:
        parser.error(f"--only: unknown workloads {sorted(unknown)}; known: {sorted(WORKLOADS)}")
    for name in ("jobs", "io_jobs", "enqueues", "wakeups", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.wakeups < 2:
        parser.error("--wakeups must be at least 2")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.producer_for:
        return producer_main(args)
    db = bench_database(args)
    ensure_database(db, args.database)
    setup_django(db, log_jobs=args.log_jobs)
    child_args = ["--database", args.database, "--synchronous-commit", args.synchronous_commit]
    if args.django_prepared:
        child_args.append("--django-prepared")
    params = libpq_params(db)
    with psycopg.connect(**params, autocommit=True) as admin:
        env = Env(params, admin)
        facts = machine_facts(env)
        width = max(map(len, facts))
        print("\n".join(f"{key.ljust(width)}  {value}" for key, value in facts.items()))
        print(
            f"database: {args.database} on {db.get('HOST') or 'local socket'}:"
            f"{db.get('PORT') or 5432}; drain {args.jobs} jobs, drain-io {args.io_jobs} jobs "
            f"of {IO_SLEEP * 1000:g} ms, enqueue {args.enqueues} tx, "
            f"{args.wakeups} wake-ups, repeat {args.repeat}, synchronous_commit "
            f"{facts['synchronous_commit']}"
        )
        if args.django_prepared:
            print(
                "--django-prepared: Django's OPTIONS server_side_binding=True, "
                "prepare_threshold=5 (ours, django-bare; the psycopg baseline keeps psycopg's "
                "defaults)\n"
            )
        else:
            print(
                "Django's connection at its defaults: client-side binding, never prepared "
                "(--django-prepared to change); the psycopg baseline prepares at the 5th run\n"
            )
        runs = []
        for repeat in range(args.repeat):
            for workload in args.only:
                pair, size_arg = WORKLOADS[workload]
                size = getattr(args, size_arg)
                extra = (args.gap, args.producer, child_args) if workload == "wakeup" else ()
                # Alternate who goes first, so that drift hits both sides alike.
                order = ("baseline", "ours") if repeat % 2 == 0 else ("ours", "baseline")
                run = {"workload": workload, "repeat": repeat + 1, "commit_ms": env.commit_ms()}
                try:
                    results = pair(env, size, order, *extra)
                except InvalidRun as exc:
                    close_django_connections()
                    run["invalid"] = str(exc)
                    print(f"[{repeat + 1}/{args.repeat}] {workload:9} INVALID: {exc}", flush=True)
                    runs.append(run)
                    continue
                run.update(results)
                for side, result in results.items():
                    print(
                        f"[{repeat + 1}/{args.repeat}] {workload:9} {side:11} "
                        + describe(workload, side, result, size)
                        + f"   (commit {run['commit_ms']:.2f} ms before)",
                        flush=True,
                    )
                runs.append(run)
        facts["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        facts["commit_ms_end"] = round(env.commit_ms(), 3)
        print(
            f"load average at the end {facts['load_average_end']}, "
            f"commit {facts['commit_ms_end']} ms"
        )
        print()
        summary = summarize(runs, args.statistic)
        print_table(summary, args.statistic, args.repeat)
        if args.json:
            result = {
                "machine": facts,
                "args": vars(args),
                "settings": {"DBQUEUE": settings.DBQUEUE, "baseline_batch": BASELINE_BATCH},
                "statistic": args.statistic,
                "runs": runs,
                "summary": summary,
            }
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
            print(f"wrote {args.json}")
    invalid = [run for run in runs if "invalid" in run]
    for run in invalid:
        print(f"INVALID run {run['repeat']} of {run['workload']}: {run['invalid']}")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
