#!/usr/bin/env python
"""Issue 37's pressure harness: the claim under a held xmin horizon, big backlogs, many queues, churn.

Four modes, each on real ``manage.py run_jobqueue`` processes of the drain project
(``benchmarks/drainproject/``, started through ``pressure_worker.py``, which times every claim of
the worker's own loop and appends it to a per-process file):

- **pressure** (the default): a producer process enqueues ``noop`` jobs at ``--rate`` jobs/s
  (``enqueue_many()`` once per 10 ms tick, every job due so far) while ``--workers`` processes
  run them, through the phases warmup, clean, hold and recovery. During the hold a transaction on
  a connection of its own holds the xmin horizon (``BEGIN ISOLATION LEVEL REPEATABLE READ``,
  ``SELECT txid_current()``, a read, kept open; rolled back when the hold ends). Per phase: the
  offered rate (the producer's commits), the completed rate (the handlers' records), claim
  p50/p99 (the workers' timing), and at each phase's end the exact dead tuples (pgstattuple) and
  sizes of every table the run touched and its indexes. Last line: ``claim p99 hold/clean: <r>``.
- **backlog** (``--backlog N``): a reference cell with ``--reference`` (1,000) due jobs in one
  queue, then a cell with N; each job (``pressure-chain``) enqueues its successor, so the backlog
  stays N while the workers drain at full speed for ``--measure`` seconds after ``--warmup``.
  Last line: ``claim p99 backlog/reference: <r>``.
- **many queues** (``--queues Q --per-queue P``): the same with Q queues of P jobs, every worker
  serving all of them. Last line: ``claim p99 queues/reference: <r>``.
- **churn** (``--churn-minutes M``): the producer at ``--rate`` for M minutes with
  ``DONE_RETENTION = --retention`` seconds (the workers' sweepers delete done jobs), reported per
  ``--window`` (300 s) window. Last line: ``claim p99 last/first window: <r>``.

By default it runs on a private PostgreSQL cluster of its own (``--private-cluster``): initdb into
a temporary directory with the server binaries of ``/usr/lib/postgresql/*/bin``, on ``--port``
(5440), trust authentication, autovacuum on as in production (this machine's shared server runs
with it off), removed at the end unless ``--keep-cluster``. ``--database-url URL`` uses an
existing server instead (the database named by ``--database`` must contain "pressure": every
``dbqueue_*`` table in it is emptied). The workers' logs, the claim and record files, the
producer's log and the private server's log stay in ``--log-dir``. See benchmarks/README.md.

    python benchmarks/pressure.py --rate 800 --workers 32 --clean 60 --hold 240 --recovery 180
    python benchmarks/pressure.py --backlog 1000000 --workers 8
    python benchmarks/pressure.py --queues 1000 --per-queue 1000 --workers 8
    python benchmarks/pressure.py --churn-minutes 60 --rate 4000 --workers 32
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import glob
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from benchmarks import bench, drain_project  # noqa: E402 - drain_project puts the project on the path
from benchmarks.fleet import quantile  # noqa: E402

WORKER = REPO / "benchmarks" / "pressure_worker.py"
TICK = 0.01  # seconds between the producer's transactions
MAX_BATCH = 5000  # jobs per producer transaction at most (when it is behind)
FILL_CHUNK = 100_000  # rows per INSERT of a backlog's fill
DEFAULT_DATABASE = "dbqueue_bench_pressure"

# Every dbqueue_* table, emptied before each cell (whatever tables this schema has).
RESET = """
DO $$
DECLARE names text;
BEGIN
    SELECT string_agg(quote_ident(tablename), ', ') INTO names
    FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'dbqueue\\_%';
    EXECUTE 'TRUNCATE ' || names || ' RESTART IDENTITY CASCADE';
