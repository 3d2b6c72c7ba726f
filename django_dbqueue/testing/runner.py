"""``run_jobs()``: the due jobs, run in the calling thread with the worker's own code.

A pass claims one job with the worker's claim statement (``store.claim``: priorities, serial
keys, paused queues, fair queues, fleet-wide limits), builds its ``JobContext`` as a worker does,
runs it with the handler pool's ``run_handler`` (or ``run_batch``, after the worker's top-up
claim fills the batch), and writes the outcome with the worker's acknowledger (``acks.py``:
the fenced completion that releases workflow dependents, the failure that retries after the
type's backoff or dead-letters, the snooze, the durable wait, the cancel). Nothing here decides
an outcome. It all runs on the test's Django connection: inside ``TestCase`` every write joins
the test's transaction (calls.py says how a handler call is fitted into it).

What a worker does and this does not: leases are taken but never renewed or swept (nothing runs
long enough to lose one), a sync handler's ``timeout`` is not enforced (an async one's is: it is
part of the call), no LISTEN, no wake-ups, no threads, one job at a time.
"""

import datetime
import logging
import os
import secrets
import time
from dataclasses import replace

from .. import flow, registry, store, validation
from ..acks import Acknowledger
from ..claiming import next_cursors, timeout_of
from ..conf import SHARED_FAIR_KEY, get_settings
from ..context import JobContext
from ..exceptions import DBQueueError, InvalidArgument
from ..execution import run_batch, run_handler
from ..inflight import Entry
from ..jobspec import database
from ..scheduler import Scheduler
from ..worker import Worker
from .calls import HandlerCalls, HereLoop, in_transaction
from .enqueued import ENQUEUED, QueuedJob, type_filter
from .report import Ran, Run

logger = logging.getLogger("django_dbqueue")

DEFAULT_MAX_RUNS = 1000
MAX_ADVANCE = 100 * 365.25 * 86400  # seconds: a clock moved further is a mistake
WORKER_PREFIX = "dbqueue-testing:"  # the worker id of run_jobs(), like a worker's host:pid:hex
# What a run came to, as the acknowledger counted the write it made.
_COUNTERS = {
    "succeeded": "done",
    "failed": "retried",
    "dead": "dead",
    "cancelled": "cancelled",
    "deferred": "deferred",
    "snoozed": "snoozed",
    "fenced": "fenced",
}


class TooManyRuns(AssertionError):
    """``run_jobs()`` ran ``max_runs`` jobs and more are due (a job that enqueues itself again,
    or snoozes for no time, would run for ever)."""


class JobsLeftRunning(DBQueueError):
    """An error stopped ``run_jobs()`` between the claim of jobs and the write of their
    outcome: they are left ``running``; the message names them."""


def _seconds(advance, now, using):
    """How far to move the clock: ``advance`` (a timedelta or seconds) or up to ``now``."""
    if advance is not None and now is not None:
        raise InvalidArgument("run_jobs(): pass advance or now, not both")
    if now is not None:
        if not isinstance(now, datetime.datetime) or now.tzinfo is None:
            raise InvalidArgument(
                f"run_jobs(): now must be an aware datetime, got {validation.shown(now)}"
            )
        current = store.db_now(using)
        seconds = (now - current).total_seconds()
        if seconds > MAX_ADVANCE:
            raise InvalidArgument(
                f"run_jobs(): now={now.isoformat()} is more than 100 years after the "
                f"database's now(), {current.isoformat()}"
            )
        if seconds < 0:
            raise InvalidArgument(
                f"run_jobs(): now={now.isoformat()} is before the database's now(), "
                f"{current.isoformat()}; time only moves forward"
            )
        return seconds
    if advance is None:
        return 0.0
    seconds = advance.total_seconds() if isinstance(advance, datetime.timedelta) else advance
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 <= seconds <= MAX_ADVANCE
    ):
        raise InvalidArgument(
            f"run_jobs(): advance must be a timedelta or a number of seconds from 0 to "
            f"{MAX_ADVANCE:g} (100 years), got {validation.shown(advance)}"
        )
    return float(seconds)


