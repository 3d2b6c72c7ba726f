"""The invariant soak: workers, producers, operators and faults interleaved, every promise checked.

    python benchmarks/soak.py --minutes 30 --seed 1234
    python benchmarks/soak.py --minutes 2 --seed 1234 --workers 4 --database dbqueue_soak_mine

It creates (if missing) and migrates its own database (``--database``, default ``dbqueue_soak``;
the name must contain "soak", since every run empties its tables), on the server of
``DATABASE_URL``, which must run on this machine (the checker compares the database's clock
with the times it saw processes die). It touches no other database. Then, for ``--minutes``:

- ``--workers`` real ``run_jobqueue`` processes, alternately ``--execution thread`` and
  ``--execution process``, serving the queues in different orders; a worker that exits is
  started again (the soak is their supervisor);
- a producer enqueues plain jobs, jobs on the queue with a fleet-wide concurrency limit
  (``limited``: 2), on the rate-limited queue (``rated``: 4/s per ``acct``), of a type with its
  own limits (``soak-typed``: 2 at once, 6/s per ``acct``, in any queue), jobs with serial keys
  and unique keys, chains, groups with a callback, graphs with ``on_failure="run"`` edges, jobs
  depending on jobs already enqueued (some inside a transaction it keeps open for seconds),
  guarded effects (a delivery record; an atomic handler), handlers that hang past their
  timeout, jobs of durable steps (``soak-steps``: three ``ctx.step`` calls, failing or slow
  in one of them as the payload says), and jobs of durable waits (``soak-waits``: a step, a
  ``ctx.sleep``, maybe a snooze, one or two ``ctx.wait_for_signal("go")`` with a timeout), to
  which it sends signals (``signal_job``, each payload a unique number) at drawn later steps:
  some before the job reaches its wait, some while it waits, some after its timeout, some in a
  transaction kept open a little while the job's run may be writing its wait; and events
  (``publish``) to two subscribers, most with an idempotency key from a small set that repeats;
  and jobs of a batch handler (``soak-batch``, up to five per call), each with its own failure
  plan; and jobs of the fair queue ``fair`` (a backlog of the key ``hog``, single jobs of new
  keys), which the last worker of four or more serves alone (benchmarks/soak_fair.py);
- an operator requeues dead and cancelled jobs (by id, and all dead ones at once), cancels
  pending, waiting and running jobs, pauses queues and resumes them;
- faults: ``kill -9`` of a worker's process group (started again a little later),
  ``pg_terminate_backend`` of a worker's sessions, SIGSTOP of a worker's process group past its
  lease then SIGCONT, SIGTERM (a graceful stop, then a restart).
- a hostile actor (benchmarks/soak_hostile.py, issue 35): calls of the SQL door
  ``dbqueue_enqueue()`` with payloads Python cannot read back (a 5000-digit integer, arrays
  nested 1500 or 101 deep, a number with a fraction past a float's range) that it must refuse,
  and with payloads at the edge of what it takes (type ``soak-hostile``), which must run;
  ``soak-poison`` jobs whose payload a plain ``UPDATE`` replaces, while they are pending, by one
  Python cannot read (they must end dead of ``UnreadableJob`` at once, their claim-mates run as
  usual); ``soak-poison`` jobs whose type such an ``UPDATE`` makes one no worker registers for
  1 to 4 s (handed back unspent, then run); and a caller's transaction (the ``Gripper`` thread) holding a few pending jobs,
  running jobs or limiter rows ``FOR UPDATE`` for 1 to 5 s before it commits. Its invariants:
  no worker exits but by the soak's kill or SIGTERM, no job is charged an attempt that no run
  of it began and nothing explains, no job but a poisoned one is dead without its own failure.

Then a drain with everything above off (queues resumed, workers continued and restarted) until
every job is done, dead or cancelled, or no job changed state for ``STALL`` seconds, or
``--drain`` seconds passed; and the final check. benchmarks/soak_check.py says what is checked and how, every few seconds while
the soak runs and at the end. The last line is ``violations: N``; the exit status is 1 when
N > 0.

**Replay.** The seed is printed first. Time is cut into steps of ``STEP`` seconds; each actor
(producer, operator, faults, hostile) draws every decision from its own ``random.Random`` seeded with the
seed and its name, at every step, whether or not it acts, so the same seed gives the same
schedule: at step s the same actor does the same kind of action with the same payloads,
delays, workers and durations. What cannot be replayed exactly: the operating system's
scheduling and the database's timing, hence which jobs are dead, running or pending when an
operator picks among them (it picks by a drawn fraction of the sorted candidates), which jobs a
fault hits, and when steps run late on a loaded machine (a step never runs early; a late one
runs at once). ``schedule.log`` in ``--log-dir`` lists the schedule as decided (step, actor,
action, draws): two runs of one seed write the same file.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import faulthandler
import io
import os
import queue
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STEP = 0.1  # seconds per step of the schedule
QUEUE_ORDERS = ["default,limited,rated", "rated,limited,default", "limited,default,rated"]
PAUSABLE = ["limited", "rated", "default"]
# Guarded types are never run again; a requeued soak-steps job keeps its recorded steps.
REQUEUABLE = ("soak-work", "soak-typed", "soak-hang", "soak-steps", "soak-waits")
WITNESS_EVERY = 0.02
STEP_STALL = 60.0  # seconds one step of the loop may take before it dumps every thread's stack
STALL = 20.0  # seconds without any job changing state that end the drain (a hang lasts 4-8 s)
RESET_TABLES = [
    "dbqueue_job",
    "dbqueue_dependency",
    "dbqueue_delivery",
    "dbqueue_queue",
    "dbqueue_limiter",
    "dbqueue_step",
    "dbqueue_signal",
    "dbqueue_event",  # else a run's repeated keys find the last run's events (publish-repeat)
    "soak_run",
    "soak_effect",
    "soak_transition",
    "soak_witness",
    "soak_step_body",
    "soak_wait",
    "soak_signal",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="length of the action phase")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--database", default="dbqueue_soak", help="the soak's own database")
    parser.add_argument(
        "--drain",
        type=float,
        default=None,
        help="seconds the drain may take at most (default: 10 per minute of --minutes, at "
        "least 120: the backlog of the serial keys grows with the run)",
    )
    parser.add_argument("--check-every", type=float, default=5.0, help="seconds between checks")
    parser.add_argument("--log-dir", type=Path, default=None, help="workers' logs (default: tmp)")
    args = parser.parse_args(argv)
    if "soak" not in args.database:
        parser.error("--database must contain 'soak': the soak empties its tables at every run")
    if args.workers < 2:
        parser.error("--workers must be at least 2 (one per execution mode)")
    if args.drain is None:
        args.drain = max(120.0, 10.0 * args.minutes)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**9)
    return args


def setup(args):
    """Point Django at the soak database (created when missing) and migrate it."""
    import environ
    import psycopg

    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    os.environ["DBQUEUE_SOAK_DATABASE"] = args.database
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.soak_settings"
    os.environ.pop("DBQUEUE_SOAK_WORKER", None)
    server = environ.Env.db_url_config(os.environ["DATABASE_URL"])
    params = {
        "host": server.get("HOST") or None,
        "port": server.get("PORT") or None,
        "user": server.get("USER") or None,
        "password": server.get("PASSWORD") or None,
        "dbname": "postgres",
    }
    with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as conn:
        if not conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [args.database]
        ).fetchone():
            conn.execute(
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(args.database))
            )
            print(f"created database {args.database}")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if not schema_current():
        # A soak database migrated by an older soakapp (its 0001 changed before any release):
        # its tables hold nothing worth keeping, so they are made again.
        call_command("migrate", "soakapp", "zero", verbosity=0)
        call_command("migrate", "soakapp", verbosity=0)
        print("re-created the soak's tables: they were made by an older benchmarks.soakapp")


# Columns the checker and the handlers rely on that older soak databases lack.
REQUIRED_COLUMNS = {
    ("soak_run", "tid"),
    ("soak_run", "thread_start"),
    ("soak_transition", "xact_at"),
    ("soak_transition", "attempts"),
}


def schema_current():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name IN ('soak_run', 'soak_transition')"
        )
        return set(cursor.fetchall()) >= REQUIRED_COLUMNS


def db_connect(name):
    import psycopg

    from django_dbqueue.connections import connection_params

    return psycopg.connect(
        **{**connection_params("default"), "application_name": name}, autocommit=True
    )


def _die_with_the_soak():
    """In a worker, before it runs: be killed when the soak dies, however it dies (a SIGKILL
    from a test's timeout runs no ``finally``), rather than live on as an orphan claiming jobs.
    Linux's parent-death signal; it survives the worker's own restart in place (execv)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Clock:
    """This process's clock in the database's: ``time.time()`` plus the offset measured once."""

    def __init__(self, conn):
        best = None
        for _ in range(7):
            before = time.time()
            (db,) = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
            after = time.time()
            if best is None or after - before < best[0]:
                best = (after - before, float(db) - (before + after) / 2)
        self.offset = best[1]

    def db(self, at=None):
        at = time.time() if at is None else at
        return datetime.datetime.fromtimestamp(at + self.offset, datetime.UTC)


# -- the fleet ----------------------------------------------------------------------------------


class Slot:
    """One worker of the fleet: its mode and queues, and the process serving it now."""

    def __init__(self, soak, index):
        self.soak = soak
        self.index = index
        self.mode = "thread" if index % 2 == 0 else "process"
        self.queues = QUEUE_ORDERS[index % len(QUEUE_ORDERS)]
        # The fair queue's own worker (benchmarks/soak_fair.py): the last of four or more.
        from benchmarks import soak_fair

        self.fair = soak_fair.is_fair_slot(index, soak.args.workers)
        if self.fair:
            self.queues = soak_fair.QUEUE
        self.concurrency = "3" if self.mode == "thread" else "2"
        self.starts = 0
        self.process = None
        self.tag = None
        self.down_until = None  # step: killed, started again then
        self.stopped = None  # the fault entry while SIGSTOPped
        self.log = soak.log_dir / f"worker{index}.log"

    def start(self):
        self.starts += 1
        self.tag = f"w{self.index}.{self.starts}"
        env = dict(os.environ)
        env.update(DBQUEUE_SOAK_WORKER=self.tag, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        if self.fair:
            env["DBQUEUE_SOAK_FAIR"] = "1"  # no limited type: the fair claim (soak_fair.py)
        with open(self.log, "ab") as log:
            log.write(f"=== {self.tag} ({self.mode}) started at step {self.soak.step}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "django",
                    "run_jobqueue",
                    "--settings",
                    "benchmarks.soak_settings",
                    "--queues",
                    self.queues,
                    "--concurrency",
                    self.concurrency,
                    "--execution",
                    self.mode,
                ],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own process group: handler children included
                preexec_fn=_die_with_the_soak,
            )
        self.soak.facts.worker_pids.setdefault(self.process.pid, []).append(self.tag)
        threading.Thread(target=self._reap, args=(self.process, self.tag), daemon=True).start()

    def _reap(self, process, tag):
        code = process.wait()
        at = self.soak.clock.db()
        self.soak.facts.worker_deaths[tag] = at
        if not self.soak.stopping.is_set():  # not the soak's own kill at the end
            self.soak.exits[code] += 1
            self.soak.facts.worker_exits.append((tag, code, at))

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def signal_group(self, signum):
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)


