"""The soak's job types. What a run does is decided by its payload, which the soak's seeded
producers wrote: how long it works, on which attempts it fails, whether it heeds a cancel.

Every run records its start and its end in ``soak_run`` (``clock_timestamp()``, pid and tid, job id,
attempt, queue, serial key, and the row's lease token at the start: the run's own, unless its
lease was taken over before it started, which is why the checker finds each run's claim in the
job's transitions) on a connection of its own in autocommit, so a run
whose job is later rolled back, fenced or killed still leaves its record; a run whose process
dies leaves a start with no end, which the checker closes at the process's death.

``soak-steps`` runs durable steps (``ctx.step``); each step's body records its start and, as the
last thing it does, its end in ``soak_step_body`` the same way, with the run's ``soak_run`` id,
so the checker can tell a body that ran again from the one whose record the job kept.

``soak-waits`` runs a step, a durable sleep, maybe a snooze (once per job), then one or two
waits for the signal ``go`` (``ctx.wait_for_signal`` with the payload's timeout, so a job whose
signal never comes still finishes), and fails after them on the attempts its payload names (a
retry replays them). Each call records what came of it in ``soak_wait``, with the run, the
database's clock before the call and after it: the payload a wait returned, a timeout, or that
the run ended at the wait.
"""

import multiprocessing
import os
import threading
import time

import psycopg
from django.db import connection

from benchmarks import soak_batch
from benchmarks.soak_check import STEP_KEYS
from benchmarks.soak_publish import EVENT
from django_dbqueue import DiscardJob, SignalTimeout, Snooze, deliver, job
from django_dbqueue.connections import connection_params

RECORDER_NAME = "soak recorder"  # application_name of the recording connections
TIMEOUT = 1.5  # seconds: the hung type's timeout (benchmarks/soak.py relies on it)

_local = threading.local()
_proc_start = {}

START = """
INSERT INTO soak_run (job_id, attempt, type, queue, serial_key, lease_token, worker, mode, pid,
                      proc_start, tid, thread_start, started_at)
SELECT j.id, %(attempt)s, j.type, j.queue, j.serial_key, j.lease_token, %(worker)s, %(mode)s,
       %(pid)s, %(proc_start)s, %(tid)s, %(thread_start)s, clock_timestamp()
FROM dbqueue_job AS j WHERE j.id = %(job)s
RETURNING id
"""

END = "UPDATE soak_run SET ended_at = clock_timestamp(), outcome = %s WHERE id = %s"

BODY = """
INSERT INTO soak_step_body (job_id, run_id, name, occurrence, attempt, phase, at)
VALUES (%s, %s, %s, %s, %s, %s, now())
RETURNING id
"""

NOW = "SELECT clock_timestamp()"

WAIT = """
INSERT INTO soak_wait (job_id, run_id, attempt, kind, name, occurrence, outcome, value, began_at,
                       at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, clock_timestamp())
RETURNING id
"""

EFFECT = """
INSERT INTO soak_effect (key, n, job_id) VALUES (%s, 1, %s)
ON CONFLICT (key) DO UPDATE SET n = soak_effect.n + 1
"""