def _queues(queues, conf):
    if queues is None:
        return list(conf.QUEUES)
    names = [queues] if isinstance(queues, str) else list(queues)
    for name in names:
        if name not in conf.QUEUES:
            raise InvalidArgument(
                f"run_jobs(): queue {validation.shown(name)} is not in DBQUEUE['QUEUES'] "
                f"({', '.join(conf.QUEUES)})"
            )
    if not names:
        raise InvalidArgument("run_jobs(): queues is empty; None runs every queue")
    return names


def _types(types):
    if types is None:
        return None
    values = [types] if isinstance(types, str) or not hasattr(types, "__iter__") else types
    names = [type_filter(value, "run_jobs(): types")[0] for value in values]
    if not names:
        raise InvalidArgument("run_jobs(): types is empty; None runs every type")
    return sorted(set(names))


def _discover_tasks():
    from ..apps import DBQueueConfig

    if DBQueueConfig._uses_tasks_backend():
        from ..tasks import discover_tasks

        discover_tasks()  # as a worker does at start: every app's @task functions are known


def run_jobs(
    queues=None,
    types=None,
    *,
    advance=None,
    now=None,
    schedules=False,
    max_runs=DEFAULT_MAX_RUNS,
    using=None,
):
    """Run the due jobs of ``queues`` (default: every queue of ``DBQUEUE["QUEUES"]``), one at a
    time in the calling thread, until none is due; returns a :class:`Ran`.

    ``types``: run only jobs of these types (names, ``@job`` functions, or a ``django.tasks``
    Task for every task's job); the others are passed over and stay as they are.
    ``advance`` (a timedelta or seconds) or ``now`` (an aware datetime): first move the queue's
    clock that far (docs/testing.md: every stored time moves into the past, so a retry whose
    backoff ends within it, a job scheduled for then or a durable sleep comes due).
    ``schedules=True``: also tick the periodic entries (DBQUEUE["SCHEDULE"] and the stored ones)
    before each claim, as a worker's scheduler does. ``max_runs``: raise :class:`TooManyRuns`
    when this many runs leave jobs still due.

    Runs on the test's connection: inside ``TestCase``, in its transaction; in autocommit
    (``TransactionTestCase``) every write commits as a worker's would. A job's outcome (done,
    retried, dead, ...) is returned, never raised: a handler's exception is recorded on the job
    as a worker records it."""
    using = database(using)
    conf = get_settings()
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise InvalidArgument(f"run_jobs(): max_runs must be an int >= 1, got {max_runs!r}")
    runner = _Runner(using, conf, _queues(queues, conf), _types(types), max_runs)
    return runner.run(_seconds(advance, now, using), schedules)