# -- background threads -------------------------------------------------------------------------


class Witness(threading.Thread):
    """Writes ``pg_current_snapshot()`` with the clock every few ms (soak_check's commits)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()

    def run(self):
        conn = None
        while not self.stop.is_set():
            try:
                conn = conn or db_connect("soak witness")
                conn.execute(
                    "INSERT INTO soak_witness (at, snap) "
                    "VALUES (clock_timestamp(), pg_current_snapshot())"
                )
            except Exception:
                conn = None
            self.stop.wait(WITNESS_EVERY)


def process_start(pid):
    """Field 22 of /proc/<pid>/stat, as the handler recorded it (soakapp.jobs.process_start)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def thread_start(pid, tid):
    """Field 22 of /proc/<pid>/task/<tid>/stat, as the handler recorded it."""
    with open(f"/proc/{pid}/task/{tid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


class DeathWatch(threading.Thread):
    """Records when the process and the thread of each run with no end died.

    A process: a pidfd becomes readable when it exits, whoever its parent is. A thread: its
    ``/proc/<pid>/task/<tid>`` is gone (or names another thread), which also happens when its
    process replaces its image in place (a worker restarting itself with ``os.execv`` keeps its
    pid, not its handler threads). The time recorded is the last moment it was *known alive*:
    the clock read just before the look that still found it. It died after that, by at most one
    turn of this loop (about 10 ms for a process, 50 ms for a thread, more on a loaded
    machine). A run with no end is counted until then, never later: the checker may miss an
    overlap shorter than a turn, but cannot report one that did not happen."""

    SCAN_EVERY = 0.05  # seconds between two looks at the runs with no end and their threads
    TURN = 10  # milliseconds a poll() waits

    def __init__(self, soak):
        super().__init__(daemon=True)
        self.soak = soak
        self.stop = threading.Event()
        self.fds = {}  # fd -> (pid, proc_start)
        self.alive_at = {}  # fd -> database time at which it was last known alive
        self.known = set()  # processes watched once
        self.threads = {}  # run id -> [(pid, tid, thread_start), last known alive]

    def run(self):
        poller = select.poll()
        conn, scanned = None, 0.0
        while not self.stop.is_set():
            if time.monotonic() - scanned >= self.SCAN_EVERY:
                scanned = time.monotonic()
                try:
                    conn = conn or db_connect("soak deathwatch")
                    rows = conn.execute(
                        "SELECT id, pid, proc_start, tid, thread_start, started_at FROM soak_run "
                        "WHERE ended_at IS NULL"
                    ).fetchall()
                except Exception:
                    conn, rows = None, None
                if rows is not None:
                    self._scan(poller, rows)
            before = self.soak.clock.db()
            ready = {fd for fd, _event in poller.poll(self.TURN)}
            for fd in list(self.fds):
                if fd not in ready:
                    self.alive_at[fd] = before  # unreadable at poll()'s entry, after `before`
                    continue
                self.soak.facts.deaths[self.fds.pop(fd)] = self.alive_at.pop(fd)
                poller.unregister(fd)
                os.close(fd)

    def _scan(self, poller, rows):
        facts = self.soak.facts
        open_runs = set()
        for run_id, pid, proc_start, tid, started_thread, started in rows:
            open_runs.add(run_id)
            if (pid, proc_start) not in self.known:
                self.known.add((pid, proc_start))
                self._watch(poller, pid, proc_start, started)
            thread = (pid, tid, started_thread)
            if run_id not in self.threads and thread not in facts.thread_deaths:
                self.threads[run_id] = [thread, started]  # it recorded its start: alive then
        for run_id in set(self.threads) - open_runs:
            del self.threads[run_id]  # it ended: its end is recorded
        before = self.soak.clock.db()
        for run_id, (thread, alive) in list(self.threads.items()):
            pid, tid, started_thread = thread
            try:
                same = thread_start(pid, tid) == started_thread
            except (OSError, ValueError, IndexError):
                same = False
            if same:
                self.threads[run_id][1] = before
                continue
            facts.thread_deaths[thread] = alive
            del self.threads[run_id]

    def _watch(self, poller, pid, proc_start, started):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = None
        if fd is not None:
            try:
                same = process_start(pid) == proc_start
            except OSError:
                same = False
            if same:
                self.fds[fd] = (pid, proc_start)
                self.alive_at[fd] = started  # it recorded the run's start: alive then
                poller.register(fd, select.POLLIN)
                return
            os.close(fd)
        # Gone before we looked: its death is known only to be after its start.
        self.soak.facts.deaths[(pid, proc_start)] = None
        self.soak.unseen_deaths += 1


class Holder(threading.Thread):
    """Runs workflow inserts inside transactions it keeps open (issue 25, race 4)."""

    def __init__(self, soak):
        super().__init__(daemon=True)
        self.soak = soak
        self.tasks = queue.SimpleQueue()

    def run(self):
        from django.db import connection, transaction

        from django_dbqueue import enqueue

        while True:
            task = self.tasks.get()
            if task is None:
                connection.close()
                return
            depends_on, payload, hold = task
            if self.soak.draining.is_set():
                continue  # the producer is off
            entry = ["hold", depends_on, self.soak.clock.db(), None]
            self.soak.facts.holds.append(entry)
            try:
                with transaction.atomic():
                    enqueue("soak-work", payload, depends_on=depends_on, on_failure="run")
                    time.sleep(hold)  # the open transaction is the fault itself
            except Exception as exc:
                self.soak.note_error("holder", exc)
            finally:
                entry[3] = self.soak.clock.db()


SIGNAL_ROW = """
INSERT INTO soak_signal (job_id, name, value, seq, held, sent_at)
VALUES (%s, %s, %s, %s, %s, clock_timestamp())
RETURNING id
"""
SIGNAL_COMMITTED = "UPDATE soak_signal SET committed_by = clock_timestamp() WHERE id = %s"


def send_signal(job_id, value, hold):
    """``signal_job(job_id, "go", value)`` and its ``soak_signal`` row in one transaction, kept
    open ``hold`` seconds after the call (the job's row stays locked meanwhile: a run writing
    its wait then waits for the commit, and must read the signal after it); then, after the
    commit returned, the database's clock as ``committed_by``. Returns the signal's seq (None:
    the job had finished, nothing was stored)."""
    from django.db import connection, transaction

    from django_dbqueue import signal_job

    with transaction.atomic(), connection.cursor() as cursor:
        seq = signal_job(job_id, "go", value)
        cursor.execute(SIGNAL_ROW, [job_id, "go", value, seq, hold])
        (row,) = cursor.fetchone()
        if hold:
            time.sleep(hold)  # the open transaction is the race itself
    with connection.cursor() as cursor:
        cursor.execute(SIGNAL_COMMITTED, [row])
    return seq


class Signaller(threading.Thread):
    """Sends the signals whose transaction is kept open, off the soak's loop."""

    def __init__(self, soak):
        super().__init__(daemon=True)
        self.soak = soak
        self.tasks = queue.SimpleQueue()

    def run(self):
        from django.db import connection

        while True:
            task = self.tasks.get()
            if task is None:
                connection.close()
                return
            if self.soak.draining.is_set():
                continue  # the producer is off
            self.soak.signal(*task)


class Gripper(threading.Thread):
    """A caller's transaction that holds our rows (issue 35; benchmarks/soak_hostile.py): locks
    ``FOR UPDATE`` a few pending jobs, running jobs or limiter rows, picked by the drawn
    fractions among those there are when it runs, for ``hold`` seconds, then commits."""

    def __init__(self, soak):
        super().__init__(daemon=True)
        self.soak = soak
        self.tasks = queue.SimpleQueue()

    def run(self):
        from benchmarks import soak_hostile

        conn = None
        while True:
            task = self.tasks.get()
            if task is None:
                if conn is not None:
                    conn.close()
                return
            target, hold, fractions = task
            if self.soak.draining.is_set():
                continue  # the hostile actor is off
            entry = None
            try:
                conn = conn or db_connect("soak gripper")
                found = [r[0] for r in conn.execute(soak_hostile.GRIP_TARGETS[target])]
                if not found:
                    continue
                ids = sorted({found[int(x * len(found))] for x in fractions})
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '2s'")  # not behind a stopped worker
                    conn.execute(soak_hostile.GRIP_LOCK[target], [ids])
                    entry = ["grip", target, ids, self.soak.clock.db(), None]
                    self.soak.facts.grips.append(entry)
                    time.sleep(hold)  # the open transaction is the fault itself
            except Exception as exc:
                self.soak.note_error(f"hostile grip {target}", exc)
                conn = None if conn is None or conn.closed else conn
            finally:
                if entry is not None:
                    entry[4] = self.soak.clock.db()


# -- the soak -----------------------------------------------------------------------------------


class Soak:
    def __init__(self, args):
        import tempfile

        from benchmarks import soak_settings
        from benchmarks.soak_check import Checker, Facts

        self.args = args
        self.step = 0
        self.log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix=f"{args.database}-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.admin = db_connect("soak admin")
        self.clock = Clock(self.admin)
        self.facts = Facts(lease=soak_settings.LEASE, sweep=soak_settings.SWEEP_INTERVAL)
        self.exits = collections.Counter()
        self.unseen_deaths = 0
        self.counts = collections.Counter()
        self.rng = {
            name: random.Random(f"{args.seed}:{name}")
            for name in ("producer", "operator", "fault", "hostile")
        }
        self.slots = [Slot(self, i) for i in range(args.workers)]
        self.events = collections.defaultdict(list)  # step -> [callable]
        self.recent = collections.deque(maxlen=40)  # ids enqueued lately
        self.checker = Checker(
            db_connect("soak checker"), self.facts, lambda: [s.log for s in self.slots]
        )
        self.check_lock = threading.Lock()
        self.resume_lock = threading.Lock()  # a stopped worker's resume: its timer or the drain
        self.stopping = threading.Event()
        self.draining = threading.Event()
        self.holder = Holder(self)
        self.gripper = Gripper(self)
        self.unrepaired = set()  # retyped jobs whose type the hostile actor has not put back
        self.signaller = Signaller(self)
        self.signals_planned = 0  # the payload of the next signal: unique, in the schedule's order
        self.schedule = open(self.log_dir / "schedule.log", "w")  # noqa: SIM115 - closed in run()

    # -- bookkeeping ---------------------------------------------------------------------------

    def note_error(self, who, exc):
        text = f"{who} at step {self.step}: {type(exc).__name__}: {exc}".strip()
        self.facts.errors.append(text)
        self.counts[f"{who} errors"] += 1

    def plan(self, actor, kind, draws, detail=""):
        """One line of the schedule (``schedule.log``): what the seed decided at this step.
        Two runs of one seed write the same file; the jobs an action hit are not in it."""
        numbers = " ".join(f"{x:.6f}" for x in draws)
        self.schedule.write(f"{self.step} {actor} {kind} [{numbers}] {detail}\n")

    def at(self, step, action):
        self.events[step].append(action)

    def say(self, text):
        print(f"[step {self.step:5d}] {text}", flush=True)

    def reset(self):
        present = {
            name
            for (name,) in self.admin.execute(
                "SELECT tablename FROM pg_tables WHERE tablename = ANY(%s)", [RESET_TABLES]
            ).fetchall()
        }
        tables = ", ".join(t for t in RESET_TABLES if t in present)
        self.admin.execute(f"TRUNCATE {tables} RESTART IDENTITY")

    # -- the loop ------------------------------------------------------------------------------

    def run(self):
        args = self.args
        print(
            f"soak seed: {args.seed}  (replay: python benchmarks/soak.py --minutes {args.minutes:g}"
            f" --seed {args.seed} --workers {args.workers} --database {args.database})",
            flush=True,
        )
        print(f"database {args.database}, worker logs in {self.log_dir}", flush=True)
        self.reset()
        witness, deathwatch, holder = Witness(), DeathWatch(self), self.holder
        for thread in (witness, deathwatch, holder, self.signaller, self.gripper):
            thread.start()
        checker = threading.Thread(target=self._check_loop, daemon=True)
        for slot in self.slots:
            slot.start()
        checker.start()
        steps = int(args.minutes * 60 / STEP)
        began = time.monotonic()
        try:
            for self.step in range(steps):
                faulthandler.dump_traceback_later(STEP_STALL)
                for action in self.events.pop(self.step, ()):
                    action()
                self.supervise()
                self.produce(self.rng["producer"])
                self.operate(self.rng["operator"])
                self.inject(self.rng["fault"])
                self.hostile(self.rng["hostile"])
                delay = began + (self.step + 1) * STEP - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the schedule's pace; a late step runs at once
            self.drain()
        finally:
            faulthandler.cancel_dump_traceback_later()
            self.stopping.set()
            checker.join()
            with self.check_lock:
                self.checker.check(final=True)
            holder.tasks.put(None)
            self.signaller.tasks.put(None)
            self.gripper.tasks.put(None)
            witness.stop.set()
            deathwatch.stop.set()
            for slot in self.slots:
                slot.signal_group(signal.SIGCONT)
                slot.signal_group(signal.SIGKILL)
            try:
                self.dump_facts()
            except Exception as exc:  # a post-mortem aid: it must never cost the report
                print(f"facts.json not written: {type(exc).__name__}: {exc}", flush=True)
            self.schedule.close()
        return self.report()

    def dump_facts(self):
        """What the soak knew, for a post-mortem: deaths, faults, holds, errors."""
        import json

        facts = self.facts
        # Copies: the reapers of the workers killed just before still write worker_deaths
        # (a dict changing size while json iterated over it cost the 30-minute run its report).
        worker_deaths = dict(facts.worker_deaths)
        (self.log_dir / "facts.json").write_text(
            json.dumps(
                {
                    "seed": self.args.seed,
                    "deaths": [[pid, ps, at] for (pid, ps), at in list(facts.deaths.items())],
                    "thread_deaths": [[*k, at] for k, at in list(facts.thread_deaths.items())],
                    "worker_deaths": worker_deaths,
                    "faults": facts.faults,
                    "holds": facts.holds,
                    "grips": facts.grips,
                    "worker_exits": facts.worker_exits,
                    "worker_pids": dict(facts.worker_pids),
                    "poisoned": [
                        [p.job, p.name, p.at, p.attempts] for p in list(facts.poisoned.values())
                    ],
                    "door_calls": [
                        [c.name, c.expect, c.outcome, c.job, c.detail] for c in facts.door_calls
                    ],
                    "errors": facts.errors,
                },
                default=str,
                indent=1,
            )
        )

    def _check_loop(self):
        while not self.stopping.wait(self.args.check_every):
            with self.check_lock:
                try:
                    new = self.checker.check()
                except Exception as exc:
                    self.say(f"check failed: {type(exc).__name__}: {exc}")
                    continue
            for violation in new:
                self.say(f"VIOLATION [{violation.kind}] {violation.text}")

    def supervise(self):
        for slot in self.slots:
            if slot.process is not None and not slot.alive() and slot.down_until is None:
                slot.stopped = None
                slot.start()

    def drain(self):
        from django_dbqueue import resume_queue

        self.say("drain: producers, operators and faults off")
        self.draining.set()
        self.events.clear()
        for job_id in sorted(self.unrepaired):
            self.repair(job_id)  # its step was cleared with the other events
        for slot in self.slots:
            with self.resume_lock:
                if slot.stopped is not None:
                    slot.stopped[3] = self.clock.db()
                    slot.stopped = None
                slot.signal_group(signal.SIGCONT)
            slot.down_until = None
        for name in PAUSABLE:
            resume_queue(name, by="soak")
        began = time.monotonic()
        newest, changed, why = None, began, "at its limit (--drain)"
        while time.monotonic() - began < self.args.drain:
            faulthandler.dump_traceback_later(STEP_STALL)
            self.supervise()
            left, last = self.admin.execute(
                "SELECT (SELECT count(*) FROM dbqueue_job "
                "        WHERE state NOT IN ('done', 'dead', 'cancelled')), "
                "       (SELECT max(id) FROM soak_transition)"
            ).fetchone()
            if not left:
                why = "every job finished"
                break
            if last != newest:
                newest, changed = last, time.monotonic()
            elif time.monotonic() - changed >= STALL:
                why = f"stalled: no job changed state for {STALL:g}s"
                break
            time.sleep(0.25)  # the drain's poll of the table
        self.say(f"drain: ended after {time.monotonic() - began:.1f}s, {why}")

    # -- producer --------------------------------------------------------------------------------

    PRODUCE = [
        ("plain", 20),
        ("limited", 10),
        ("typed", 8),
        ("rated", 8),
        ("serial", 14),
        ("unique", 6),
        ("chain", 6),
        ("group", 6),
        ("graph", 6),
        ("after", 4),
        ("held", 2),
        ("delivery", 4),
        ("atomic", 4),
        ("hang", 2),
        ("partitions", 4),
        ("steps", 5),
        ("waits", 10),
        ("sql", 6),
        ("publish", 6),
        ("batch", 6),
        ("fair", 6),
    ]

    def payload(self, rng, *, fail_rate=0.25):
        roll = rng.random()
        fail = [] if roll >= fail_rate else ([1] if roll < fail_rate / 2 else [1, 2, 3])
        return {
            "ms": rng.choice([20, 50, 100, 200, 400]),
            "fail": fail,
            "ignore_cancel": rng.random() < 0.3,
        }

    def produce(self, rng):
        act = rng.random() < 0.45
        kind = rng.choices([k for k, _ in self.PRODUCE], [w for _, w in self.PRODUCE])[0]
        draws = [rng.random() for _ in range(8)]  # the action's own choices, drawn every step
        payload = self.payload(rng)
        if not act:
            return
        self.plan("producer", kind, draws, payload)
        try:
            ids = getattr(self, f"_produce_{kind}")(draws, payload, rng)
        except Exception as exc:
            self.note_error(f"producer {kind}", exc)
            return
        self.counts[f"produce {kind}"] += 1
        self.recent.extend(ids)

    def _one(self, job_type="soak-work", payload=None, **options):
        from django_dbqueue import enqueue

        return [enqueue(job_type, payload or {}, **options).id]

    def _produce_plain(self, d, payload, rng):
        return self._one(payload=payload)

    def _produce_limited(self, d, payload, rng):
        return self._one(payload=payload, queue="limited")

    @staticmethod
    def _acct(d):
        """Half of the jobs on three hot partitions (their windows fill), half on new ones
        (each creates its limiter row in the claim: issue 25's race 7 needs new keys)."""
        return f"a{int(d[3] * 3)}" if d[2] < 0.5 else f"n{int(d[3] * 100_000)}"

    def _produce_typed(self, d, payload, rng):
        payload["acct"] = self._acct(d)
        return self._one("soak-typed", payload, queue=PAUSABLE[int(d[1] * 3)])

    def _produce_rated(self, d, payload, rng):
        payload["acct"] = self._acct(d)
        return self._one(payload=payload, queue="rated")

    def _produce_partitions(self, d, payload, rng):
        """Jobs of two new rate partitions at once, in every queue and as the keyed type, in
        one statement: claims serving the queues in other orders meet both new keys together
        (issue 25, race 7: two claims creating limiter rows in opposite orders)."""
        from django_dbqueue import enqueue_many

        one, two = f"p{int(d[0] * 10**9)}", f"q{int(d[1] * 10**9)}"
        items = [{"type": "soak-work", "payload": {**payload, "acct": a}, "queue": "rated"}
                 for a in (one, two)]  # fmt: skip
        items += [
            {"type": "soak-typed", "payload": {**payload, "acct": a}, "queue": q}
            for a in (two, one)
            for q in PAUSABLE
        ]
        return [j.id for j in enqueue_many(items)]

    def _produce_serial(self, d, payload, rng):
        queue_name = "limited" if d[1] < 0.3 else "default"
        return self._one(payload=payload, queue=queue_name, serial_key=f"s{int(d[0] * 5)}")

    def _produce_sql(self, d, payload, rng):
        """A job from plain SQL (``dbqueue_enqueue``, issue 28) with the type's own attempts and
        lease, half of them on the serial keys of ``_produce_serial``: the row enqueue() writes,
        so the same promises hold for it."""
        import json

        from django.db import connection

        from benchmarks import soak_settings

        queue_name = "limited" if d[1] < 0.3 else "default"
        key = f"s{int(d[0] * 5)}" if d[2] < 0.5 else None
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT dbqueue.dbqueue_enqueue('soak-work', %s::jsonb, queue => %s, max_attempts => 3, "
                "lease_seconds => %s, serial_key => %s)",
                [json.dumps(payload), queue_name, float(soak_settings.LEASE), key],
            )
            return [cursor.fetchone()[0]]

    def _produce_unique(self, d, payload, rng):
        mode = "pending" if d[1] < 0.5 else "active"
        return self._one(payload=payload, unique_key=f"u{int(d[0] * 5)}", unique_while=mode)

    def _member(self, rng):
        payload = self.payload(rng, fail_rate=0.35)
        return {"type": "soak-work", "payload": payload, "max_attempts": 2}

    def _produce_chain(self, d, payload, rng):
        from django_dbqueue import chain

        members = [self._member(rng) for _ in range(2 + int(d[0] * 3))]
        return [j.id for j in chain(*members)]

    def _produce_group(self, d, payload, rng):
        from django_dbqueue import group

        members = [self._member(rng) for _ in range(2 + int(d[0] * 3))]
        then = {"type": "soak-work", "payload": payload}
        if d[1] < 0.5:
            then["on_failure"] = "run"
        return [j.id for j in group(*members, then=then)]

    def _produce_graph(self, d, payload, rng):
        from django_dbqueue import workflow

        wf = workflow()
        a = wf.add("soak-work", self._member(rng)["payload"], max_attempts=2)
        b = wf.add("soak-work", self._member(rng)["payload"], max_attempts=2)
        c = wf.add("soak-work", self._member(rng)["payload"], depends_on=[a], max_attempts=2)
        wf.add("soak-work", payload, depends_on=[a, b, c], on_failure="run")
        if d[0] < 0.5:
            wf.add("soak-work", payload, depends_on=[b, c], serial_key=f"s{int(d[1] * 5)}")
        return [j.id for j in wf.enqueue()]

    def _candidates(self, sql, params=()):
        return [row[0] for row in self.admin.execute(sql, params).fetchall()]

    def _produce_after(self, d, payload, rng):
        """One job depending on jobs enqueued lately (some running now)."""
        recent = sorted(self.recent)
        if not recent:
            return []
        picks = sorted({recent[int(x * len(recent))] for x in d[:2]})
        live = self._candidates(
            "SELECT id FROM dbqueue_job WHERE id = ANY(%s) AND state NOT IN ('dead', 'cancelled')",
            [picks],
        )
        if not live:
            return []
        on_failure = "run" if d[2] < 0.5 else "cancel"
        return self._one(payload=payload, depends_on=live, on_failure=on_failure)

    def _produce_held(self, d, payload, rng):
        """A workflow insert depending on a running job, in a transaction held for seconds."""
        running = self._candidates("SELECT id FROM dbqueue_job WHERE state = 'running' ORDER BY id")
        hold = 1.0 + d[1] * 6.0
        if running:
            self.holder.tasks.put(([running[int(d[0] * len(running))]], payload, hold))
        return []

    def _produce_publish(self, d, payload, rng):
        """An event to the soak's subscribers (benchmarks/soak_publish.py), three in four with
        an idempotency key from a small set, so keys repeat; each call that returned is noted
        for the checker, with the jobs it returned."""
        from benchmarks import soak_publish
        from django_dbqueue import publish

        key = f"k{int(d[1] * soak_publish.KEYS)}" if d[0] < 0.75 else None
        event = publish(soak_publish.EVENT, payload, idempotency_key=key)
        self.facts.publishes.append((key, event.id, event.created, [j.id for j in event.jobs]))
        return [j.id for j in event.jobs if j.created]

    def _produce_batch(self, d, payload, rng):
        """Three to eight jobs of the batch type at once (benchmarks/soak_batch.py), each with
        its own failure plan, drawn from the step's draws: most never fail, some fail on their
        first attempt, some on the first two, some on all three (dead)."""
        from benchmarks import soak_batch
        from django_dbqueue import enqueue_many

        plans = random.Random(d[1])
        jobs = []
        for _ in range(3 + int(d[0] * 6)):
            roll = plans.random()
            fail = (
                [] if roll >= 0.3 else [1] if roll < 0.15 else [1, 2] if roll < 0.23 else [1, 2, 3]
            )
            jobs.append((soak_batch.TYPE, {"ms": payload["ms"], "fail": fail}))
        return [queued.id for queued in enqueue_many(jobs)]

    def _produce_fair(self, d, payload, rng):
        """A backlog of the key ``hog`` or single jobs of new keys in the fair queue, served by
        its own worker (benchmarks/soak_fair.py); nothing with fewer than four workers."""
        from benchmarks import soak_fair
        from django_dbqueue import enqueue_many

        items = soak_fair.produce(d, payload, self.args.workers)
        return [queued.id for queued in enqueue_many(items)] if items else []

    def _produce_delivery(self, d, payload, rng):
        return self._one("soak-deliver", payload)

    def _produce_atomic(self, d, payload, rng):
        return self._one("soak-atomic", payload)

    def _produce_steps(self, d, payload, rng):
        """Three durable steps (soakapp.jobs.steps), ``ms`` each; the payload's failures
        (``fail``) happen in one of them, and three jobs in ten have one slow step (1 to 3 s)
        that faults are likely to find a body in."""
        payload["fail_step"] = int(d[0] * 3)
        if d[1] < 0.3:
            payload["slow"], payload["slow_ms"] = int(d[2] * 3), 1000 + int(d[3] * 2000)
        return self._one("soak-steps", payload)

    # Signals to a soak-waits job, in seconds after its enqueue: before it reaches its first wait
    # (a claim, a step and a nap of 0.1 to 1 s come first), around the moment it reaches one or
    # while it waits, near or past a timeout (3 to 8 s), past them all (often refused: done).
    SIGNAL_DELAYS = [((0.0, 0.3), 25), ((0.5, 4.0), 40), ((4.0, 10.0), 25), ((10.0, 16.0), 10)]

    def _produce_waits(self, d, payload, rng):
        """A job of durable waits (soakapp.jobs.waits): a nap of 0.1 to 1 s, a snooze once in a
        quarter of the jobs, one or two waits for ``go`` with a timeout of 3 to 8 s, failing
        after them as ``fail`` says; and its signals, each planned now (a unique payload, a
        delay, a transaction held open 0.2 to 1 s for three in ten), sent at its step: as many
        as its waits, one fewer or one more."""
        payload["nap"] = round(0.1 + d[0] * 0.9, 3)
        payload["timeout"] = round(3.0 + d[1] * 5.0, 3)
        payload["waits"] = 1 if d[2] < 0.5 else 2
        if d[3] < 0.25:
            payload["snooze"] = round(0.3 + d[4] * 1.2, 3)
        count = payload["waits"] + (-1 if d[5] < 0.15 else 1 if d[5] >= 0.85 else 0)
        plans = []
        for _ in range(count):
            bucket = rng.choices(
                [r for r, _ in self.SIGNAL_DELAYS], [w for _, w in self.SIGNAL_DELAYS]
            )[0]
            delay = bucket[0] + rng.random() * (bucket[1] - bucket[0])
            hold = round(0.2 + rng.random() * 0.8, 3) if rng.random() < 0.3 else 0.0
            self.signals_planned += 1
            plans.append((delay, hold, self.signals_planned))
        ids = self._one("soak-waits", payload)
        for delay, hold, value in plans:
            when = self.step + max(1, round(delay / STEP))
            self.plan("producer", "signal", [delay, hold], f"payload {value} at step {when}")
            self.at(when, lambda value=value, hold=hold: self._signal_later(ids[0], value, hold))
        return ids

    def _signal_later(self, job_id, value, hold):
        if hold:
            self.signaller.tasks.put((job_id, value, hold))
        else:
            self.signal(job_id, value, hold)

    def signal(self, job_id, value, hold):
        try:
            seq = send_signal(job_id, value, hold)
        except Exception as exc:
            self.note_error("producer signal", exc)
            return
        self.counts["signal " + ("refused" if seq is None else "held" if hold else "sent")] += 1

    def _produce_hang(self, d, payload, rng):
        options = {"serial_key": f"s{int(d[1] * 5)}"} if d[0] < 0.3 else {}
        return self._one("soak-hang", {"hang": 4 + d[2] * 4}, **options)

    # -- operator --------------------------------------------------------------------------------

    OPERATE = [("requeue", 5), ("requeue-dead", 1), ("requeue-serial", 3), ("requeue-dependency", 3),
               ("cancel", 3), ("cancel-running", 3), ("pause", 2)]  # fmt: skip

    # Requeues aimed where issue 25 found races: an older job of a serial key while newer ones
    # of the key are pending or running (a claim of a newer one may be under way), and a failed
    # dependency while another dependency of its dependent is running (its completion may be
    # under way).
    REQUEUE_SERIAL = """
        SELECT o.id FROM dbqueue_job AS o
        WHERE o.state IN ('dead', 'cancelled') AND o.serial_key IS NOT NULL AND o.type = ANY(%s)
          AND EXISTS (SELECT 1 FROM dbqueue_job AS n
                      WHERE n.serial_key = o.serial_key AND n.id > o.id
                        AND n.state IN ('pending', 'running'))
        ORDER BY o.id
    """
    REQUEUE_DEPENDENCY = """
        SELECT DISTINCT f.id FROM dbqueue_job AS f
        JOIN dbqueue_dependency AS e ON e.depends_on_id = f.id
        JOIN dbqueue_dependency AS o ON o.job_id = e.job_id AND o.depends_on_id <> f.id
        JOIN dbqueue_job AS r ON r.id = o.depends_on_id
        WHERE f.state IN ('dead', 'cancelled') AND f.type = ANY(%s) AND r.state = 'running'
        ORDER BY f.id
    """

    def operate(self, rng):
        act = rng.random() < 0.08
        kind = rng.choices([k for k, _ in self.OPERATE], [w for _, w in self.OPERATE])[0]
        draws = [rng.random() for _ in range(4)]
        if not act:
            return
        self.plan("operator", kind, draws)
        try:
            getattr(self, f"_operate_{kind.replace('-', '_')}")(draws)
        except Exception as exc:
            self.note_error(f"operator {kind}", exc)
            return
        self.counts[f"operator {kind}"] += 1

    def _pick(self, d, sql, params, n):
        found = self._candidates(sql, params)
        if not found:
            return []
        return sorted({found[int(x * len(found))] for x in d[:n]})

    def _operate_requeue(self, d):
        from django.core.management import call_command

        ids = self._pick(
            d,
            "SELECT id FROM dbqueue_job WHERE state IN ('dead', 'cancelled') AND type = ANY(%s) "
            "ORDER BY id",
            [list(REQUEUABLE)],
            1 + int(d[3] * 3),
        )
        if ids:
            call_command("jobqueue_requeue", ids=ids, stdout=io.StringIO(), stderr=io.StringIO())

    def _operate_requeue_serial(self, d):
        from django.core.management import call_command

        ids = self._pick(d, self.REQUEUE_SERIAL, [list(REQUEUABLE)], 1)
        if ids:
            call_command("jobqueue_requeue", ids=ids, stdout=io.StringIO(), stderr=io.StringIO())

    def _operate_requeue_dependency(self, d):
        from django.core.management import call_command

        ids = self._pick(d, self.REQUEUE_DEPENDENCY, [list(REQUEUABLE)], 1)
        if ids:
            call_command("jobqueue_requeue", ids=ids, stdout=io.StringIO(), stderr=io.StringIO())

    def _operate_requeue_dead(self, d):
        from django.core.management import call_command

        call_command(
            "jobqueue_requeue", dead=True, type="soak-work", stdout=io.StringIO(),
            stderr=io.StringIO(),
        )  # fmt: skip

    def _operate_cancel(self, d):
        from django_dbqueue import cancel

        ids = self._pick(
            d,
            "SELECT id FROM dbqueue_job WHERE state IN ('pending', 'waiting') ORDER BY id",
            [],
            1 + int(d[3] * 3),
        )
        if ids:
            cancel(ids, by="soak")

    def _operate_cancel_running(self, d):
        from django_dbqueue import cancel

        ids = self._pick(d, "SELECT id FROM dbqueue_job WHERE state = 'running' ORDER BY id", [], 1)
        if ids:
            cancel(ids, by="soak")

    def _operate_pause(self, d):
        from django_dbqueue import pause_queue, resume_queue

        name = PAUSABLE[int(d[0] * len(PAUSABLE))]
        pause_queue(name, by="soak")

        def resume():
            try:
                resume_queue(name, by="soak")
                self.counts["operator resume"] += 1
            except Exception as exc:
                self.note_error("operator resume", exc)

        self.at(self.step + 10 + int(d[1] * 30), resume)

    # -- faults ----------------------------------------------------------------------------------

    FAULTS = [("kill", 3), ("terminate", 3), ("stop", 2), ("sigterm", 1)]

    def inject(self, rng):
        act = rng.random() < 0.02
        kind = rng.choices([k for k, _ in self.FAULTS], [w for _, w in self.FAULTS])[0]
        slot = self.slots[int(rng.random() * len(self.slots))]
        length = rng.random()
        if not act:
            return
        self.plan("fault", kind, [length], f"worker slot {slot.index}")
        if not slot.alive() or slot.stopped is not None or slot.down_until is not None:
            self.counts["fault skipped (worker down or stopped)"] += 1
            return
        getattr(self, f"_fault_{kind}")(slot, length)
        self.counts[f"fault {kind}"] += 1

    def _fault_kill(self, slot, length):
        now = self.clock.db()
        self.facts.faults.append(["kill", slot.tag, now, now])
        slot.signal_group(signal.SIGKILL)
        slot.down_until = self.step + 5 + int(length * 20)

        def restart():
            slot.down_until = None
            if not slot.alive():
                slot.start()

        self.at(slot.down_until, restart)

    def _fault_terminate(self, slot, length):
        now = self.clock.db()
        self.facts.faults.append(["terminate", slot.tag, now, now])
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [f"soak {slot.tag}"],
        )

    def _fault_stop(self, slot, length):
        from benchmarks import soak_settings

        entry = ["stop", slot.tag, self.clock.db(), None]
        self.facts.faults.append(entry)
        slot.signal_group(signal.SIGSTOP)
        slot.stopped = entry
        seconds = soak_settings.LEASE + 1.5 + length * 2.0

        def resume():
            with self.resume_lock:
                if slot.stopped is entry:
                    entry[3] = self.clock.db()
                    slot.signal_group(signal.SIGCONT)
                    slot.stopped = None

        # Not an event of the soak's loop: the loop's own statements (an operator's cancel, a
        # requeue, a producer's enqueue) can wait on a row lock the stopped worker holds in an
        # open transaction, and would then wait forever for the SIGCONT queued behind them.
        timer = threading.Timer(int(seconds / STEP) * STEP, resume)
        timer.daemon = True
        timer.start()

    def _fault_sigterm(self, slot, length):
        self.facts.faults.append(["sigterm", slot.tag, self.clock.db(), None])
        slot.signal_group(signal.SIGTERM)

    # -- hostile actor (benchmarks/soak_hostile.py) -----------------------------------------------

    HOSTILE = [("door", 4), ("poison", 3), ("retype", 2), ("grip", 3)]

    def hostile(self, rng):
        act = rng.random() < 0.03
        kind = rng.choices([k for k, _ in self.HOSTILE], [w for _, w in self.HOSTILE])[0]
        draws = [rng.random() for _ in range(5)]
        if not act:
            return
        self.plan("hostile", kind, draws)
        try:
            getattr(self, f"_hostile_{kind}")(draws)
        except Exception as exc:
            self.note_error(f"hostile {kind}", exc)
            return
        self.counts[f"hostile {kind}"] += 1

    def _hostile_door(self, d):
        """``dbqueue_enqueue()`` with a payload of soak_hostile.DOOR_PAYLOADS, as a SQL client
        would call it; the call and what came of it go to the checker."""
        import psycopg

        from benchmarks import soak_hostile, soak_settings

        name, text, expect = soak_hostile.DOOR_PAYLOADS[int(d[0] * len(soak_hostile.DOOR_PAYLOADS))]
        queue_name = PAUSABLE[int(d[1] * len(PAUSABLE))]
        job, detail = None, ""
        try:
            (job,) = self.admin.execute(
                "SELECT dbqueue.dbqueue_enqueue(%s, %s::jsonb, queue => %s, max_attempts => 3, "
                "lease_seconds => %s)",
                [soak_hostile.DOOR_TYPE, text, queue_name, float(soak_settings.LEASE)],
            ).fetchone()
            outcome = "taken"
        except psycopg.Error as exc:
            outcome = "refused" if exc.sqlstate == "22023" else "error"
            detail = f"{exc.sqlstate}: {str(exc).splitlines()[0][:300]}"
        self.facts.door_calls.append(soak_hostile.DoorCall(name, expect, outcome, job, detail))

    def _hostile_poison(self, d):
        """A ``soak-poison`` job, due in half a second, whose payload a plain ``UPDATE`` then
        replaces by one of soak_hostile.POISONS while it is pending."""
        from benchmarks import soak_hostile
        from django_dbqueue import enqueue

        name, text = soak_hostile.POISONS[int(d[0] * len(soak_hostile.POISONS))]
        queue_name = PAUSABLE[int(d[1] * len(PAUSABLE))]
        job = enqueue(soak_hostile.POISON_TYPE, {"ms": 20}, queue=queue_name, delay=0.5)
        # Noted before the UPDATE (its time then), so that a check never meets a job dead of its
        # poison that the facts do not name yet; taken back if no row was poisoned.
        poisoned = self.facts.poisoned
        poisoned[job.id] = soak_hostile.Poisoned(job.id, name, self.clock.db(), 0)
        row = self.admin.execute(soak_hostile.POISON_SQL, [text, job.id]).fetchone()
        if row is None:
            del poisoned[job.id]
            return
        attempts, at = row
        poisoned[job.id] = soak_hostile.Poisoned(job.id, name, at, attempts)

    def _hostile_retype(self, d):
        """A ``soak-poison`` job, due in half a second, whose type a plain ``UPDATE`` makes one
        no worker registers while it is pending; put back 1 to 4 s later (``repair``)."""
        from benchmarks import soak_hostile
        from django_dbqueue import enqueue

        queue_name = PAUSABLE[int(d[1] * len(PAUSABLE))]
        job = enqueue(soak_hostile.POISON_TYPE, {"ms": 20}, queue=queue_name, delay=0.5)
        retyped = self.facts.retyped
        retyped[job.id] = soak_hostile.Poisoned(job.id, "type-unknown", self.clock.db(), 0)
        row = self.admin.execute(
            soak_hostile.RETYPE_SQL, [soak_hostile.UNKNOWN_TYPE, job.id]
        ).fetchone()
        if row is None:
            del retyped[job.id]
            return
        attempts, at = row
        retyped[job.id] = soak_hostile.Poisoned(job.id, "type-unknown", at, attempts)
        self.unrepaired.add(job.id)
        self.at(self.step + 10 + int(d[2] * 30), lambda: self.repair(job.id))

    def repair(self, job_id):
        """Put a retyped job's type back (at its step, or at the drain's start)."""
        from benchmarks import soak_hostile

        if job_id not in self.unrepaired:
            return
        self.unrepaired.discard(job_id)
        try:
            self.admin.execute(
                soak_hostile.REPAIR_SQL,
                [soak_hostile.POISON_TYPE, job_id, soak_hostile.UNKNOWN_TYPE],
            )
            self.counts["hostile repair"] += 1
        except Exception as exc:
            self.note_error("hostile repair", exc)

    def _hostile_grip(self, d):
        """A caller's transaction holding pending jobs, running jobs or limiter rows
        ``FOR UPDATE`` for 1 to 5 s (the ``Gripper`` thread, off the soak's loop)."""
        target = ("pending", "running", "limiter")[int(d[0] * 3)]
        hold = 1.0 + d[1] * 4.0
        fractions = d[2 : 2 + 1 + int(d[4] * 3)]
        self.gripper.tasks.put((target, hold, fractions))

    # -- the report ------------------------------------------------------------------------------

    def report(self):
        states = dict(
            self.admin.execute("SELECT state, count(*) FROM dbqueue_job GROUP BY state").fetchall()
        )
        (runs,) = self.admin.execute("SELECT count(*) FROM soak_run").fetchone()
        violations = list(self.checker.found.values())
        producer = {k[8:]: v for k, v in self.counts.items() if k.startswith("produce ")}
        operator = {k[9:]: v for k, v in self.counts.items() if k.startswith("operator ")}
        faults = {k[6:]: v for k, v in self.counts.items() if k.startswith("fault ")}
        errors = {k: v for k, v in self.counts.items() if k.endswith(" errors")}
        print()
        print(f"seed: {self.args.seed}  steps: {self.step + 1}  workers: {self.args.workers}")
        print(f"jobs: {sum(states.values())} {dict(sorted(states.items()))}")
        print(
            f"runs: {runs} (zombie runs past a lease taken over: {len(self.checker.zombies)}, "
            f"{self.checker.stall_excused} of them right after one of "
            f"{len(self.checker.stalls)} stalls of the whole soak; "
            f"deaths unseen: {self.unseen_deaths})"
        )
        print(f"producer actions: {sum(producer.values())} {dict(sorted(producer.items()))}")
        print(
            f"operator actions: {sum(v for k, v in operator.items() if 'errors' not in k)} "
            f"{dict(sorted(operator.items()))}"
        )
        print(
            f"faults injected: {sum(v for k, v in faults.items() if 'skipped' not in k)} "
            f"{dict(sorted(faults.items()))}"
        )
        print(f"worker exits by code: {dict(sorted(self.exits.items()))}")
        steps = self.checker.step_stats
        print(
            f"durable steps: {steps.jobs_done} soak-steps jobs done; step bodies started "
            f"{steps.started}, finished {steps.finished}, steps recorded {steps.recorded}; "
            f"finished but not recorded, excused: {dict(sorted(steps.again.items()))}"
        )
        waits = self.checker.wait_stats
        print(
            f"durable waits: {waits.jobs_done} soak-waits jobs done; signals stored "
            f"{waits.signals} ({waits.held} in a transaction held open), refused "
            f"{waits.refused} (the job had finished); waits for a signal: returned it "
            f"{waits.waits['signal']} (sent before the wait {waits.first_reach}, after the run "
            f"ended at the wait {waits.after_suspend}), timed out {waits.waits['timeout']}, ended "
            f"the run {waits.waits['suspend']}, other {_other(waits.waits)}; sleeps "
            f"{dict(sorted(waits.sleeps.items()))}; snoozes {waits.snoozes}"
        )
        pub = self.checker.publish_stats
        print(
            f"publish: {pub.calls} publishes ({pub.repeats} repeated a key), {pub.events} events, "
            f"{pub.jobs} subscriber jobs, {pub.done} done; plain runs that returned twice "
            f"(at-least-once after a fault): {dict(sorted(pub.returned_twice.items()))}"
        )
        batch = self.checker.batch_stats
        print(
            f"batch handlers: {batch.jobs} soak-batch jobs {dict(sorted(batch.states.items()))}; "
            f"planned failures written {batch.planned}; done jobs by the size of their batch "
            f"{dict(sorted(batch.sizes.items()))}"
        )
        fair = self.checker.fair_stats
        print(
            f"fair queue: {fair.jobs} jobs of {fair.keys} keys in {fair.claims} claims; most claims "
            f"of one key while another waited for its turn {fair.worst} (bound 2); waits past it "
            f"excused by a fault of the fair worker {fair.excused}"
        )
        hostile = {k[8:]: v for k, v in self.counts.items() if k.startswith("hostile ")}
        hs = self.checker.hostile_stats
        print(
            f"hostile actions: {sum(v for k, v in hostile.items() if 'errors' not in k)} "
            f"{dict(sorted(hostile.items()))}; door calls {dict(sorted(hs.doors.items()))}; "
            f"poisoned jobs by state {dict(sorted(hs.poisoned.items()))}; grips {hs.grips}; "
            f"attempts no run began, allowed by {dict(sorted(hs.unrun.items()))}"
        )
        if errors:
            print(f"action errors: {errors}")
            for text in self.facts.errors[:10]:
                print(f"  {text}")
        counts = self.checker.counts()
        print(f"violations by kind: {dict(sorted(counts.items()))}")
        shown = collections.Counter()
        for violation in violations:
            shown[violation.kind] += 1
            if shown[violation.kind] <= 5:
                print(f"  [{violation.kind}] {violation.text}")
        for kind, n in counts.items():
            if n > 5:
                print(f"  [{kind}] ... and {n - 5} more")
        print(f"violations: {len(violations)}", flush=True)
        return 1 if violations else 0


def _other(counter):
    return {k: v for k, v in counter.items() if k not in ("signal", "timeout", "suspend")}


def main(argv=None):
    args = parse_args(argv)
    # Where a soak that does not end is stuck: every thread's stack on SIGUSR1 (the suite's
    # test sends it before it gives up), and by itself when one step of the loop stalls.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    setup(args)
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