def thread_start(pid, tid):
    """The thread's start time (/proc/<pid>/task/<tid>/stat, field 22): with the tid, it names
    the thread running a handler. A thread ends with its process, and also when its process
    replaces its image (``os.execv``: a worker restarting in place keeps its pid, never its
    handler threads)."""
    with open(f"/proc/{pid}/task/{tid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def process_start(pid):
    """The process's start time in clock ticks since boot (/proc/<pid>/stat, field 22): with
    the pid, it names one process even after its pid is reused."""
    if pid not in _proc_start:
        with open(f"/proc/{pid}/stat") as stat:
            _proc_start[pid] = int(stat.read().rsplit(")", 1)[1].split()[19])
    return _proc_start[pid]


def _record(sql, params):
    """Run one recording statement on this thread's own autocommit connection, reconnecting
    once if the soak terminated it. A record that cannot be written fails the run (it is
    retried): the checker must never miss a run."""
    for tries in (1, 2, 3):
        conn = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed:
                conninfo = {**connection_params("default"), "application_name": RECORDER_NAME}
                conn = _local.conn = psycopg.connect(**conninfo, autocommit=True)
            return conn.execute(sql, params).fetchone()
        except psycopg.OperationalError:
            _local.conn = None
            if tries == 3:
                raise
            time.sleep(0.05 * tries)  # a reconnect's back-off, not a wait for a condition
    return None


def _mode():
    return "process" if multiprocessing.current_process().name.startswith("dbqueue") else "thread"


def recorded(body):
    """Wrap a handler body so that its run is recorded from its first to its last moment."""

    def handler(ctx):
        pid = os.getpid()
        row = _record(
            START,
            {
                "attempt": ctx.attempt,
                "worker": os.environ.get("DBQUEUE_SOAK_WORKER", "?"),
                "mode": _mode(),
                "pid": pid,
                "proc_start": process_start(pid),
                "tid": threading.get_native_id(),
                "thread_start": thread_start(pid, threading.get_native_id()),
                "job": ctx.id,
            },
        )
        _local.run = row[0] if row is not None else None  # the step bodies' run (step_body)
        outcome = "raised"
        try:
            result = body(ctx)
            outcome = "returned"
            return result
        finally:
            if row is not None:
                _record(END + " RETURNING id", [outcome, row[0]])

    handler.__name__ = body.__name__
    handler.__doc__ = body.__doc__
    return handler


def work(ctx):
    """Work ``ms`` milliseconds in 10 ms steps (stopping at a cancel unless ``ignore_cancel``),
    then fail if this attempt is listed in ``fail``; ``discard`` on an attempt ends it dead."""
    payload = ctx.payload
    deadline = time.monotonic() + payload.get("ms", 50) / 1000.0
    while time.monotonic() < deadline:
        if not payload.get("ignore_cancel"):
            ctx.raise_if_cancelled()
        time.sleep(0.01)
    if ctx.attempt in payload.get("discard", ()):
        raise DiscardJob(f"discarded on attempt {ctx.attempt}, as the payload asked")
    if ctx.attempt in payload.get("fail", ()):
        raise RuntimeError(f"failed on attempt {ctx.attempt}, as the payload asked")
    return {"attempt": ctx.attempt}


def step_body(ctx, index):
    """The body of the step ``STEP_KEYS[index]``: a ``start`` row, work (``slow_ms`` in the
    ``slow`` step, else ``ms``; stopping at a cancel unless ``ignore_cancel``), fail in the
    ``fail_step`` on the attempts listed in ``fail``, and an ``end`` row as its last act. Returns
    its run's id, so the step's record names the run that finished it."""
    name, occurrence = STEP_KEYS[index]
    payload = ctx.payload
    run = getattr(_local, "run", None)
    row = [ctx.id, run, name, occurrence, ctx.attempt]
    _record(BODY, [*row, "start"])
    ms = payload.get("slow_ms", 1000) if payload.get("slow") == index else payload.get("ms", 50)
    deadline = time.monotonic() + ms / 1000.0
    while time.monotonic() < deadline:
        if not payload.get("ignore_cancel"):
            ctx.raise_if_cancelled()
        time.sleep(0.01)
    if payload.get("fail_step") == index and ctx.attempt in payload.get("fail", ()):
        raise RuntimeError(f"step {name} #{occurrence} failed on attempt {ctx.attempt}, as asked")
    _record(BODY, [*row, "end"])
    return {"run": run, "attempt": ctx.attempt}


def steps(ctx):
    """Durable steps, one after another, nothing between them: each runs once per job."""
    return [ctx.step(name, step_body, ctx, i) for i, (name, _n) in enumerate(STEP_KEYS)]


def _observe(ctx, kind, name, occurrence, call):
    """Call a wait (``call()``) and record what came of it in ``soak_wait``, with the
    database's clock read before the call and after it: ``slept``, ``signal`` (the payload,
    the producer's unique number), ``timeout`` (``SignalTimeout``, returned as ``"timeout"``),
    ``suspend`` (the run ends at the wait), ``snooze`` or ``raised <class>`` (re-raised)."""
    (began,) = _record(NOW, [])
    row = [ctx.id, getattr(_local, "run", None), ctx.attempt, kind, name, occurrence]
    try:
        got = call()
    except SignalTimeout:
        _record(WAIT, [*row, "timeout", None, began])
        return "timeout"
    except BaseException as exc:
        # Suspend (django_dbqueue.steps): the run ends here, the job waits, holding no worker.
        cls = type(exc).__name__
        outcome = {"Suspend": "suspend", "Snooze": "snooze"}.get(cls, f"raised {cls}")
        _record(WAIT, [*row, outcome, None, began])
        raise
    if kind == "sleep":
        _record(WAIT, [*row, "slept", None, began])
    else:
        _record(WAIT, [*row, "signal", got if isinstance(got, int) else None, began])
    return got


def waits(ctx):
    """A step, a durable sleep of ``nap`` seconds, a snooze of ``snooze`` seconds once per job
    (the run that recorded the ``snooze`` step snoozes), then ``waits`` waits for the signal
    ``go`` (``timeout`` seconds each): the n-th takes the job's n-th signal. Fails after them
    on the attempts listed in ``fail``; returns what each wait returned."""
    payload = ctx.payload
    run = getattr(_local, "run", None)
    ctx.step("prepare", lambda: {"run": run})
    _observe(ctx, "sleep", "nap", 1, lambda: ctx.sleep("nap", payload["nap"]))
    if payload.get("snooze") and ctx.step("snooze", lambda: run) == run:
        _observe(ctx, "snooze", "snooze", 1, lambda: _snooze(payload["snooze"]))
    got = [
        _observe(ctx, "signal", "go", n, lambda: ctx.wait_for_signal("go", payload["timeout"]))
        for n in range(1, payload["waits"] + 1)
    ]
    if ctx.attempt in payload.get("fail", ()):
        raise RuntimeError(f"failed after its waits on attempt {ctx.attempt}, as asked")
    return got


def _snooze(seconds):
    raise Snooze(seconds)


def hang(ctx):
    """Hang for ``hang`` seconds, far past the type's timeout, heeding nothing."""
    time.sleep(ctx.payload.get("hang", 20))


def guarded_delivery(ctx):
    """A guarded effect: a delivery record under the job's key, then the effect."""
    work(ctx)
    with deliver(ctx, f"soak:{ctx.id}") as delivery:
        if not delivery.proceed:
            return None
        _record(EFFECT + " RETURNING n", [f"delivery:{ctx.id}", ctx.id])
        delivery.sent("done")
    return None


def guarded_atomic(ctx):
    """A guarded effect: written in the atomic handler's transaction, with its completion."""
    with connection.cursor() as cursor:
        cursor.execute(EFFECT, [f"atomic:{ctx.id}", ctx.id])
    work(ctx)


job("soak-work", queue="default", max_attempts=3)(recorded(work))
# Not in the fair queue's worker (benchmarks/soak_fair.py): a type with fleet-wide limits makes
# every claim of its process the limited claim, which knows no fairness.
if not os.environ.get("DBQUEUE_SOAK_FAIR"):
    job(
        "soak-typed",
        queue="default",
        max_attempts=3,
        global_concurrency=2,
        rate_limit={"limit": 6, "period": 1.0, "key": "acct"},
    )(recorded(work))
job("soak-steps", queue="default", max_attempts=3)(recorded(steps))
job("soak-waits", queue="default", max_attempts=3)(recorded(waits))
job("soak-hang", queue="limited", max_attempts=2, timeout=TIMEOUT)(recorded(hang))
job("soak-deliver", queue="default", max_attempts=3)(recorded(guarded_delivery))
job("soak-atomic", queue="default", max_attempts=3, atomic=True, timeout=10)(
    recorded(guarded_atomic)
)
# The subscribers of the producer's published events (benchmarks/soak_publish.py): one atomic,
# whose effect commits with its job's completion (two successful runs would write it twice),
# one plain. Each fails as its payload's ``fail`` says, as soak-work does.
job("soak-sub-ledger", max_attempts=3, atomic=True, timeout=10, subscribes=[EVENT])(
    recorded(guarded_atomic)
)
job("soak-sub-notify", max_attempts=3, subscribes=[EVENT])(recorded(work))


def accept(ctx):
    """``soak-hostile`` (benchmarks/soak_hostile.py): a job the SQL door took with a payload at
    the edge of what it takes; its run reads the payload (the worker decoded it) and returns."""
    return {"payload": type(ctx.payload).__name__}


# The hostile actor's types (benchmarks/soak_hostile.py): jobs of the SQL door's edge payloads,
# and jobs whose payload a plain UPDATE poisons while they are pending (never run, if all is
# well: ``work`` is what would run).
job("soak-hostile", queue="default", max_attempts=3)(recorded(accept))
job("soak-poison", queue="default", max_attempts=3)(recorded(work))


def batch_work(batch):
    """``soak-batch`` (benchmarks/soak_batch.py): one call for up to ``soak_batch.SIZE`` jobs.
    Records a run per job as ``recorded`` does, works once for the batch (the longest ``ms`` of
    its jobs, at most 200), then settles each job by its own payload: ``batch.fail`` on the
    attempts its ``fail`` lists, else ``batch.succeed`` with a result naming the job, its
    attempt and the batch's size. Each job's run ends ``raised`` or ``returned`` by its mark."""
    pid, tid = os.getpid(), threading.get_native_id()
    runs = {}
    for ctx in batch:
        row = _record(
            START,
            {
                "attempt": ctx.attempt,
                "worker": os.environ.get("DBQUEUE_SOAK_WORKER", "?"),
                "mode": _mode(),
                "pid": pid,
                "proc_start": process_start(pid),
                "tid": tid,
                "thread_start": thread_start(pid, tid),
                "job": ctx.id,
            },
        )
        runs[ctx.id] = row[0] if row is not None else None
    time.sleep(min(200, max(ctx.payload.get("ms", 50) for ctx in batch)) / 1000.0)
    for ctx in batch:
        if ctx.attempt in ctx.payload.get("fail", ()):
            batch.fail(ctx, RuntimeError(soak_batch.planned_failure(ctx.id, ctx.attempt)))
            outcome = "raised"
        else:
            batch.succeed(ctx, {"job": ctx.id, "attempt": ctx.attempt, "batch": len(batch)})
            outcome = "returned"
        if runs[ctx.id] is not None:
            _record(END + " RETURNING id", [outcome, runs[ctx.id]])


job(soak_batch.TYPE, queue="default", max_attempts=3, batch_size=soak_batch.SIZE)(batch_work)