END $$
"""
# A backlog: the rows enqueue() writes for pressure-chain jobs (as bench.FILL writes bench's).
FILL = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at
)
SELECT 'pressure-chain', %(queue)s, jsonb_build_object('key', g), 'pending', 0, now(), 0, 10,
       60.0, '[]'::jsonb, now()
FROM generate_series(%(first)s::int, %(last)s::int) AS g
"""
# The tables of the queue and how much each was written and read so far: a table whose counters
# moved during a run is one the run touched (written: its size and dead tuples are reported; read
# only, such as dbqueue_queue, which the claim reads: named).
ACTIVITY = r"""
SELECT relname, n_tup_ins + n_tup_upd + n_tup_del, coalesce(seq_scan, 0) + coalesce(idx_scan, 0)
FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname LIKE 'dbqueue\_%'
"""
VACUUMS = r"""
SELECT relname, vacuum_count + autovacuum_count FROM pg_stat_user_tables
WHERE schemaname = current_schema() AND relname LIKE 'dbqueue\_%'
"""
# pgstattuple reads a plain table (not a partitioned one: its partitions are tables of their own).
TABLE_FIGURES = """
SELECT pg_relation_size(c.oid), pg_total_relation_size(c.oid), s.tuple_count, s.dead_tuple_count,
       t.n_dead_tup, t.vacuum_count + t.autovacuum_count
FROM pg_class c JOIN pg_stat_user_tables t ON t.relid = c.oid, pgstattuple(c.oid) s
WHERE c.oid = %(table)s::regclass
"""
PARTITIONED_FIGURES = """
SELECT 0, pg_total_relation_size(c.oid), NULL, NULL, t.n_dead_tup,
       t.vacuum_count + t.autovacuum_count
FROM pg_class c JOIN pg_stat_user_tables t ON t.relid = c.oid WHERE c.oid = %(table)s::regclass
"""
RELKIND = "SELECT relkind FROM pg_class WHERE oid = %s::regclass"
INDEXES = """
SELECT c.relname, a.amname, c.relkind FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = %(table)s::regclass ORDER BY c.relname
"""
# pgstattuple on a btree counts as dead only the entries marked LP_DEAD (killed by a scan that
# saw them dead to everyone): "marked" in the report, not the index's every stale entry.
INDEX_FIGURES = "SELECT pg_relation_size(%(index)s::regclass), tuple_count, dead_tuple_count FROM pgstattuple(%(index)s::regclass)"
OLDEST_XMIN = """
SELECT max(age(backend_xmin)) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL
"""
LEFT = """
SELECT EXISTS (SELECT FROM dbqueue_job WHERE state = 'pending')
    OR EXISTS (SELECT FROM dbqueue_job WHERE state = 'running')
"""
STATES = "SELECT state, count(*) FROM dbqueue_job GROUP BY state ORDER BY state"
RETRIED = "SELECT count(*) FROM dbqueue_job WHERE attempts > 1"


# --------------------------------------------------------------------------------------------
# The pure parts: the files, the phases, the figures (tests/unit/test_pressure_harness.py)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    start: float  # wall clock, seconds
    seconds: float
    got: int
    asked: int
    done: int  # completions written in the same round trip


def parse_claims(lines):
    """The claims of a ``claims-<pid>.txt`` file (``pressure_worker.ClaimLog``). A line that is
    not five numbers (a file cut while it was written) is skipped; returns (claims, skipped)."""
    claims, skipped = [], 0
    for line in lines:
        parts = line.split()
        try:
            start, seconds, got, asked, done = parts
            claims.append(Claim(float(start), float(seconds), int(got), int(asked), int(done)))
        except ValueError:
            skipped += 1
    return claims, skipped


def parse_commits(lines):
    """The producer's log: one ``<wall clock> <jobs>`` line per committed transaction."""
    commits = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            commits.append((float(parts[0]), int(parts[1])))
    return commits


def parse_records(lines):
    """The handlers' ``<wall clock> <key>`` records (``noop/records.py``), as (time, key)."""
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            yield float(parts[0]), int(parts[1])


def percentiles(values):
    """(p50, p99) of ``values`` (statistics.quantiles, inclusive), or (None, None) when empty."""
    values = list(values)
    if not values:
        return None, None
    if len(values) == 1:
        return values[0], values[0]
    return quantile(values, 50), quantile(values, 99)


@dataclass
class Timeline:
    """The run's phases, back to back (name, start, end, wall clock), and the blackouts: the
    spans of the harness's own snapshots (pgstattuple reads whole tables), whose claims are left
    out of the percentiles (they still count in the rates)."""

    phases: list = field(default_factory=list)
    blackouts: list = field(default_factory=list)

    def add(self, name, start, end):
        if self.phases and start < self.phases[-1][2]:
            raise ValueError(f"phase {name!r} starts before {self.phases[-1][0]!r} ends")
        if end < start:
            raise ValueError(f"phase {name!r} ends before it starts")
        self.phases.append((name, start, end))

    def blackout(self, start, end):
        self.blackouts.append((start, end))

    def phase_of(self, when):
        """The index of the phase ``when`` falls in ([start, end)), or None."""
        i = bisect.bisect_right([p[1] for p in self.phases], when) - 1
        if i >= 0 and when < self.phases[i][2]:
            return i
        return None

    def dark(self, when):
        return any(a <= when < b for a, b in self.blackouts)


