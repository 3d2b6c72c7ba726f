#!/usr/bin/env python
"""Many processes enqueueing at once, and the wake-up while they do, on the local PostgreSQL.

- enqueue: ``--producers`` (8) processes, each with its own connection, commit one transaction
  after another for ``--seconds`` (8): an invoice INSERT plus one job. Every side runs in the
  same invocation, one after another on emptied tables, the order rotating between repeats:

  ours            ``transaction.atomic()``: invoice INSERT on Django's cursor, ``enqueue()``; no
                  worker waits for a wake-up on the queue (as when every worker is busy, or
                  none runs), so the enqueues send none (django_dbqueue.waiters)
  ours-waited     the same while a worker waits on the queue (a connection that says so and
                  LISTENs, and never claims): every enqueue finds it and sends its wake-up
                  after the commit, coalesced (django_dbqueue.wakeup): the most they pay
  django-bare     baseline (a): the same invoice INSERT and a bare job INSERT, no NOTIFY at all,
                  on Django's cursor in ``transaction.atomic()``
  django+notify   the same with ``pg_notify`` in the job INSERT: the notification inside the
                  transaction, as every enqueue sent it before the wake-up path
  psycopg         baseline (b): the two bare statements on a plain psycopg connection, no NOTIFY
  psycopg+notify  the same with ``pg_notify`` in the job INSERT

  ``--variants`` adds sides with one design choice undone, to measure it: ours-nocheck (ours,
  with the INSERT not looking whether a worker waits: what looking costs), and of ours-waited,
  ours-window0 (no coalescing: every commit notifies), ours-window20 (``WAKEUP_WINDOW`` of
  20 ms instead of 5), ours-sync-notify (the wake-up statement waits for the WAL flush: no
  ``set_config('synchronous_commit', 'off', true)``) and ours-thread (every notification sent by
  the sender thread: no round trip for the caller).

  Reported per side: transactions/s (the sum of the producers' rates), p50/p99 latency of a
  transaction (from before its first statement to the return of its commit and, for ours, its
  wake-up), the CPU per transaction of the producers and of their own backends (from /proc: on a
  machine where the producers do not share the server's cores, the server's is what caps the
  cluster), and the share of the producers' ``pg_stat_activity`` samples (every 100 ms, from a
  connection of its own) waiting on ``Lock``/``object``: the notify queue's lock that
  PostgreSQL takes at the commit of a transaction that notified. Samples of the wake-up sender
  thread's own connection (ours) are counted apart: no producer waits for it. For the sides
  with a waiter: the wake-ups it received per second.

- wake-up: a ``Worker`` serving only ``default`` in a thread of this process (LISTEN, poll 2 s)
  and a producer process committing one job per transaction inside ``transaction.atomic()``,
  then idling ~``--gap``. Latency: handler start minus the return of the producer's COMMIT (an
  ``on_commit`` hook registered before ``enqueue()``'s, so the wake-up's own statement is inside
  the measured time). Also from the last statement before the COMMIT (``from the COMMIT's
  start``): the same point whatever a design sends with or after the COMMIT, so the figure to
  compare across commits whose wake-up is sent differently. Once idle, once while the producers
  of the "ours" side enqueue on another queue (``fleet``), which the worker does not serve.

    python benchmarks/fleet.py [--producers 8] [--seconds 8] [--repeat 3] [--wakeups 200]
                               [--only enqueue,wakeup] [--variants] [--json fleet.json]

It uses the same database as bench.py (``dbqueue_bench``, created and migrated on first use)
and ``DATABASE_URL`` names the server.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench import (  # noqa: E402 - after the path set-up above
    BASE_ENQUEUE,
    INSERT_INVOICE,
    Env,
    bench_database,
    close_django_connections,
    ensure_database,
    libpq_params,
    listening,
    machine_facts,
)
from benchmarks.bench import setup_django as bench_setup_django  # noqa: E402

APP_NAME = "dbqueue-fleet"  # application_name of every producer connection (PGAPPNAME)
FLEET_QUEUE = "fleet"  # the producers' queue; the wake-up worker serves only "default"
CHANNEL = "dbqueue"

# The bare job INSERT without a notification: baseline (a) and (b).
BARE_ENQUEUE = BASE_ENQUEUE.replace(", pg_notify(%(channel)s, %(queue)s)", "")
assert "pg_notify" not in BARE_ENQUEUE

SIDES = ["ours", "ours-waited", "django-bare", "django+notify", "psycopg", "psycopg+notify"]
VARIANTS = ["ours-nocheck", "ours-window0", "ours-window20", "ours-sync-notify", "ours-thread"]
# A worker waits on the producers' queue: every enqueue sends its wake-up.
WAITED = {"ours-waited", "ours-window0", "ours-window20", "ours-sync-notify", "ours-thread"}
WINDOWS = {"ours-window0": 0.0, "ours-window20": 0.020}  # WAKEUP_WINDOW of these variants

SAMPLE = """
SELECT pid, wait_event_type, wait_event FROM pg_stat_activity
WHERE datname = current_database() AND application_name = %(app)s AND pid <> pg_backend_pid()
"""


# --------------------------------------------------------------------------------------------
# Set-up
# --------------------------------------------------------------------------------------------
def setup_django(db, *, migrate=True):
    """bench.py's settings, with a second queue for the producers."""
    bench_setup_django(db, migrate=migrate, dbqueue={"QUEUES": {"default": {}, FLEET_QUEUE: {}}})