class _Runner:
    def __init__(self, using, conf, queues, types, max_runs):
        self.using, self.conf, self.queues, self.types = using, conf, queues, types
        self.max_runs = max_runs
        self.db = store.AliasSession(using)
        # As a worker names itself (worker.make_worker_id), recognisably a test's.
        self.worker_id = f"{WORKER_PREFIX}{os.getpid()}:{secrets.token_hex(3)}"
        self.acks = Acknowledger(
            worker_id=self.worker_id,
            batch=conf.ACK_BATCH,
            async_commit=False,
            unknown_type_delay=conf.UNKNOWN_TYPE_DELAY,
            unknown_type_grace=conf.UNKNOWN_TYPE_GRACE,
            max_snoozes=conf.MAX_SNOOZES,
        )
        self.runs = []
        self.held = []  # (id, run_after) of the jobs of other types held back
        self.claimed = []  # entries claimed and not settled yet
        self.loop = HereLoop()

    def run(self, seconds, schedules):
        _discover_tasks()
        # As the worker's set_flow: fleet-wide limits, fair queues and their cursors.
        self.flow = flow.claim_params(self.conf, self.queues)
        fair = [bool((self.conf.QUEUES.get(q) or {}).get("fair")) for q in self.queues]
        self.fair = fair if any(fair) else None
        self.cursors = {}
        scheduler = Scheduler(self.using, conf=self.conf) if schedules else None
        inside = in_transaction(self.using)
        with HandlerCalls(self.using) as self.calls:
            try:
                if scheduler is not None:
                    scheduler.run_once(db=self.using)  # a new entry starts from now
                if seconds:
                    store.advance_clock(self.using, seconds)
                self._loop(scheduler, inside)
            except Exception as exc:
                if self.claimed:
                    raise JobsLeftRunning(self._left_running(exc)) from exc
                raise
            except BaseException as exc:
                if self.claimed:
                    logger.error("dbqueue testing: %s", self._left_running(exc))
                raise
            finally:
                if self.held:
                    store.release_held(self.using, self.held)
        return self._report()

    def _left_running(self, exc):
        jobs = ", ".join(f"#{e.ctx.id} ({e.ctx.name})" for e in self.claimed)
        return (
            f"run_jobs() stopped ({exc.__class__.__name__}: {exc}) after it claimed {jobs} and "
            "before it wrote their outcome: they are left running under worker "
            f"{self.worker_id!r}, until their lease expires and a sweeper takes them back"
        )

    def _loop(self, scheduler, inside):
        while True:
            if inside:
                store.apply_at_commit(self.using)  # what the runs' commits would have applied
            if scheduler is not None:
                scheduler.run_once(db=self.using)
            if self.types is not None:
                self.held += store.hold_other_types(
                    self.using, queues=self.queues, types=self.types
                )
            if len(self.runs) >= self.max_runs:
                due = store.count_due(self.using, self.queues, bound=1000)
                if due:
                    raise TooManyRuns(self._too_many(due))
                return
            units = self._claim()
            if not units:
                return
            for unit in units:
                self._run(unit)

    def _too_many(self, due):
        last = "; ".join(run.describe() for run in self.runs[-5:])
        return (
            f"run_jobs() ran {self.max_runs} jobs (max_runs) and {due}"
            f"{'+' if due >= 1000 else ''} are still due; the last runs: {last}. A job that "
            "enqueues itself again or snoozes for no time runs for ever: pass a larger "
            "max_runs= if that many runs are expected"
        )

    # -- the claim ---------------------------------------------------------------------------

    def _claim(self):
        """One claim (store.claim, the worker's statement) of one job; a batch type's job is
        topped up to its batch (the worker's top-up statement). Returns the units to run."""
        token = store.new_token()
        rows = store.claim(
            self.using,
            worker_id=self.worker_id,
            queues=self.queues,
            limits=[1] * len(self.queues),
            limit=1,
            token=token,
            flow=self.flow,
            threads=1,
            fair=self.fair,
            cursors=self.cursors,
        )
        if self.fair is not None and self.flow is None:
            next_cursors(self.cursors, rows)
        if not rows:
            return []
        entries = [self._entry(row, token) for row in rows]
        self.claimed = list(entries)
        job_type = registry.get(rows[0].type)
        if job_type is not None and job_type.batch_size and self.flow is None:
            more = self._top_up(rows[0], job_type.batch_size - 1, token)
            entries += [self._entry(row, token) for row in more]
            self.claimed = list(entries)
            return [entries]
        return [[entry] for entry in entries]

    def _top_up(self, row, limit, token):
        """As the worker's top-up (claiming._top_up): a fair queue's round-robin first, then
        the rest of the batch in claim order."""
        if limit <= 0:
            return []
        fair = self.fair is not None and self.fair[self.queues.index(row.queue)]
        cursor = self.cursors.get(row.queue, SHARED_FAIR_KEY) if fair else None
        rows = self._claim_more(row, limit, token, cursor)
        if fair:
            next_cursors(self.cursors, rows)
            if 0 < len(rows) < limit:
                rows = rows + self._claim_more(row, limit - len(rows), token, None)
        return rows

    def _claim_more(self, row, limit, token, cursor):
        statement = store.claim_more_statement(
            worker_id=self.worker_id,
            queue=row.queue,
            job_type=row.type,
            limit=limit,
            token=token,
            fair_cursor=cursor,
        )
        return store.claimed_rows(self.db.execute(*statement))

    def _entry(self, row, token):
        ctx = JobContext(row, worker_id=self.worker_id, using=self.using)
        ctx._renewed = time.monotonic()  # as claiming._entry: the lease is known held from now
        return Entry(ctx, token, timeout_of(registry.get(row.type)), keyed=row.keyed)

    # -- a run ---------------------------------------------------------------------------------

    def _run(self, entries):
        """Run one unit (a job, or a batch handler's jobs), then write each job's outcome."""
        job_type = registry.get(entries[0].ctx.type)
        batch = job_type is not None and bool(job_type.batch_size)
        for entry in entries:
            entry.started = time.monotonic()
            entry.ctx._token = entry.token
            Worker.started(self, entry)  # the job_started signal, as a handler thread sends it
        outcomes = []
        atomic = job_type is not None and job_type.atomic
        # An atomic handler that did not commit its completion rolled its own writes back.
        with self.calls.one(lambda: atomic and any(o.kind != "committed" for o in outcomes)):
            if batch:
                ctxs = [entry.ctx for entry in entries]
                outcomes = run_batch(job_type, ctxs, conf=self.conf, worker_id=self.worker_id)
            else:
                outcomes = [
                    run_handler(
                        entries[0].ctx,
                        entries[0].token,
                        conf=self.conf,
                        worker_id=self.worker_id,
                        loop=self.loop,
                    )
                ]
        for entry, outcome in zip(entries, outcomes, strict=True):
            outcome.duration = time.monotonic() - entry.started
            self._settle(entry, outcome)

    def _settle(self, entry, outcome):
        """Write the outcome as a worker's acknowledger does, and note what it came to."""
        before = {name: getattr(self.acks, name) for name in _COUNTERS}
        self.acks.settle(entry, outcome)
        self.acks.flush_once(self.db)
        self.claimed = [e for e in self.claimed if e is not entry]
        moved = [name for name in _COUNTERS if getattr(self.acks, name) != before[name]]
        kind = _COUNTERS[moved[0]] if moved else "fenced"
        if kind == "snoozed" and outcome.kind == "wait":
            kind = "waiting"
        ctx = entry.ctx
        self.runs.append(
            Run(
                id=ctx.id,
                type=ctx.type,
                name=ctx.name,
                queue=ctx.queue,
                attempt=ctx.attempt,
                outcome=kind,
                error=outcome.error,
                duration=outcome.duration,
            )
        )

    def _report(self):
        ids = sorted({run.id for run in self.runs if run.outcome == "done"})
        results = {}
        if ids:
            rows = store.find_jobs(self.using, states=["done", "cancelled"], ids=ids)
            results = {row[0]: QueuedJob.from_row(row).result for row in rows}
        runs = [
            run if run.outcome != "done" else replace(run, result=results.get(run.id))
            for run in self.runs
        ]
        rows = store.find_jobs(
            self.using, states=[*ENQUEUED, "running"], queues=self.queues, types=self.types
        )
        return Ran(runs, [QueuedJob.from_row(row) for row in rows])


def jobs_left_running(using=None):
    """The jobs that ``run_jobs()`` claimed and left ``running`` (:class:`QueuedJob`): an error
    stopped it between a claim and the write of the outcome. None normally."""
    jobs = [QueuedJob.from_row(row) for row in store.find_jobs(database(using), states=["running"])]
    return [job for job in jobs if (job.worker_id or "").startswith(WORKER_PREFIX)]