def summarize(timeline, claims, commits, records, total_keys=None):
    """Per phase: seconds, offered (jobs committed by the producer), completed (handler records),
    claims (the timed ones: asked for jobs, outside a blackout), their p50/p99 in ms, jobs per
    claim and the share of empty claims. With ``total_keys``: every key in [0, total_keys) must
    have one record; returns the keys missing and repeated (a bitmap, not a set: a churn run has
    millions)."""
    n = len(timeline.phases)
    offered, completed = [0] * n, [0] * n
    durations, got, empty, dark = [[] for _ in range(n)], [0] * n, [0] * n, [0] * n
    bare = [[] for _ in range(n)]  # the claims that carried no completions
    for when, jobs in commits:
        i = timeline.phase_of(when)
        if i is not None:
            offered[i] += jobs
    seen = bytearray(total_keys) if total_keys is not None else None
    repeated = unexpected = 0
    for when, key in records:
        i = timeline.phase_of(when)
        if i is not None:
            completed[i] += 1
        if seen is not None:
            if 0 <= key < total_keys:
                if seen[key]:
                    repeated += 1
                seen[key] = 1
            else:
                unexpected += 1
    for claim in claims:
        i = timeline.phase_of(claim.start)
        if i is None or claim.asked <= 0:
            continue
        if timeline.dark(claim.start):
            dark[i] += 1
            continue
        durations[i].append(claim.seconds)
        if not claim.done:
            bare[i].append(claim.seconds)
        got[i] += claim.got
        empty[i] += claim.got == 0
    phases = []
    for i, (name, start, end) in enumerate(timeline.phases):
        seconds = end - start
        p50, p99 = percentiles(durations[i])
        bare50, bare99 = percentiles(bare[i])
        count = len(durations[i])
        phases.append(
            {
                "phase": name,
                "seconds": seconds,
                "offered_per_s": offered[i] / seconds if seconds else 0.0,
                "completed_per_s": completed[i] / seconds if seconds else 0.0,
                "offered": offered[i],
                "completed": completed[i],
                "claims": count,
                "claims_in_snapshots": dark[i],
                "claim_p50_ms": None if p50 is None else p50 * 1000.0,
                "claim_p99_ms": None if p99 is None else p99 * 1000.0,
                "bare_claims": len(bare[i]),
                "bare_p50_ms": None if bare50 is None else bare50 * 1000.0,
                "bare_p99_ms": None if bare99 is None else bare99 * 1000.0,
                "jobs_per_claim": got[i] / count if count else None,
                "empty_claims": empty[i] / count if count else None,
            }
        )
    check = None
    if seen is not None:
        check = {
            "missing": total_keys - sum(seen),
            "repeated": repeated,
            "unexpected": unexpected,
        }
    return phases, check


def ratio(phases, key, a, b):
    """``phases[a][key] / phases[b][key]`` by phase name, or None when either is missing."""
    by_name = {p["phase"]: p for p in phases}
    x, y = by_name.get(a, {}).get(key), by_name.get(b, {}).get(key)
    return x / y if x is not None and y else None


def fmt_ratio(value):
    return "n/a" if value is None else f"{value:.2f}"


def fmt_ms(value):
    return "-" if value is None else f"{value:.2f}"


def fmt_size(n):
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return str(n)


def phase_table(phases):
    lines = [
        f"{'phase':>10} {'seconds':>8} {'offered/s':>10} {'completed/s':>12} {'claims':>8} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'jobs/claim':>10} {'empty':>6} "
        f"{'bare':>6} {'p50 ms':>8} {'p99 ms':>8}"
    ]
    for p in phases:
        jobs = "-" if p["jobs_per_claim"] is None else f"{p['jobs_per_claim']:.1f}"
        empty = "-" if p["empty_claims"] is None else f"{p['empty_claims']:.0%}"
        lines.append(
            f"{p['phase']:>10} {p['seconds']:8.1f} {p['offered_per_s']:10.1f} "
            f"{p['completed_per_s']:12.1f} {p['claims']:8d} {fmt_ms(p['claim_p50_ms']):>8} "
            f"{fmt_ms(p['claim_p99_ms']):>8} {jobs:>10} {empty:>6} {p['bare_claims']:6d} "
            f"{fmt_ms(p['bare_p50_ms']):>8} {fmt_ms(p['bare_p99_ms']):>8}"
        )
    return lines


def touched(snapshots):
    """The relations to report: dbqueue_job, and every table whose write counters (rows
    inserted, updated, deleted) moved between the first snapshot and the last (all of them if
    there is one snapshot), each followed by its indexes; and the tables only read meanwhile."""
    first, last = snapshots[0]["relations"], snapshots[-1]["relations"]

    def moved(name, key):
        return len(snapshots) == 1 or last[name][key] > first.get(name, {}).get(key, 0)

    tables = [t for t, r in last.items() if r["kind"] == "table"]
    written = [t for t in tables if t == "dbqueue_job" or moved(t, "written")]
    read = [t for t in tables if t not in written and moved(t, "read")]
    names = []
    for table in written:
        names.append(table)
        names += [n for n, r in last.items() if r["kind"] == "index" and r["table"] == table]
    return names, read