def bare_values(invoice_id):
    return {
        "type": "bench-noop",
        "queue": FLEET_QUEUE,
        "payload": json.dumps({"invoice_id": invoice_id}),
        "channel": CHANNEL,
    }


def invoice_values(pid, i):
    return {"number": f"F{pid}-{i}", "customer": "Fleet Customer Ltd", "amount": 1999 + i}


# --------------------------------------------------------------------------------------------
# A producer process: one side, one connection, transactions until told to stop
# --------------------------------------------------------------------------------------------
def django_transaction(side):
    from django.db import connection, transaction

    from django_dbqueue import enqueue, wakeup

    try:  # the store/ package (issue 26); against.py runs this script on older commits too
        from django_dbqueue.store import jobs as job_sql
        from django_dbqueue.store import wakeups as wake_sql
    except ImportError:
        from django_dbqueue import sql as job_sql
        from django_dbqueue import sql as wake_sql

    if side in WINDOWS:
        from django.conf import settings

        from django_dbqueue.conf import get_settings

        settings.DBQUEUE = {**settings.DBQUEUE, "WAKEUP_WINDOW": WINDOWS[side]}
        get_settings.cache_clear()
    if side == "ours-nocheck":  # the INSERT without looking whether a worker waits
        job_sql.INSERT_JOB = job_sql.INSERT_JOB.replace(job_sql._WANTED, "false")
    if side == "ours-sync-notify":  # the wake-up sent with a flushed commit
        if hasattr(wake_sql, "NOTIFY_AT_COMMIT"):  # sent by an on_commit hook (issue 26)
            wake_sql.NOTIFY = wake_sql.NOTIFY_NAMED = wake_sql.NOTIFY_AT_COMMIT
        else:
            wake = wake_sql.NOTIFY_WORKERS_AT_COMMIT
            wake_sql.NOTIFY_WORKERS = wake_sql.NOTIFY_WORKERS_NAMED = wake
    if side == "ours-thread":
        route_every_wake_up_through_the_sender(wakeup)
    statement = BASE_ENQUEUE if side == "django+notify" else BARE_ENQUEUE
    pid = os.getpid()

    def ours(i):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(INSERT_INVOICE, invoice_values(pid, i))
                invoice_id = cursor.fetchone()[0]
            enqueue("bench-noop", {"invoice_id": invoice_id}, queue=FLEET_QUEUE)

    def bare(i):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(INSERT_INVOICE, invoice_values(pid, i))
            invoice_id = cursor.fetchone()[0]
            cursor.execute(statement, bare_values(invoice_id))
            cursor.fetchone()

    connection.ensure_connection()
    backend = connection.connection.info.backend_pid
    return (ours if side.startswith("ours") else bare), backend