def relation_tables(snapshots):
    """Two tables, one column per snapshot: each relation's size, then its dead tuples (tables:
    pgstattuple's exact count; indexes: entries marked dead), then a line of totals per snapshot."""
    names, read = touched(snapshots)
    head = f"{'':>40}" + "".join(f" {s['label'][:12]:>12}" for s in snapshots)
    lines = ["size (main fork)", head]
    for name in names:
        rel = [s["relations"].get(name) for s in snapshots]
        kind = next(r for r in rel if r)["kind"]
        label = name if kind == "table" else f"  {name}"
        lines.append(
            f"{label[:40]:<40}" + "".join(f" {fmt_size(r['size']) if r else '-':>12}" for r in rel)
        )
    lines += ["dead tuples (tables: pgstattuple, exact; indexes: entries marked dead)", head]
    for name in names:
        rel = [s["relations"].get(name) for s in snapshots]
        kind = next(r for r in rel if r)["kind"]
        label = name if kind == "table" else f"  {name}"
        dead = ["-" if r is None or r["dead"] is None else str(r["dead"]) for r in rel]
        lines.append(f"{label[:40]:<40}" + "".join(f" {d:>12}" for d in dead))
    for key, title in (
        ("n_dead_tup", "n_dead_tup (job table)"),
        ("vacuums", "vacuums since start (job table)"),
        ("oldest_xmin_age", "oldest backend xmin age (server)"),
        ("seconds", "snapshot took (s)"),
    ):
        values = []
        for s in snapshots:
            v = (
                s["relations"].get("dbqueue_job", {}).get(key)
                if key in ("n_dead_tup", "vacuums")
                else s.get(key)
            )
            values.append("-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v)))
        lines.append(f"{title:<40}" + "".join(f" {v:>12}" for v in values))
    lines.append(f"tables read, not written: {', '.join(read) or '-'}")
    return lines


# --------------------------------------------------------------------------------------------
# The private cluster
# --------------------------------------------------------------------------------------------
def pg_bindir():
    """The server binaries: ``pg_config --bindir`` when it has initdb, else the newest Debian
    ``/usr/lib/postgresql/*/bin``."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
        if Path(out.stdout.strip(), "initdb").exists():
            return out.stdout.strip()
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


class PrivateCluster:
    """A throwaway PostgreSQL cluster: initdb in a temporary directory (as the ``postgres`` OS
    user when this runs as root: initdb refuses root), trust authentication, 127.0.0.1:``port``,
    autovacuum on (the server's default), with every autovacuum run logged."""

    def __init__(self, port, options, max_connections, keep=False):
        self.port = port
        self.options = options
        self.max_connections = max_connections
        self.keep = keep
        self.bindir = pg_bindir()
        if self.bindir is None:
            raise SystemExit(
                "--private-cluster: no initdb (pg_config --bindir, /usr/lib/postgresql/*/bin)"
            )
        self.prefix = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise SystemExit("--private-cluster: running as root and runuser is missing")
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.root = None
        self.started = False

    def _run(self, *args):
        result = subprocess.run(
            [*self.prefix, os.path.join(self.bindir, args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise SystemExit(
                f"{args[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{log}"
            )
        return result

    @property
    def data(self):
        return self.root / "data"

    @property
    def log(self):
        return self.root / "server.log"

    def start(self):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                raise SystemExit(
                    f"--private-cluster: port {self.port} is in use (another run?); pick --port"
                )
        self.root = Path(tempfile.mkdtemp(prefix="dbqueue-pressure-pg-"))
        if self.prefix:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
            "max_connections": str(self.max_connections),
            "autovacuum": "on",
            "log_autovacuum_min_duration": "0",
            **self.options,
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# dbqueue pressure.py\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "start")
        self.started = True
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self, logdir):
        if self.started:
            subprocess.run(
                [
                    *self.prefix,
                    os.path.join(self.bindir, "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-m",
                    "fast",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                timeout=300,
            )
        if self.root is None:
            return
        with contextlib.suppress(OSError):
            shutil.copy(self.log, Path(logdir, "server.log"))
        if self.keep:
            print(f"private cluster kept in {self.root} (pg_ctl -D {self.data} start)")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The producer (a child process: ``--produce RATE``)
# --------------------------------------------------------------------------------------------
def produce_main(rate, log_path):
    """Enqueue ``noop`` jobs with keys 0, 1, ... at ``rate`` jobs/s: every TICK, one
    ``enqueue_many()`` of every job due since the start, until SIGTERM; one log line per commit."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "drainproject.settings"
    import django

    django.setup()
    from django.db import transaction

    from django_dbqueue import enqueue_many

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lines, flushed = [], time.monotonic()
    started, sent, tick = time.monotonic(), 0, 0
    with open(log_path, "a") as log:
        while not stop.is_set():
            tick += 1
            wait = started + tick * TICK - time.monotonic()
            if wait > 0:
                stop.wait(wait)
            due = int(rate * (time.monotonic() - started))
            n = min(due - sent, MAX_BATCH)
            if n <= 0:
                continue
            with transaction.atomic():
                enqueue_many([("noop", {"key": k}) for k in range(sent, sent + n)])
            sent += n
            lines.append(f"{time.time():.6f} {n}\n")
            if time.monotonic() - flushed >= 1.0:
                log.write("".join(lines))
                log.flush()
                lines, flushed = [], time.monotonic()
        log.write("".join(lines))
    return 0


# --------------------------------------------------------------------------------------------
# The harness
# --------------------------------------------------------------------------------------------
class Run:
    """One cell's processes and files: workers, producer, the held transaction, snapshots."""

    def __init__(self, args, params, admin, name, dbqueue):
        self.args, self.params, self.admin, self.name = args, params, admin, name
        self.dir = Path(args.log_dir, name)
        self.claims_dir, self.records_dir = self.dir / "claims", self.dir / "records"
        for d in (self.claims_dir, self.records_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.env_args = argparse.Namespace(
            database=args.database,
            conn_max_age="60",
            no_contenttypes=False,
            dbqueue=json.dumps({**dbqueue, **json.loads(args.dbqueue)}),
        )
        self.workers, self.stderr, self.producer = [], [], None
        self.holder = None
        self.timeline = Timeline()
        self.snapshots = []
        self.baseline_vacuums = dict(admin.execute(VACUUMS).fetchall())

    def env(self):
        env = drain_project.child_env(self.env_args, str(self.records_dir))
        env["PRESSURE_CLAIMS"] = str(self.claims_dir)
        return env

    def start_workers(self):
        cmd = [sys.executable, str(WORKER), *shlex.split(self.args.worker_args)]
        for i in range(self.args.workers):
            err = open(self.dir / f"worker-{i}.log", "w+b")  # noqa: SIM115 - stop_processes closes it
            self.workers.append(
                subprocess.Popen(
                    cmd, cwd=drain_project.PROJECT, env=self.env(), stdout=err, stderr=err
                )
            )
            self.stderr.append(err)
        try:
            drain_project.wait_listening(
                self.admin, self.workers, self.args.workers, self.args.start_deadline
            )
        except bench.InvalidRun as exc:
            i = next((i for i, p in enumerate(self.workers) if p.poll() is not None), 0)
            tail = (self.dir / f"worker-{i}.log").read_text(errors="replace")[-3000:]
            raise bench.InvalidRun(f"{exc}; worker-{i}.log ends:\n{tail}") from exc

    def start_producer(self):
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--produce",
            str(self.args.rate),
            "--produce-log",
            str(self.dir / "producer.txt"),
        ]
        self.producer_err = open(self.dir / "producer.log", "w+b")  # noqa: SIM115
        self.producer = subprocess.Popen(
            cmd, cwd=REPO, env=self.env(), stdout=self.producer_err, stderr=self.producer_err
        )

    def stop_producer(self):
        if self.producer is None:
            return
        ((code, err),) = drain_project.stop_processes([self.producer], [self.producer_err], True)
        self.producer = None
        if code != 0:
            raise bench.InvalidRun(f"the producer exited with {code}:\n{err}")

    def stop_workers(self):
        codes = drain_project.stop_processes(self.workers, self.stderr, True)
        self.workers, self.stderr = [], []
        for code, err in codes:
            if code != 0:
                raise bench.InvalidRun(f"a worker exited with {code}:\n{err}")

    def hold(self):
        """Open the transaction that holds the xmin horizon."""
        self.holder = psycopg.connect(**self.params, autocommit=True)
        self.holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        xid = self.holder.execute("SELECT txid_current()").fetchone()[0]
        self.holder.execute("SELECT count(*) FROM dbqueue_worker").fetchone()
        return xid

    def release(self):
        if self.holder is not None:
            with contextlib.suppress(psycopg.Error):
                self.holder.execute("ROLLBACK")
            self.holder.close()
            self.holder = None

    def check_alive(self):
        for proc in self.workers:
            if proc.poll() is not None:
                raise bench.InvalidRun(f"a worker exited early with {proc.returncode}")
        if self.producer is not None and self.producer.poll() is not None:
            raise bench.InvalidRun(f"the producer exited early with {self.producer.returncode}")

    def wait_until(self, deadline):
        while (left := deadline - time.time()) > 0:
            self.check_alive()
            time.sleep(min(1.0, left))

    def phase(self, name, seconds, *, on_start=None):
        """Run phase ``name`` for ``seconds`` (``on_start`` first), then snapshot its end."""
        start = time.time()
        if on_start:
            on_start()
        self.wait_until(start + seconds)
        snap = self.snapshot(f"end {name}")
        self.timeline.add(name, start, time.time())
        return snap

    def snapshot(self, label):
        """Sizes and exact dead tuples of every dbqueue_* table and of its indexes, with each
        table's activity counters (the report keeps the tables whose counters moved between the
        first snapshot and the last: the ones the steady run touched) and its vacuums since the
        cell began."""
        began = time.time()
        activity = {t: (w, r) for t, w, r in self.admin.execute(ACTIVITY).fetchall()}
        relations = {}
        for table in sorted(activity):
            plain = self.admin.execute(RELKIND, [table]).fetchone()[0] in ("r", "m", "t")
            size, total, live, dead, n_dead, vacuums = self.admin.execute(
                TABLE_FIGURES if plain else PARTITIONED_FIGURES, {"table": table}
            ).fetchone()
            relations[table] = {
                "kind": "table",
                "size": size,
                "total_size": total,
                "live": live,
                "dead": dead,
                "n_dead_tup": n_dead,
                "vacuums": vacuums - self.baseline_vacuums.get(table, 0),
                "written": activity[table][0],
                "read": activity[table][1],
            }
            for index, am, kind in self.admin.execute(INDEXES, {"table": table}).fetchall():
                if am == "btree" and kind == "i":
                    isize, ilive, idead = self.admin.execute(
                        INDEX_FIGURES, {"index": index}
                    ).fetchone()
                else:
                    isize = self.admin.execute(
                        "SELECT pg_relation_size(%s::regclass)", [index]
                    ).fetchone()[0]
                    ilive = idead = None
                relations[index] = {
                    "kind": "index",
                    "table": table,
                    "size": isize,
                    "live": ilive,
                    "dead": idead,
                }
        oldest = self.admin.execute(OLDEST_XMIN).fetchone()[0]
        ended = time.time()
        self.timeline.blackout(began, ended)
        snap = {
            "label": label,
            "at": began,
            "seconds": ended - began,
            "oldest_xmin_age": oldest,
            "relations": relations,
        }
        self.snapshots.append(snap)
        return snap

    def drain(self):
        """After the producer stopped: until no job is pending or running."""
        stop_at = time.monotonic() + self.args.drain_deadline
        while self.admin.execute(LEFT).fetchone()[0]:
            self.check_alive()
            if time.monotonic() > stop_at:
                raise bench.InvalidRun(
                    f"jobs left {self.args.drain_deadline}s after the producer stopped"
                )
            time.sleep(0.2)

    def read(self, total_keys=None):
        claims, skipped = [], 0
        for path in sorted(self.claims_dir.glob("claims-*.txt")):
            found, bad = parse_claims(path.read_text().splitlines())
            claims += found
            skipped += bad
        commits = []
        producer_log = self.dir / "producer.txt"
        if producer_log.exists():
            commits = parse_commits(producer_log.read_text().splitlines())

        def records():
            for path in sorted(self.records_dir.glob("*.txt")):
                with open(path) as lines:
                    yield from parse_records(lines)

        phases, check = summarize(self.timeline, claims, commits, records(), total_keys)
        return phases, check, commits, skipped

    def close(self):
        self.release()
        with contextlib.suppress(bench.InvalidRun):
            self.stop_producer()
        if self.workers:
            drain_project.stop_processes(self.workers, self.stderr, True)
            self.workers = []


def reset(admin):
    admin.execute(RESET)
    admin.execute("VACUUM ANALYZE")
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        admin.execute("CHECKPOINT")


def fill(admin, queues, per_queue):
    """``per_queue`` due pressure-chain jobs in each of ``queues``, then VACUUM ANALYZE."""
    key = 0
    for queue in queues:
        for first in range(0, per_queue, FILL_CHUNK):
            n = min(FILL_CHUNK, per_queue - first)
            admin.execute(FILL, {"queue": queue, "first": key, "last": key + n - 1})
            key += n
    admin.execute("VACUUM ANALYZE dbqueue_job")
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        admin.execute("CHECKPOINT")


def print_cell(title, phases, snapshots, extra=()):
    print()
    print(f"== {title}")
    for line in phase_table(phases):
        print(line)
    for line in extra:
        print(line)
    print()
    for line in relation_tables(snapshots):
        print(line)


def finish_flow(run, admin, total):
    """After a producer-driven cell: drain, stop, check every job ran once, at its first attempt."""
    run.stop_producer()
    run.drain()
    run.stop_workers()
    phases, check, _commits, skipped = run.read(total_keys=total)
    states = dict(admin.execute(STATES).fetchall())
    retried = admin.execute(RETRIED).fetchone()[0]
    problems = []
    if check["missing"] or check["repeated"] or check["unexpected"]:
        problems.append(
            f"records: {check['missing']} keys never ran, {check['repeated']} ran again, "
            f"{check['unexpected']} unexpected"
        )
    if retried:
        problems.append(f"{retried} jobs took more than one attempt")
    if set(states) - {"done"}:
        problems.append(f"job states at the end: {states}")
    extra = [
        f"enqueued {total} jobs; states at the end {states}; jobs retried {retried}; "
        f"records: {check['missing']} missing, {check['repeated']} repeated; "
        f"unreadable claim lines {skipped}"
    ]
    return phases, extra, problems


def pressure_cell(args, params, admin):
    reset(admin)
    run = Run(args, params, admin, "pressure", {})
    try:
        run.start_workers()
        run.start_producer()
        run.phase("warmup", args.warmup)
        run.phase("clean", args.clean)
        holder = {}

        def open_hold():
            holder["xid"] = run.hold()

        run.phase("hold", args.hold, on_start=open_hold)
        run.release()
        run.phase("recovery", args.recovery)
        total = sum(n for _, n in parse_commits_after_stop(run))
        phases, extra, problems = finish_flow(run, admin, total)
    finally:
        run.close()
    extra = [f"held xid {holder.get('xid')} from the start of hold to its end", *extra]
    print_cell("pressure", phases, run.snapshots, extra)
    return {
        "phases": phases,
        "snapshots": run.snapshots,
        "problems": problems,
        "last": [
            f"claim p50 hold/clean: {fmt_ratio(ratio(phases, 'claim_p50_ms', 'hold', 'clean'))}",
            f"claim p99 hold/clean: {fmt_ratio(ratio(phases, 'claim_p99_ms', 'hold', 'clean'))}",
        ],
    }


def parse_commits_after_stop(run):
    """Stop the producer (its log is complete once it exited) and read its commits."""
    run.stop_producer()
    return parse_commits((run.dir / "producer.txt").read_text().splitlines())


def churn_cell(args, params, admin):
    reset(admin)
    run = Run(args, params, admin, "churn", {"DONE_RETENTION": args.retention})
    try:
        run.start_workers()
        run.start_producer()
        run.phase("warmup", args.warmup)
        windows = max(1, round(args.churn_minutes * 60 / args.window))
        for w in range(windows):
            run.phase(f"w{w + 1}", args.window)
        total = sum(n for _, n in parse_commits_after_stop(run))
        phases, extra, problems = finish_flow(run, admin, total)
    finally:
        run.close()
    # Retention deleted done jobs: the records, not the table, say every job ran once.
    problems = [p for p in problems if not p.startswith("job states")]
    print_cell("churn", phases, run.snapshots, extra)
    first, last = "w1", f"w{windows}"
    worst = max(
        (p["claim_p99_ms"] for p in phases if p["phase"].startswith("w") and p["claim_p99_ms"]),
        default=None,
    )
    base = next((p["claim_p99_ms"] for p in phases if p["phase"] == first), None)
    return {
        "phases": phases,
        "snapshots": run.snapshots,
        "problems": problems,
        "last": [
            f"claim p99 max/first window: {fmt_ratio(worst / base if worst and base else None)}",
            f"claim p99 last/first window: {fmt_ratio(ratio(phases, 'claim_p99_ms', last, first))}",
        ],
    }


def backlog_cell(args, params, admin, name, queues, per_queue):
    """A constant backlog (each job enqueues its successor) drained at full speed."""
    reset(admin)
    started = time.time()
    fill(admin, queues, per_queue)
    filled = time.time() - started
    run = Run(args, params, admin, name, {"QUEUES": {q: {} for q in queues}})
    try:
        run.start_workers()
        run.phase("warmup", args.warmup)
        run.phase("measure", args.measure)
        run.stop_workers()
        phases, _check, _commits, skipped = run.read()
    finally:
        run.close()
    extra = [
        f"{len(queues)} queue(s) of {per_queue:,} due jobs (filled in {filled:.1f} s), kept "
        f"constant: each job enqueues its successor; unreadable claim lines {skipped}"
    ]
    print_cell(f"{name}: {len(queues)} queue(s) x {per_queue:,} jobs", phases, run.snapshots, extra)
    return {"phases": phases, "snapshots": run.snapshots, "problems": []}


def queue_names(count):
    """``count`` queue names, "default" among them (the project's job types use it)."""
    return ["default"] + [f"q{i:04d}" for i in range(1, count)]


def setup(args):
    """The database (created when missing), migrated by the project's Django, pgstattuple."""
    env_args = argparse.Namespace(
        database=args.database, conn_max_age="60", no_contenttypes=False, dbqueue=args.dbqueue
    )
    os.environ.update(drain_project.child_env(env_args, ""))
    os.environ["DJANGO_SETTINGS_MODULE"] = "drainproject.settings"
    import django
    from django.core.management import call_command

    db = bench.bench_database(args)
    bench.ensure_database(db, args.database)
    django.setup()
    call_command("migrate", verbosity=0)
    bench.close_django_connections()
    params = bench.libpq_params(db)
    with psycopg.connect(**params, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        except psycopg.Error as exc:
            raise SystemExit(
                f"CREATE EXTENSION pgstattuple failed on {args.database}: {exc}"
            ) from exc
    return params


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rate", type=float, default=800.0, help="jobs/s offered (pressure, churn)"
    )
    parser.add_argument("--workers", type=int, default=32, help="run_jobqueue processes")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the first phase")
    parser.add_argument("--clean", type=float, default=60.0, help="seconds")
    parser.add_argument("--hold", type=float, default=240.0, help="seconds of the held horizon")
    parser.add_argument("--recovery", type=float, default=180.0, help="seconds")
    parser.add_argument("--backlog", type=int, help="the backlog case: N due jobs in one queue")
    parser.add_argument("--queues", type=int, help="the many-queue case: Q queues")
    parser.add_argument("--per-queue", type=int, default=1000, help="due jobs per queue")
    parser.add_argument("--reference", type=int, default=1000, help="the reference cell's backlog")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds (backlog, queues)")
    parser.add_argument("--churn-minutes", type=float, help="the churn run: minutes at --rate")
    parser.add_argument("--window", type=float, default=300.0, help="seconds per churn window")
    parser.add_argument("--retention", type=float, default=120.0, help="DONE_RETENTION (churn)")
    parser.add_argument(
        "--private-cluster",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run on a throwaway cluster with autovacuum on (default)",
    )
    parser.add_argument("--port", type=int, default=5440, help="the private cluster's port")
    parser.add_argument(
        "--pg-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="private cluster setting",
    )
    parser.add_argument(
        "--keep-cluster", action="store_true", help="keep the private cluster's files"
    )
    parser.add_argument("--database-url", help="an existing server instead of a private cluster")
    parser.add_argument("--database", default=DEFAULT_DATABASE)
    parser.add_argument("--worker-args", default="", help="run_jobqueue arguments")
    parser.add_argument("--dbqueue", default="{}", help="DBQUEUE settings (JSON) over the cell's")
    parser.add_argument("--start-deadline", type=float, default=180.0, help="seconds")
    parser.add_argument("--drain-deadline", type=float, default=300.0, help="seconds")
    parser.add_argument("--log-dir", help="default: a new temporary directory, kept")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--produce", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--produce-log", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.produce is not None:
        return args
    modes = [m for m in ("backlog", "queues", "churn_minutes") if getattr(args, m) is not None]
    if len(modes) > 1:
        parser.error("choose one of --backlog, --queues, --churn-minutes (or none: pressure)")
    args.mode = modes[0] if modes else "pressure"
    for name in (
        "rate",
        "workers",
        "clean",
        "hold",
        "recovery",
        "per_queue",
        "reference",
        "measure",
        "window",
    ):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be above 0")
    for name in ("backlog", "queues", "churn_minutes"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be above 0")
    if args.warmup < 0 or args.retention < 0:
        parser.error("--warmup and --retention must be 0 or more")
    try:
        if not isinstance(json.loads(args.dbqueue), dict):
            raise ValueError("not an object")
    except ValueError as exc:
        parser.error(f"--dbqueue: not a JSON object ({exc})")
    args.options = {}
    for option in args.pg_option:
        name, sep, value = option.partition("=")
        if not sep or not name.strip():
            parser.error(f"--pg-option: NAME=VALUE, got {option!r}")
        args.options[name.strip()] = value.strip()
    if args.database_url:
        args.private_cluster = False
    if not args.private_cluster and "pressure" not in args.database:
        parser.error(
            "--database: the name must contain 'pressure' (its dbqueue_* tables are emptied)"
        )
    args.synchronous_commit, args.django_prepared = "server", False
    return args


def worker_concurrency(worker_args):
    """The handler threads per worker that ``--worker-args`` asks for (default CONCURRENCY 10)."""
    words = shlex.split(worker_args)
    for i, word in enumerate(words):
        if word.startswith("--concurrency="):
            return int(word.split("=", 1)[1])
        if word == "--concurrency" and i + 1 < len(words):
            return int(words[i + 1])
    return 10


def main(argv=None):
    args = parse_args(argv)
    if args.produce is not None:
        return produce_main(args.produce, args.produce_log)
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="dbqueue-pressure-")
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    print(f"log directory: {args.log_dir}", flush=True)
    cluster = None
    if args.private_cluster:
        # A handler thread of the backlog cells holds a Django connection (its enqueue).
        concurrency = worker_concurrency(args.worker_args)
        connections = args.workers * (concurrency + 4) + 50
        cluster = PrivateCluster(args.port, args.options, connections, keep=args.keep_cluster)
        os.environ["DATABASE_URL"] = cluster.start()
        print(f"private cluster: {cluster.root} on 127.0.0.1:{args.port}", flush=True)
    elif args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    result = {}
    try:
        params = setup(args)
        with psycopg.connect(**params, autocommit=True) as admin:
            facts = dict(
                admin.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', "
                    "'server_version', 'max_connections', 'shared_buffers', 'synchronous_commit')"
                ).fetchall()
            )
            load = os.getloadavg()
            print(
                f"mode {args.mode}; workers {args.workers} ({args.worker_args or 'defaults'}); "
                f"database {args.database}; PostgreSQL {facts.get('server_version')}, autovacuum "
                f"{facts.get('autovacuum')}, max_connections {facts.get('max_connections')}; "
                f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs",
                flush=True,
            )
            if facts.get("autovacuum") != "on":
                print("WARNING: autovacuum is off on this server: nothing removes dead tuples")
            result = run_mode(args, params, admin)
    finally:
        if cluster is not None:
            cluster.stop(args.log_dir)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), **result}, indent=2, default=str) + "\n"
        )
    problems = result.get("problems", [])
    for problem in problems:
        print(f"INVALID: {problem}")
    for line in result.get("last", []):
        print(line)
    return 1 if problems else 0


def run_mode(args, params, admin):
    if args.mode == "pressure":
        return pressure_cell(args, params, admin)
    if args.mode == "churn_minutes":
        return churn_cell(args, params, admin)
    reference = backlog_cell(args, params, admin, "reference", ["default"], args.reference)
    if args.mode == "backlog":
        name, queues, per_queue = "backlog", ["default"], args.backlog
    else:
        name, queues, per_queue = "queues", queue_names(args.queues), args.per_queue
    subject = backlog_cell(args, params, admin, name, queues, per_queue)
    p50 = ratio_between(subject, reference, "claim_p50_ms")
    p99 = ratio_between(subject, reference, "claim_p99_ms")
    return {
        "cells": {"reference": reference, name: subject},
        "problems": [],
        "last": [
            f"claim p50 {name}/reference: {fmt_ratio(p50)}",
            f"claim p99 {name}/reference: {fmt_ratio(p99)}",
        ],
    }


def ratio_between(a, b, key):
    x = next((p[key] for p in a["phases"] if p["phase"] == "measure"), None)
    y = next((p[key] for p in b["phases"] if p["phase"] == "measure"), None)
    return x / y if x is not None and y else None


if __name__ == "__main__":
    sys.exit(main())