def psycopg_transaction(side, params):
    conn = psycopg.connect(**params, autocommit=True)
    statement = BASE_ENQUEUE if side == "psycopg+notify" else BARE_ENQUEUE
    pid = os.getpid()

    def run(i):
        with conn.transaction():
            invoice_id = conn.execute(INSERT_INVOICE, invoice_values(pid, i)).fetchone()[0]
            conn.execute(statement, bare_values(invoice_id)).fetchone()

    return run, conn.info.backend_pid


def route_every_wake_up_through_the_sender(wakeup):
    """ours-thread: the committing thread only hands its counts to the sender thread, which
    sends every notification (no round trip on the request's connection)."""
    coalescer = wakeup._COALESCER

    def committed(using, channel, counts):
        now = time.monotonic()
        with coalescer._cond:
            for queue, count in counts.items():
                key = (using, channel, queue)
                if key in coalescer._pending:
                    coalescer._pending[key] += count
                    continue
                coalescer._pending[key] = count
                if now - coalescer._last.get(key, -1e9) >= wakeup.window():
                    coalescer._last[key] = now - 2 * wakeup.window()  # due at once
                coalescer._start_sender()
                coalescer._cond.notify_all()

    coalescer.committed = committed


def producer_main(args):
    """Print "ready <backend pid>", wait for "go", run until "stop" or --seconds, print results."""
    db = bench_database(args)
    if args.producer.startswith(("ours", "django")):
        setup_django(db, migrate=False)
        run, backend = django_transaction(args.producer)
    else:
        run, backend = psycopg_transaction(args.producer, libpq_params(db))
    stop = threading.Event()

    def read_stop():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    print(f"ready {backend}", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    threading.Thread(target=read_stop, daemon=True).start()
    latencies, i = [], 0
    client_cpu, server_cpu = time.process_time(), backend_cpu(backend)
    started = time.perf_counter()
    deadline = started + args.seconds
    now = started
    while now < deadline and not stop.is_set():
        run(i)
        done = time.perf_counter()
        latencies.append(done - now)
        now, i = done, i + 1
        if args.rate:  # paced: the next transaction at its slot, not flat out
            pause = started + i / args.rate - now
            if pause > 0:
                time.sleep(pause)
                now = time.perf_counter()
    elapsed = time.perf_counter() - started
    client_cpu = time.process_time() - client_cpu
    server_cpu = backend_cpu(backend) - server_cpu  # its own backend's (not the sender's)
    if args.producer.startswith("ours"):
        from django_dbqueue import wakeup

        wakeup.flush(5.0, close=True)
    if args.producer.startswith(("ours", "django")):
        close_django_connections()
    result = {"count": i, "seconds": elapsed, "latencies": latencies}
    result.update(client_cpu=client_cpu, server_cpu=server_cpu)
    print(json.dumps(result), flush=True)
    return 0


def backend_cpu(pid):
    """CPU seconds backend ``pid`` has run, from /proc (the server is on this machine)."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9
    except OSError:  # not on Linux, or another machine's server
        return float("nan")


class Producers:
    """``n`` producer processes of one side, started together."""

    def __init__(self, side, n, seconds, child_args, rate=0.0):
        env = {**os.environ, "PGAPPNAME": APP_NAME}
        command = [sys.executable, __file__, "--producer", side, "--seconds", str(seconds)]
        command += ["--rate", str(rate)]
        self.procs = [
            subprocess.Popen(
                [*command, *child_args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(n)
        ]
        self.backends = set()
        for proc in self.procs:
            ready = proc.stdout.readline().split()
            if not ready or ready[0] != "ready":
                self.kill()
                raise RuntimeError(f"fleet: a {side} producer did not start ({ready!r})")
            self.backends.add(int(ready[1]))

    def go(self):
        for proc in self.procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def stop(self):
        for proc in self.procs:
            proc.stdin.write("stop\n")
            proc.stdin.flush()

    def results(self, timeout=120):
        out = []
        for proc in self.procs:
            line = proc.stdout.readline()
            proc.wait(timeout)
            out.append(json.loads(line))
        return out

    def running(self):
        return any(proc.poll() is None for proc in self.procs)

    def kill(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()


class Sampler(threading.Thread):
    """``pg_stat_activity`` every 100 ms: per backend of the producers' application name, whether
    it waits on the notify lock (``Lock``/``object``)."""

    def __init__(self, params, backends, interval=0.1):
        super().__init__(name="fleet-sampler", daemon=True)
        self.params, self.backends, self.interval = params, backends, interval
        self.stopped = threading.Event()
        self.samples = {"producer": 0, "producer_lock": 0, "sender": 0, "sender_lock": 0}
        self.waits = {}  # (type, event) -> producer samples

    def run(self):
        with psycopg.connect(**self.params, autocommit=True) as conn:
            next_at = time.monotonic()
            while not self.stopped.is_set():
                for pid, kind, event in conn.execute(SAMPLE, {"app": APP_NAME}):
                    who = "producer" if pid in self.backends else "sender"
                    self.samples[who] += 1
                    if (kind, event) == ("Lock", "object"):
                        self.samples[f"{who}_lock"] += 1
                    if who == "producer" and kind:
                        self.waits[(kind, event)] = self.waits.get((kind, event), 0) + 1
                next_at += self.interval
                self.stopped.wait(max(0.0, next_at - time.monotonic()))


class Waiter(threading.Thread):
    """LISTENs and counts the notifications it receives, never claims. With ``waits``, a worker
    waiting for wake-ups on the producers' queue, and no more: it says so (waiters.hold)."""

    def __init__(self, params, *, waits):
        super().__init__(name="fleet-waiter", daemon=True)
        from django_dbqueue import waiters

        self.conn = psycopg.connect(**params, autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")
        if waits and not waiters.hold(self.conn, [FLEET_QUEUE]):
            raise RuntimeError("fleet: the waiter could not say that it waits")
        self.stopped = threading.Event()
        self.received = 0

    def run(self):
        import select

        pgconn = self.conn.pgconn
        while not self.stopped.is_set():
            select.select([self.conn.fileno()], [], [], 0.1)
            pgconn.consume_input()
            while pgconn.notifies() is not None:
                self.received += 1

    def close(self):
        self.stopped.set()
        self.join(5)
        self.conn.close()


def quantile(values, q):
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def enqueue_side(env, side, args, child_args):
    env.reset()
    # Every side of ours is listened to, so that its wake-ups are counted; only the WAITED ones
    # say that they wait.
    waiter = Waiter(env.params, waits=side in WAITED) if side.startswith("ours") else None
    producers = Producers(side, args.producers, args.seconds, child_args)
    sampler = Sampler(env.params, producers.backends)
    try:
        if waiter is not None:
            waiter.start()
        sampler.start()
        producers.go()
        results = producers.results()
    finally:
        producers.kill()
        sampler.stopped.set()
        sampler.join(10)
        if waiter is not None:
            waiter.close()
    latencies = sorted(ms * 1000.0 for r in results for ms in r["latencies"])
    count = sum(r["count"] for r in results)
    jobs = env.states().get("pending", 0)
    if jobs != count:
        raise RuntimeError(f"fleet {side}: {count} transactions committed but {jobs} jobs pending")
    s = sampler.samples
    seconds = statistics.median(r["seconds"] for r in results)
    return {
        "client_us": 1e6 * sum(r["client_cpu"] for r in results) / max(1, count),
        "server_us": 1e6 * sum(r["server_cpu"] for r in results) / max(1, count),
        "wakeups_s": waiter.received / seconds if waiter is not None else None,
        "tx_s": sum(r["count"] / r["seconds"] for r in results),
        "count": count,
        "p50_ms": statistics.median(latencies),
        "p99_ms": quantile(latencies, 99),
        "lock_share": s["producer_lock"] / max(1, s["producer"]),
        "samples": s["producer"],
        "sender_samples": s["sender"],
        "sender_lock_share": s["sender_lock"] / max(1, s["sender"]) if s["sender"] else None,
        "top_waits": sorted(
            ((f"{k}/{e}", n) for (k, e), n in sampler.waits.items()), key=lambda x: -x[1]
        )[:4],
    }


# --------------------------------------------------------------------------------------------
# Wake-up latency, idle and under the producers' load
# --------------------------------------------------------------------------------------------
def wakeup_producer_main(args):
    """Commit a job for every seq read from stdin; at "end", print the commit times."""
    db = bench_database(args)
    setup_django(db, migrate=False)
    from django.db import connection, transaction

    from django_dbqueue import enqueue

    connection.ensure_connection()
    print(f"ready {time.perf_counter()!r}", flush=True)
    committed, before = {}, {}
    for line in sys.stdin:
        if line.strip() == "end":
            break
        seq = int(line)
        with transaction.atomic():
            # Registered first, so it runs first: the moment COMMIT returned.
            transaction.on_commit(lambda seq=seq: committed.__setitem__(seq, time.perf_counter()))
            enqueue("bench-wakeup", {"seq": seq})
            before[seq] = time.perf_counter()  # the last thing before the COMMIT is sent
    print(json.dumps({"committed": committed, "before": before}), flush=True)
    return 0


def time_wakeups(n, gap, child_args):
    from benchmarks.benchapp.jobs import STARTED

    while not STARTED.empty():
        STARTED.get_nowait()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--wakeup-producer", *child_args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ready = proc.stdout.readline().split()
    if not ready or ready[0] != "ready" or abs(time.perf_counter() - float(ready[1])) > 1.0:
        proc.kill()
        raise RuntimeError(f"wake-up: the producer did not start or its clock is off ({ready})")
    started = {}
    try:
        for seq in range(n):
            proc.stdin.write(f"{seq}\n")
            proc.stdin.flush()
            got, at = STARTED.get(timeout=30)
            if got != seq:
                raise RuntimeError(f"wake-up: expected job {seq}, the handler ran {got}")
            started[seq] = at
            time.sleep(gap * random.uniform(0.75, 1.25))
    finally:
        out, _ = proc.communicate("end\n", timeout=30)
    times = json.loads(out)
    committed = {int(k): v for k, v in times["committed"].items()}
    before = {int(k): v for k, v in times["before"].items()}
    ms = sorted((started[s] - committed[s]) * 1000.0 for s in range(n))
    # From before the COMMIT: the same for every design, whatever runs between the COMMIT's
    # return and the first on_commit hook (a wake-up sent in one pipeline with the COMMIT ran
    # before that hook; one sent by an on_commit hook runs after it). It includes the COMMIT.
    whole = sorted((started[s] - before[s]) * 1000.0 for s in range(n))
    return {
        "p50_ms": statistics.median(ms),
        "p99_ms": quantile(ms, 99),
        "max_ms": ms[-1],
        "from_commit_start_p50_ms": statistics.median(whole),
        "from_commit_start_p99_ms": quantile(whole, 99),
    }


def wakeup_runs(env, args, child_args):
    from django_dbqueue.worker import Worker

    env.reset()
    worker = Worker(queues=["default"])
    thread = threading.Thread(target=worker.run, name="fleet-worker", daemon=True)
    thread.start()
    results = {}
    try:
        deadline = time.monotonic() + 10
        while not ((event := listening(worker)) is not None and event.wait(0.1)):
            if time.monotonic() > deadline:
                raise RuntimeError("wake-up: the worker's listener never connected")
        time.sleep(0.2)  # let the claim that follows the listener's connection settle
        results["idle"] = time_wakeups(args.wakeups, args.gap, child_args)
        seconds = args.wakeups * args.gap * 4 + 30  # stopped early, when the wake-ups are done
        producers = Producers("ours", args.producers, seconds, child_args, args.load_rate)
        try:
            producers.go()
            time.sleep(0.5)  # the producers are up to speed
            results["loaded"] = time_wakeups(args.wakeups, args.gap, child_args)
            producers.stop()
            load = producers.results()
        finally:
            producers.kill()
        results["loaded"]["producers_tx_s"] = sum(r["count"] / r["seconds"] for r in load)
    finally:
        worker.stop()
        thread.join(10)
        close_django_connections()
    return results


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def median_of(runs, side, key):
    values = [run[side][key] for run in runs if side in run]
    return statistics.median(values), min(values), max(values)


def print_enqueue(runs, sides):
    print(
        f"{'side':17} {'tx/s':>22} {'p50 ms':>7} {'p99 ms':>7} {'client us':>9} {'server us':>9} "
        f"{'Lock/object':>12} {'(samples)':>9}  top waits (producers)"
    )
    for side in sides:
        tx, lo, hi = median_of(runs, side, "tx_s")
        p50 = median_of(runs, side, "p50_ms")[0]
        p99 = median_of(runs, side, "p99_ms")[0]
        client = median_of(runs, side, "client_us")[0]
        server = median_of(runs, side, "server_us")[0]
        share = median_of(runs, side, "lock_share")[0]
        samples = sum(run[side]["samples"] for run in runs)
        waits = runs[-1][side]["top_waits"]
        sender = [run[side]["sender_lock_share"] for run in runs if run[side]["sender_samples"]]
        extra = f"  sender Lock/object {statistics.median(sender):.1%}" if sender else ""
        wakeups = [run[side]["wakeups_s"] for run in runs if run[side].get("wakeups_s") is not None]
        if wakeups:
            extra += f"  wake-ups received {statistics.median(wakeups):,.0f}/s"
        print(
            f"{side:17} {tx:8,.0f} [{lo:,.0f}..{hi:,.0f}] {p50:7.2f} {p99:7.2f} {client:9,.0f} "
            f"{server:9,.0f} {share:12.2%} {samples:9}  "
            f"{', '.join(f'{w} {n}' for w, n in waits)}{extra}"
        )
    print("client us / server us: CPU per transaction of the producers and of their own backends")
    print()

    def ratio(a, b):
        values = [run[a]["tx_s"] / run[b]["tx_s"] for run in runs if a in run and b in run]
        return statistics.median(values), min(values), max(values)

    checks = [
        ("ours", "django-bare", ">= 0.95x", 0.95),
        ("ours-waited", "django-bare", "-", None),
        ("ours-waited", "ours", "-", None),
        ("ours", "psycopg", "-", None),
        ("django+notify", "django-bare", "-", None),
        ("psycopg+notify", "psycopg", "-", None),
        ("django-bare", "psycopg", "-", None),
    ] + [(v, "ours-waited" if v in WAITED else "ours", "-", None) for v in sides if v in VARIANTS]
    checks += [(v, "django-bare", "-", None) for v in sides if v in WINDOWS]
    for a, b, target, limit in checks:
        if a not in sides or b not in sides:
            continue
        r, lo, hi = ratio(a, b)
        verdict = "" if limit is None else ("PASS" if r >= limit else "MISS")
        print(f"tx/s {a + '/' + b:30} {r:5.2f}x [{lo:.2f}..{hi:.2f}]  {target} {verdict}")
    for a, b in (("ours", "django-bare"), ("ours-waited", "django-bare")):
        if a in sides and b in sides:
            values = [run[a]["server_us"] / run[b]["server_us"] for run in runs]
            print(
                f"server CPU per tx {a + '/' + b:21} {statistics.median(values):5.2f}x "
                f"[{min(values):.2f}..{max(values):.2f}]  (what caps a cluster whose producers "
                "run elsewhere)"
            )
    if "ours" not in sides:
        return
    share = median_of(runs, "ours", "lock_share")[0]
    print(
        f"ours: producers waiting on Lock/object {share:.2%}  < 1%  {'PASS' if share < 0.01 else 'MISS'}"
    )


def print_wakeup(results, args):
    for label in ("idle", "loaded"):
        p50 = statistics.median(r[label]["p50_ms"] for r in results)
        p99 = statistics.median(r[label]["p99_ms"] for r in results)
        extra = ""
        if label == "loaded":
            tx = statistics.median(r[label]["producers_tx_s"] for r in results)
            pace = f"paced at {args.load_rate:g} tx/s each" if args.load_rate else "flat out"
            extra = f"  (while {args.producers} producers, {pace}, committed {tx:,.0f} tx/s)"
        print(
            f"wake-up {label:6} p50 {p50:.3f} ms <= 1.5 {'PASS' if p50 <= 1.5 else 'MISS'}, "
            f"p99 {p99:.3f} ms <= 3 {'PASS' if p99 <= 3 else 'MISS'}{extra}"
        )
        if all("from_commit_start_p50_ms" in r[label] for r in results):
            s50 = statistics.median(r[label]["from_commit_start_p50_ms"] for r in results)
            s99 = statistics.median(r[label]["from_commit_start_p99_ms"] for r in results)
            print(f"wake-up {label:6} from the COMMIT's start: p50 {s50:.3f} ms, p99 {s99:.3f} ms")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0, help="per side and repeat")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--wakeups", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--only", default="enqueue,wakeup")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also ours-nocheck, ours-window0, ours-window20, ours-sync-notify, ours-thread",
    )
    parser.add_argument(
        "--load-rate",
        type=float,
        default=50.0,
        help="tx/s of each producer during the loaded wake-up (0: flat out; default 50)",
    )
    parser.add_argument("--sides", help="a subset of the sides, comma-separated")
    parser.add_argument("--database", default="dbqueue_bench")
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="FILE")
    # bench.bench_database() reads these two
    parser.add_argument("--synchronous-commit", choices=["server", "off"], default="server")
    parser.add_argument("--django-prepared", action="store_true")
    parser.add_argument("--producer", help=argparse.SUPPRESS)
    parser.add_argument("--wakeup-producer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.only = args.only.split(",")
    args.sides = args.sides.split(",") if args.sides else None
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.producer:
        return producer_main(args)
    db = bench_database(args)
    if args.wakeup_producer:
        return wakeup_producer_main(args)
    ensure_database(db, args.database)
    setup_django(db)
    child_args = ["--database", args.database, "--synchronous-commit", args.synchronous_commit]
    sides = args.sides or SIDES + (VARIANTS if args.variants else [])
    params = libpq_params(db)
    with psycopg.connect(**params, autocommit=True) as admin:
        env = Env(params, admin)
        facts = machine_facts(env)
        print("\n".join(f"{key:19} {value}" for key, value in facts.items()))
        print(
            f"{args.producers} producers, {args.seconds} s per side, repeat {args.repeat}, "
            f"sides {', '.join(sides)}\n",
            flush=True,
        )
        enqueue_runs, wakeup_results = [], []
        for repeat in range(args.repeat):
            if "enqueue" in args.only:
                order = sides[repeat % len(sides) :] + sides[: repeat % len(sides)]
                run = {}
                for side in order:
                    run[side] = enqueue_side(env, side, args, child_args)
                    r = run[side]
                    print(
                        f"[{repeat + 1}/{args.repeat}] {side:17} {r['tx_s']:8,.0f} tx/s  p50 "
                        f"{r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  Lock/object "
                        f"{r['lock_share']:.2%} of {r['samples']}   (commit {env.commit_ms():.2f} ms)",
                        flush=True,
                    )
                enqueue_runs.append(run)
            if "wakeup" in args.only:
                result = wakeup_runs(env, args, child_args)
                wakeup_results.append(result)
                print(f"[{repeat + 1}/{args.repeat}] wake-up {json.dumps(result)}", flush=True)
        print(f"load average at the end {[round(x, 2) for x in os.getloadavg()]}\n")
        if enqueue_runs:
            print_enqueue(enqueue_runs, sides)
        if wakeup_results:
            print_wakeup(wakeup_results, args)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "machine": facts,
                        "args": vars(args),
                        "enqueue": enqueue_runs,
                        "wakeup": wakeup_results,
                    },
                    indent=2,
                    default=str,
                )
                + "\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
