"""The invariant soak's checker (benchmarks/soak.py runs it every few seconds and at the end).

Everything it reads was written by the database or by the handlers, with ``clock_timestamp()``
(benchmarks/soakapp): runs (``soak_run``), every state change of every job
(``soak_transition``, by a trigger, in the changing transaction), snapshots with their clock
(``soak_witness``), guarded effects (``soak_effect``); plus what the soak itself knows: when
each process died, and which faults it injected into which worker, when.

**When a run ends.** At its recorded end; a run with no end is still running until its process
or its thread is known dead, so a hung handler still running counts, as the issue asks. The
soak watches every such run's process (a pidfd) and thread (``/proc/<pid>/task/<tid>``, gone
too when the worker replaces its image in place) and takes as the death the last moment it was
known alive (benchmarks/soak.py, ``DeathWatch``): a run is never counted past its death, at the
price of missing an overlap shorter than the watch's turn (10 to 50 ms).

**Runs whose lease was taken over.** When the sweeper takes a job back from a run whose lease
expired (a ``LeaseExpired`` entry written over that run's lease token), the run stops counting
for limits and serial keys at that moment *if the soak made its worker unable to heartbeat in
the lease before it*: it SIGSTOPped the worker's process group (past the lease, then SIGCONT),
terminated its database sessions, or killed it. The reason: a stopped process cannot be told
from a dead one, and docs/concepts.md ("Concurrency limits", "At-least-once delivery") chooses
to give a silent worker's slot back at lease expiry plus one sweep, so that a crashed worker
does not hold a limit or a key forever; such a zombie resumes after SIGCONT and runs beside the
job's next run, which is the documented price. These overlaps are counted and printed as
``zombie`` runs, not violations. A lease taken over from a worker the soak did *not* fault
(alive, not stopped, connected) is itself a violation (``lease-lost``): nothing excuses it, and
its run keeps counting until it really ends.

**The order check reads commits, not statement times.** A transition is known
committed before an instant T when a witness snapshot taken before T sees its transaction
(``pg_visible_in_snapshot``). A claim of job B (its ``pending -> running`` transition) sees what
committed before its transaction began (``xact_at``, its ``now()``) and does not see a change
whose statement ran after the claim's own (``at``). A check flags only what it can prove with
these two facts; a case it cannot decide is not flagged (a possible miss, never a false alarm).

The invariants:

- ``limit``: no concurrency limit (queue ``limited``: 2; type ``soak-typed``: 2) ever had more
  than N runs overlapping;
- ``rate``: no window of a rate limit's period held more than its limit of starts (the claims'
  ``started_at``, per partition key);
- ``serial-overlap``: two runs of one serial key never overlap (two runs of the same job too:
  a run given up at its timeout that still runs beside the retry);
- ``serial-order``: a job of a key is never claimed while an older job of its key (smaller id:
  docs' enqueue order) was pending, committed before the claim began and still pending after
  its statement: among jobs of a key pending at the same time, the oldest starts first;
- ``workflow``: a job is claimed only once each dependency has reached what its edge requires:
  ``done``, or also ``dead``/``cancelled`` for ``on_failure="run"`` (reached once is enough; a
  flag needs no such change to have run before the claim's statement); jobs that an operator
  requeued themselves (from dead or cancelled) are exempt: docs/workflows.md makes that the
  operator's choice;
- ``stuck-waiting``: a waiting job whose dependencies are all finished, or whose ``waiting_on``
  differs from the count of dependencies that still hold it back, seen twice at least 3 s apart;
- ``left``: at the end, after the drain, a job not done, dead or cancelled;
- ``effect``: a guarded effect that happened more than once;
- ``deadlock``: a worker's log (or an operator's error) saying ``deadlock detected``;
- ``lease-lost``: see above; a lease taken over within a stall of the whole soak (the witness
  wrote nothing for ``STALL_GAP`` or more) or just after it is a zombie too: every worker missed
  its heartbeats alike, as if the soak had stopped them all;
- ``harness``: a run the soak could not record (its recording statement failed): the soak's own
  failure, reported so that it never passes for a clean run;
- the durable steps of ``soak-steps`` (``ctx.step``; each body writes a ``start`` row and, as
  its last act, an ``end`` row, with its run and ``now()``, in ``soak_step_body``), see
  :func:`step_violations`:

  - ``step-after-record``: a step's body started after the step was recorded (its ``start``
    later than the record's ``finished_at``, the ``now()`` of the record's own autocommit
    INSERT). Always a violation: whoever ran it, zombie or not, the step ran again after it
    was recorded, which docs/steps.md says never happens. (A run reads its job's records at
    its first step, and again, fenced by its lease, before any later step once its lease was
    not renewed for half a lease: a zombie the soak stopped past its lease is told it lost the
    job, rather than run a step the job's next run recorded.);
  - ``step-unrecorded``: a body that finished (its ``end`` row) in a run other than the one
    whose record the job kept, with nothing to excuse it. A body may finish without its record
    committing, and so run again, only when its run died (a process or thread known dead and
    no recorded end: the kill came between the body's end and the record's commit), when its
    run lost its lease to a fault the soak injected (a zombie: its record is fenced out), when
    the soak terminated its worker's sessions during the run (the record's INSERT lost its
    connection), when the soak sent its worker SIGTERM during the run (past the grace the job
    was handed back unspent and claimed again: the record is fenced out), or when the record the job kept was written by such a zombie (the job's next
    run found the step recorded already, after running it). Nothing else;
  - ``step-records``: a ``done`` job whose recorded steps are not exactly the handler's
    (``STEP_KEYS``: each name and occurrence once), or a record whose run wrote no ``end``.
- the durable waits and signals of ``soak-waits`` (each ``ctx.sleep``, ``ctx.wait_for_signal``
  and snooze of its handler writes a row in ``soak_wait`` once it returned or raised: its run,
  the wait's occurrence, the payload it returned or ``timeout`` or ``suspend``, the database's
  clock before the call, ``began``, and after it, ``at``; the producer inserts a row in
  ``soak_signal`` in each ``signal_job`` transaction: the job, its unique payload, the ``seq``
  that ``signal_job`` returned, and ``committed_by``, the clock read after its commit
  returned), see :func:`wait_violations`. A signal is *known committed* before the least of its
  ``committed_by`` and the ``at`` of every call that returned it (a wait reads only what has
  committed). A wait's read of the signals happens after its ``began`` and, when it times out,
  at or after its deadline (the wait's record in ``dbqueue_step``: a run uses the recorded
  deadline, or its own when it wrote the record, which is never earlier than one another run
  wrote first, since fencing refuses a run's record once its job was claimed again); a read sees
  everything committed before it, whichever run makes it, zombies included:

  - ``signal-order``: a wait returned a payload other than its job's n-th signal (n its
    occurrence: docs/steps.md, "the n-th wait of a name takes the n-th signal"), or one the soak
    never sent, or not a number at all. No excuse: signals are numbered in their job's row lock
    and never change;
  - ``signal-twice``: one signal's payload returned by two different waits (two jobs, or two
    occurrences of one job's wait). The same wait replayed returns it again: that is allowed;
  - ``signal-timeout``: a wait reported ``timeout`` although the job's n-th signal was known
    committed before the wait's read (before its ``began``, or before its deadline). A wait that
    timed out and returns the signal when replayed later (the signal came after the deadline)
    is allowed: that is what the code does, and what the facts cannot tell from a late signal;
  - ``sleep-early``: a sleep returned before the end its record holds (its ``at`` earlier than
    the record's ``until``), or with no record at all;
  - ``signal-unheard``: in one snapshot, a ``soak-waits`` job suspended on its wait for ``go``
    (pending, ``wait_reason`` ``signal:go``, ``wait_token`` its lease token), due more than
    ``UNHEARD_SLACK`` later, while the signal of its latest recorded wait (hence of every
    earlier one) is committed: whichever of the signal and the wait's write committed first,
    the job must be due at once (docs/steps.md, "a signal is never lost");
  - after the drain, a ``soak-waits`` job still pending (in a wait) is a ``left`` violation,
    as every other job: each wait has a timeout.
- publish and subscribe (``publish-jobs``, ``publish-repeat``, ``publish-done-twice``): a
  published event has exactly one job per subscriber it names, a repeated publish of a key made
  no new event or job, and no subscriber's job succeeded twice; see benchmarks/soak_publish.py.
- batch handlers (``batch-mate``, ``batch-outcome``, ``batch-done-twice``): each ``soak-batch``
  job settles by its own payload's failure plan and attempt, never a batch mate's, and its
  success is written once; see benchmarks/soak_batch.py.
- fair queues (``fair-starve``): fairness never starves a key: while a key of the fair queue
  waits for its turn, no other key gets jobs in more than 2 of the claims made meanwhile; see
  benchmarks/soak_fair.py.
"""

from __future__ import annotations

import collections
import datetime
import re
from dataclasses import dataclass, field

from benchmarks import soak_batch, soak_fair, soak_hostile, soak_publish

UTC = datetime.UTC
LIMITS = {"queue limited": ("queue", "limited", 2), "type soak-typed": ("type", "soak-typed", 2)}
RATES = {
    "queue rated": ("queue", "rated", 4, 1.0, "acct"),
    "type soak-typed": ("type", "soak-typed", 6, 1.0, "acct"),
}
PERSIST = datetime.timedelta(seconds=3)
EXCUSES = {"stop", "terminate", "kill"}  # faults that keep a live worker from heartbeating

# The steps of a soak-steps job, in the order its handler calls them: (name, occurrence). The
# same name twice makes two steps, as ctx.step numbers them (benchmarks/soakapp/jobs.py).
STEP_TYPE = "soak-steps"
STEP_KEYS = (("reserve", 1), ("item", 1), ("item", 2))
# A terminate fault excuses a run's unrecorded step when it came within the run, give or take
# this much (the soak's clock against the database's, and the call's own time).
TERMINATE_SLACK = datetime.timedelta(seconds=1)

# Each run with its claim's lease token and the moment the sweeper took that lease back. The
# claim is the job's last claim of the run's attempt before the run started: the token the
# handler read from the row at its start is the row's, which is another claim's when the run
# started after its own lease was taken over (a worker continued after SIGSTOP starts a job it
# claimed before the stop, not knowing yet that it lost it).
RUNS = """
SELECT r.id, r.job_id, r.attempt, r.type, r.queue, r.serial_key, c.token, r.worker,
       r.mode, r.pid, r.proc_start, r.tid, r.thread_start, r.started_at, r.ended_at,
       (SELECT min(t.at) FROM soak_transition AS t
        WHERE t.job_id = r.job_id AND t.old_state = 'running' AND t.old_token = c.token
          AND t.cause = 'LeaseExpired' AND t.at >= c.at) AS taken_at
FROM soak_run AS r
LEFT JOIN LATERAL (
    SELECT t.new_token AS token, t.at FROM soak_transition AS t
    WHERE t.job_id = r.job_id AND t.new_state = 'running' AND t.attempts = r.attempt
      AND t.at <= r.started_at
    ORDER BY t.id DESC LIMIT 1
) AS c ON true
ORDER BY r.id
"""

STARTS = """
SELECT t.job_id, t.started_at, j.queue, j.type, j.payload ->> 'acct'
FROM soak_transition AS t JOIN dbqueue_job AS j ON j.id = t.job_id
WHERE t.new_state = 'running' AND t.started_at IS NOT NULL
"""

# A job claimed while an older job of its key was pending (committed before the claim's
# transaction began, by a witness; still pending after the claim's statement).
SERIAL_ORDER = """
WITH tr AS (
    SELECT t.*, lead(t.at) OVER (PARTITION BY t.job_id ORDER BY t.id) AS next_at
    FROM soak_transition AS t
    WHERE t.job_id IN (SELECT id FROM dbqueue_job WHERE serial_key IS NOT NULL)
)
SELECT c.job_id, o.id, j.serial_key, c.at
FROM tr AS c
JOIN dbqueue_job AS j ON j.id = c.job_id
JOIN dbqueue_job AS o ON o.serial_key = j.serial_key AND o.id < j.id
JOIN tr AS p ON p.job_id = o.id AND p.new_state = 'pending'
WHERE c.old_state = 'pending' AND c.new_state = 'running'
  AND p.at < c.xact_at AND (p.next_at IS NULL OR p.next_at > c.at)
  AND (SELECT pg_visible_in_snapshot(p.xid, w.snap) FROM soak_witness AS w
       WHERE w.at < c.xact_at ORDER BY w.at DESC LIMIT 1)
ORDER BY c.at
"""

# A dependent claimed although a dependency had never reached what its edge requires: no
# change of the dependency into done (or dead or cancelled, for on_failure="run") ran before
# the claim's statement, so none can have been visible to it. (Reached once is enough: a
# released dependent whose dead dependency an operator requeues later may still run.)
WORKFLOW = """
WITH claims AS (
    SELECT c.id, c.job_id, c.at FROM soak_transition AS c
    WHERE c.old_state = 'pending' AND c.new_state = 'running'
      AND EXISTS (SELECT 1 FROM dbqueue_dependency AS d WHERE d.job_id = c.job_id)
      AND NOT EXISTS (
          SELECT 1 FROM soak_transition AS r
          WHERE r.job_id = c.job_id AND r.id < c.id AND r.new_state = 'pending'
            AND r.old_state IN ('dead', 'cancelled'))
)
SELECT c.job_id, d.depends_on_id, d.run_on_failure,
       (SELECT s.new_state FROM soak_transition AS s
        WHERE s.job_id = d.depends_on_id AND s.at < c.at ORDER BY s.id DESC LIMIT 1),
       c.at
FROM claims AS c
JOIN dbqueue_dependency AS d ON d.job_id = c.job_id
WHERE NOT EXISTS (
    SELECT 1 FROM soak_transition AS s
    WHERE s.job_id = d.depends_on_id AND s.at < c.at
      AND (s.new_state = 'done'
           OR (d.run_on_failure AND s.new_state IN ('dead', 'cancelled'))))
ORDER BY c.at
"""

# Waiting jobs with what should hold them back: dependencies not finished, and those of them
# that count (not done; for on_failure="run", not dead or cancelled either).
WAITING = """
SELECT j.id, j.waiting_on,
       count(*) FILTER (WHERE x.state NOT IN ('done', 'dead', 'cancelled')) AS unfinished,
       count(*) FILTER (WHERE x.state <> 'done'
                        AND NOT (d.run_on_failure AND x.state IN ('dead', 'cancelled')))
           AS holding
FROM dbqueue_job AS j
JOIN dbqueue_dependency AS d ON d.job_id = j.id
JOIN dbqueue_job AS x ON x.id = d.depends_on_id
WHERE j.state = 'waiting'
GROUP BY j.id, j.waiting_on
"""

RUN_FIELDS = (
    "id", "job", "attempt", "type", "queue", "serial_key", "token", "worker", "mode", "pid",
    "proc_start", "tid", "thread_start", "started", "ended", "taken",
)  # fmt: skip

EFFECTS = "SELECT key, n, job_id FROM soak_effect WHERE n > 1 ORDER BY key"

# Runs the soak could not record (a handler's recording statement failed): the soak's own
# failure, which would otherwise pass for ordinary job failures and hide every run it missed.
UNRECORDED = """
SELECT j.id, e ->> 'class', left(e ->> 'message', 200)
FROM dbqueue_job AS j, jsonb_array_elements(j.errors) AS e
WHERE e ->> 'traceback' LIKE '%%in _record%%'
ORDER BY j.id LIMIT 20
"""
# Durable steps. Read in this order: the records, then the done jobs with theirs (one
# snapshot), then the bodies. A body's end row commits before its record, so every record read
# finds its run's end row; and the runs (read first of all, RUNS) that had ended had committed
# their records and rows before.
STEP_RECORDS = """
SELECT s.job_id, s.name, s.occurrence, s.attempt, s.finished_at, (s.result ->> 'run')::bigint
FROM dbqueue_step AS s JOIN dbqueue_job AS j ON j.id = s.job_id
WHERE j.type = %s
"""
STEP_DONE = """
SELECT j.id, array_agg(ARRAY[s.name, s.occurrence::text] ORDER BY s.id)
                 FILTER (WHERE s.id IS NOT NULL)
FROM dbqueue_job AS j LEFT JOIN dbqueue_step AS s ON s.job_id = j.id
WHERE j.type = %s AND j.state = 'done'
GROUP BY j.id
"""
STEP_BODIES = """
SELECT id, job_id, run_id, name, occurrence, attempt, phase, at FROM soak_step_body ORDER BY id
"""

# Durable waits and signals (soak-waits). Read in this order: the calls, then the signals, then
# the waits' records: a call that returned a signal read it committed, with its soak_signal row
# (one transaction); a call that timed out or slept read its record, committed before it.
WAIT_TYPE = "soak-waits"
WAIT_CALLS = """
SELECT id, job_id, run_id, attempt, kind, name, occurrence, outcome, value, began_at, at
FROM soak_wait ORDER BY id
"""
WAIT_SIGNALS = "SELECT job_id, name, value, seq, held, sent_at, committed_by FROM soak_signal"
WAIT_RECORDS = """
SELECT s.job_id, s.name, s.occurrence, s.result
FROM dbqueue_step AS s JOIN dbqueue_job AS j ON j.id = s.job_id
WHERE j.type = %s AND (s.name LIKE 'sleep:%%' OR s.name LIKE 'signal:%%')
"""
WAIT_DONE = "SELECT count(*) FROM dbqueue_job WHERE type = %s AND state = 'done'"
# A job suspended on its wait for "go", due later than the checker's now (plus the slack), while
# the signal of its latest recorded wait is committed: one statement, one snapshot.
UNHEARD_SLACK = datetime.timedelta(seconds=0.5)
WAIT_UNHEARD = """
SELECT j.id, w.n, s.created_at, j.run_after, now()
FROM dbqueue_job AS j
JOIN LATERAL (SELECT max(st.occurrence) AS n FROM dbqueue_step AS st
              WHERE st.job_id = j.id AND st.name = 'signal:go') AS w ON true
JOIN dbqueue_signal AS s ON s.job_id = j.id AND s.name = 'go' AND s.seq = w.n
WHERE j.type = %s AND j.state = 'pending' AND j.wait_reason = 'signal:go'
  AND j.wait_token = j.lease_token AND j.run_after > now() + %s
ORDER BY j.id
"""

LEFT = """
SELECT state, count(*), (array_agg(id ORDER BY id))[1:10] FROM dbqueue_job
WHERE state NOT IN ('done', 'dead', 'cancelled') GROUP BY state ORDER BY state
"""
DEADLOCK = re.compile(r"deadlock detected")


# The whole machine (or the database) stalled: the witness, which writes a snapshot every 20 ms,
# wrote nothing for STALL_GAP or more. Every worker missed its heartbeats alike, so a sweep that
# ran right after (within STALL_AFTER) could find a live worker's registry row stale
# (presence.STALE_FLOOR: 5 s) and take its lease, as after a SIGSTOP of the whole fleet: such a
# run is a zombie, not a lease-lost violation. (Seen on a 2-core machine shared with other test
# suites: a 6.5 s gap, and a sweep 15 ms after it.)
STALL_GAP = datetime.timedelta(seconds=2.0)
STALL_AFTER = datetime.timedelta(seconds=2.0)
STALLS = """
SELECT at - gap, at FROM (
    SELECT at, at - lag(at) OVER (ORDER BY at) AS gap FROM soak_witness
) AS w
WHERE gap >= %s
ORDER BY at
"""


def stalled(stalls, taken_at):
    """Whether ``taken_at`` falls in a stall of ``stalls`` ([(from, until)]) or within
    ``STALL_AFTER`` after its end."""
    return any(begin <= taken_at <= end + STALL_AFTER for begin, end in stalls)


@dataclass
class Facts:
    """What the soak knows that the database does not: deaths and faults, in database time."""

    deaths: dict = field(default_factory=dict)  # (pid, proc_start) -> last known alive
    thread_deaths: dict = field(default_factory=dict)  # (pid, tid, start) -> last known alive
    worker_deaths: dict = field(default_factory=dict)  # worker tag -> reaped at (for the report)
    faults: list = field(default_factory=list)  # (kind, worker tag, from, until)
    holds: list = field(default_factory=list)  # ("hold", [dependency ids], from, until)
    errors: list = field(default_factory=list)  # operator/producer errors (text)
    publishes: list = field(default_factory=list)  # (key, event, created, [jobs]): soak_publish
    # The hostile actor's (benchmarks/soak_hostile.py): door calls, poisoned jobs, grips.
    door_calls: list = field(default_factory=list)  # [soak_hostile.DoorCall]
    poisoned: dict = field(default_factory=dict)  # job id -> soak_hostile.Poisoned
    retyped: dict = field(default_factory=dict)  # job id -> soak_hostile.Poisoned (its type)
    grips: list = field(default_factory=list)  # ("grip", target, [ids], from, until)
    worker_exits: list = field(default_factory=list)  # (tag, code, at): not the soak's own end
    worker_pids: dict = field(default_factory=dict)  # pid -> [slot tags it served]
    lease: float = 5.0
    sweep: float = 0.25


@dataclass(frozen=True)
class StepRun:
    """What the step invariants need of a handler run (``Checker._runs`` works it out)."""

    worker: str
    started: datetime.datetime
    ended: datetime.datetime | None  # its recorded end (None: still running, or it died)
    dead: bool = False  # its process or thread is known dead
    zombie: bool = False  # its lease was taken over while the soak kept its worker silent


@dataclass(frozen=True)
class StepRecord:
    job: int
    name: str
    occurrence: int
    attempt: int
    finished_at: datetime.datetime
    run: int | None  # the run whose body returned the recorded result (the result's "run")


@dataclass(frozen=True)
class StepBody:
    id: int
    job: int
    run: int
    name: str
    occurrence: int
    attempt: int
    phase: str  # "start" or "end"
    at: datetime.datetime


@dataclass
class StepStats:
    jobs_done: int = 0
    started: int = 0
    finished: int = 0
    recorded: int = 0
    again: collections.Counter = field(default_factory=collections.Counter)  # excuse -> bodies


def _terminated(run, faults):
    begin, end = run.started - TERMINATE_SLACK, run.ended and run.ended + TERMINATE_SLACK
    return any(
        kind == "terminate" and tag == run.worker and at >= begin and (end is None or at <= end)
        for kind, tag, at, _until in faults
    )


def _sigtermed(run, faults):
    """The soak sent the run's worker SIGTERM while the run went on: past the grace, a graceful
    stop hands a running job back unspent (docs/concepts/shutdown.md), and the run's later
    record is fenced out."""
    begin, end = run.started - TERMINATE_SLACK, run.ended
    return any(
        kind == "sigterm" and tag == run.worker and at >= begin and (end is None or at <= end)
        for kind, tag, at, _until in faults
    )


def _step_excuse(run, recorder, faults):
    """Why a body that finished in ``run`` may have gone unrecorded (None: nothing excuses it).
    ``recorder`` is the run whose record the job kept, if any."""
    if run.zombie:
        return "zombie"
    if run.dead and run.ended is None:
        return "died"
    if _terminated(run, faults):
        return "terminated"
    if _sigtermed(run, faults):
        return "stopped by SIGTERM"
    if recorder is not None and recorder.zombie:
        return "recorded by a zombie"
    return None


def step_violations(records, bodies, runs, faults, done, stats=None):
    """The step invariants over what was read: ``records`` (:class:`StepRecord`), ``bodies``
    (:class:`StepBody`), ``runs`` ({run id: :class:`StepRun`}, the runs known when the records
    were read), ``faults`` (``Facts.faults``), ``done`` ([(job id, [(name, occurrence)])] of
    the done jobs with their records, read in one snapshot). Returns ``[(kind, key, text)]``;
    counts into ``stats`` (a :class:`StepStats`) if given."""
    stats = stats if stats is not None else StepStats()
    out = []
    kept = {(r.job, r.name, r.occurrence): r for r in records}
    ends = collections.defaultdict(list)
    for body in bodies:
        key = (body.job, body.name, body.occurrence)
        record = kept.get(key)
        if body.phase == "start":
            stats.started += 1
            if record is not None and body.at > record.finished_at:
                run = runs.get(body.run)
                who = f"worker {run.worker}" if run else "a run not known yet"
                out.append((
                    "step-after-record",
                    (*key, body.run),
                    f"job {body.job} step {body.name} #{body.occurrence} ran again after it was "
                    f"recorded: its body started at {body.at:%H:%M:%S.%f} in run {body.run} "
                    f"(attempt {body.attempt}, {who}{', a zombie' if run and run.zombie else ''}),"
                    f" after the record of run {record.run} (attempt {record.attempt}) at "
                    f"{record.finished_at:%H:%M:%S.%f}",
                ))  # fmt: skip
        else:
            stats.finished += 1
            ends[key].append(body)
    stats.recorded += len(records)
    for key, record in kept.items():
        if record.run not in {b.run for b in ends.get(key, ())}:
            out.append((
                "step-records",
                key,
                f"job {key[0]} step {key[1]} #{key[2]} is recorded as finished by run "
                f"{record.run} (attempt {record.attempt}), whose body wrote no end",
            ))  # fmt: skip
    for key, finished in ends.items():
        record = kept.get(key)
        recorder = runs.get(record.run) if record is not None else None
        for body in finished:
            if record is not None and body.run == record.run:
                continue  # the body whose result the job kept
            run = runs.get(body.run)
            if run is None or (run.ended is None and not run.dead and not run.zombie):
                continue  # still running: its record may be on its way
            excuse = _step_excuse(run, recorder, faults)
            if excuse is not None:
                stats.again[excuse] += 1
                continue
            others = [b.run for b in finished if b.run != body.run]
            out.append((
                "step-unrecorded",
                (*key, body.run),
                f"job {key[0]} step {key[1]} #{key[2]}: its body finished at "
                f"{body.at:%H:%M:%S.%f} in run {body.run} (attempt {body.attempt}, worker "
                f"{run.worker}), which went on, but the step was not recorded by it "
                + (f"(the record is run {record.run}'s)" if record else "(no record)")
                + (f"; it finished in runs {others} too" if others else "")
                + ": its run neither died, nor lost its lease to a fault, nor had its sessions "
                "terminated",
            ))  # fmt: skip
    want = sorted(STEP_KEYS)
    for job_id, keys in done:
        stats.jobs_done += 1
        got = sorted((name, int(n)) for name, n in keys or ())
        if got != want:
            out.append((
                "step-records",
                (job_id,),
                f"job {job_id} is done with the steps {got} recorded; its handler runs {want}, "
                "each recorded once",
            ))  # fmt: skip
    return out


@dataclass(frozen=True)
class WaitCall:
    """A ``soak_wait`` row: one call of a wait in a soak-waits handler, and what came of it."""

    id: int
    job: int
    run: int | None
    attempt: int
    kind: str  # "sleep", "signal" or "snooze"
    name: str
    occurrence: int
    outcome: str  # "slept", "signal", "timeout", "suspend", "snooze", "raised <class>"
    value: int | None  # the payload a wait for a signal returned
    began: datetime.datetime  # the database's clock before the call
    at: datetime.datetime  # and after it returned or raised


@dataclass(frozen=True)
class SignalSent:
    """A ``soak_signal`` row: one ``signal_job`` call of the producer, committed."""

    job: int
    name: str
    value: int  # the payload: unique in the soak
    seq: int | None  # what signal_job returned: its number among the job's signals of the name
    held: float  # seconds the transaction was kept open after the call
    sent: datetime.datetime
    committed_by: datetime.datetime | None  # the clock read after its commit returned


@dataclass
class WaitStats:
    jobs_done: int = 0
    waits: collections.Counter = field(default_factory=collections.Counter)  # outcome -> calls
    first_reach: int = 0  # waits that returned their signal at once: it was sent before them
    after_suspend: int = 0  # waits that returned their signal after the run ended at them
    sleeps: collections.Counter = field(default_factory=collections.Counter)  # outcome -> calls
    snoozes: int = 0
    signals: int = 0  # committed and stored
    refused: int = 0  # signal_job returned None: the job had finished (or was cancelled)
    held: int = 0  # stored, in a transaction kept open after the call


def _records_by_key(records):
    """``{(job, name, occurrence): result dict}`` from ``[(job, name, occurrence, result)]``."""
    return {(job, name, n): result or {} for job, name, n, result in records}


def _when(text):
    return None if text is None else datetime.datetime.fromisoformat(text)


def wait_violations(calls, signals, records, runs, stats=None):
    """The wait invariants over what was read: ``calls`` (:class:`WaitCall`), ``signals``
    (:class:`SignalSent`), ``records`` ([(job, name, occurrence, result dict)] of the soak-waits
    jobs' wait records in ``dbqueue_step``: ``sleep:<name>`` with ``until``, ``signal:<name>``
    with ``deadline``), ``runs`` ({run id: :class:`StepRun`}, for the messages). Returns
    ``[(kind, key, text)]``; counts into ``stats`` (a :class:`WaitStats`) if given."""
    stats = stats if stats is not None else WaitStats()
    out = []
    recorded = _records_by_key(records)
    by_value = {s.value: s for s in signals}
    by_seq = {(s.job, s.name, s.seq): s for s in signals if s.seq is not None}
    stats.signals = len(by_seq)
    stats.refused = sum(1 for s in signals if s.seq is None)
    stats.held = sum(1 for s in signals if s.seq is not None and s.held > 0)
    # When each signal is known committed: after its commit returned, or when a wait returned it.
    known = {s.value: s.committed_by for s in signals}
    for call in calls:
        if call.kind == "signal" and call.outcome == "signal" and call.value is not None:
            before = known.get(call.value)
            known[call.value] = call.at if before is None else min(before, call.at)

    def who(call):
        run = runs.get(call.run)
        where = f"worker {run.worker}{', a zombie' if run.zombie else ''}" if run else "?"
        return f"run {call.run} (attempt {call.attempt}, {where})"

    owners = collections.defaultdict(dict)  # value -> {(job, name, occurrence): first call}
    suspended = set()  # (job, name, occurrence) of waits at which a run ended
    for call in calls:
        wait = (call.job, call.name, call.occurrence)
        if call.kind == "snooze":
            stats.snoozes += call.outcome == "snooze"
            continue
        if call.kind == "sleep":
            stats.sleeps[call.outcome] += 1
            if call.outcome != "slept":
                continue
            until = _when(
                recorded.get((call.job, f"sleep:{call.name}", call.occurrence), {}).get("until")
            )
            if until is None or call.at < until:
                out.append((
                    "sleep-early",
                    (call.job, call.name, call.occurrence, call.run),
                    f"job {call.job} sleep {call.name!r} #{call.occurrence} returned at "
                    f"{call.at:%H:%M:%S.%f} in {who(call)}, "
                    + ("with no record of the sleep" if until is None
                       else f"before its recorded end {until:%H:%M:%S.%f}"),
                ))  # fmt: skip
            continue
        stats.waits[call.outcome] += 1
        if call.outcome == "suspend":
            suspended.add(wait)
        elif call.outcome == "signal":
            if wait in suspended:
                stats.after_suspend += 1
            else:
                stats.first_reach += 1
            sent = by_value.get(call.value)
            if (
                sent is None
                or sent.job != call.job
                or sent.name != call.name
                or sent.seq != call.occurrence
            ):
                n_th = by_seq.get(wait)
                if call.value is None:
                    what = "a payload that is not a number the soak sent"
                elif sent is None:
                    what = (
                        f"the payload {call.value}, which the soak never sent (or never committed)"
                    )
                else:
                    what = f"the payload {call.value}: signal #{sent.seq} {sent.name!r} of job {sent.job}"
                mine = f"payload {n_th.value}" if n_th else "not sent (yet)"
                out.append((
                    "signal-order",
                    (*wait, call.value),
                    f"job {call.job} wait {call.name!r} #{call.occurrence} returned {what}, at "
                    f"{call.at:%H:%M:%S.%f} in {who(call)}; its own signal #{call.occurrence} is "
                    f"{mine}",
                ))  # fmt: skip
            if call.value is not None:
                owners[call.value].setdefault(wait, call)
        elif call.outcome == "timeout":
            sent = by_seq.get(wait)
            if sent is None:
                continue  # its signal was never sent: the timeout is right
            bound = known.get(sent.value)
            deadline = _when(
                recorded.get((call.job, f"signal:{call.name}", call.occurrence), {}).get("deadline")
            )
            read = call.began if deadline is None else max(call.began, deadline)
            if bound is not None and bound < read:
                out.append((
                    "signal-timeout",
                    (*wait, call.run),
                    f"job {call.job} wait {call.name!r} #{call.occurrence} timed out in "
                    f"{who(call)} (called at {call.began:%H:%M:%S.%f}"
                    + (f", deadline {deadline:%H:%M:%S.%f}" if deadline else "")
                    + f"), although its signal #{sent.seq} (payload {sent.value}) was committed "
                    f"by {bound:%H:%M:%S.%f}, before the wait read the signals",
                ))  # fmt: skip
    for value, waits in owners.items():
        if len(waits) > 1:
            shown = ", ".join(
                f"job {job} wait {name!r} #{n} ({who(call)})"
                for (job, name, n), call in sorted(waits.items())
            )
            out.append((
                "signal-twice",
                (value,),
                f"the signal with payload {value} was returned by {len(waits)} waits: {shown}",
            ))  # fmt: skip
    return out


def unheard_violations(rows):
    """``signal-unheard`` from :data:`WAIT_UNHEARD`'s rows (job, wait occurrence, the signal's
    ``created_at``, the job's ``run_after``, the checker's ``now()``)."""
    out = []
    for job, n, created, due, now in rows:
        out.append((
            "signal-unheard",
            (job, n),
            f"job {job} waits for its signal 'go' #{n} until {due:%H:%M:%S.%f} (seen at "
            f"{now:%H:%M:%S.%f}), although that signal was stored at {created:%H:%M:%S.%f} "
            "and committed: it should be due at once",
        ))  # fmt: skip
    return out


@dataclass
class Violation:
    kind: str
    key: tuple
    text: str


class Checker:
    def __init__(self, conn, facts, log_paths):
        self.conn = conn
        self.facts = facts
        self.log_paths = log_paths
        self.found = {}  # (kind, key) -> Violation, in the order found
        self.zombies = set()
        self.step_runs = {}  # run id -> StepRun, from the last pass over the runs
        self.step_stats = StepStats()
        self.wait_stats = WaitStats()
        self.publish_stats = soak_publish.PublishStats()
        self.batch_stats = soak_batch.BatchStats()
        self.fair_stats = soak_fair.FairStats()
        self.hostile_stats = soak_hostile.HostileStats()
        self.unseen_deaths = 0
        self.stalls = []  # [(from, until)]: the whole soak stalled (witness gaps)
        self.stall_excused = 0  # leases taken over right after a stall, counted as zombies
        self._waiting_seen = {}  # (job, waiting_on, holding, unfinished==0) -> first seen

    # -- the whole pass ------------------------------------------------------------------------

    def check(self, *, final=False):
        """Run every check over everything recorded so far; returns the new violations."""
        before = len(self.found)
        now = self.conn.execute("SELECT clock_timestamp()").fetchone()[0]
        runs = self._runs(now)
        self._limits(runs)
        self._serial_overlap(runs)
        self._rates()
        self._serial_order()
        self._workflow()
        self._waiting(now)
        self._effects()
        self._steps()
        self._waits()
        self._publish()
        self._batches()
        self._fair()
        self._hostile(final)
        self._unrecorded()
        self._deadlocks()
        if final:
            self._left()
        return list(self.found.values())[before:]

    def _add(self, kind, key, text):
        if (kind, key) not in self.found:
            self.found[(kind, key)] = Violation(kind, key, text)

    def counts(self):
        return collections.Counter(v.kind for v in self.found.values())

    # -- runs and their ends ---------------------------------------------------------------------

    def _excused(self, worker, taken_at):
        if stalled(self.stalls, taken_at):
            self.stall_excused += 1
            return True
        window = datetime.timedelta(seconds=self.facts.lease + 4 * self.facts.sweep + 1.0)
        for kind, tag, start, until in self.facts.faults:
            if kind not in EXCUSES or tag != worker or start > taken_at:
                continue
            if until is None or until >= taken_at - window:  # a stop still going on: None
                return True
        return False

    def _runs(self, now):
        """``[(run, begin, end)]``: each run's interval as the invariants count it."""
        out = []
        self.zombies = set()
        self.stalls = self.conn.execute(STALLS, [STALL_GAP]).fetchall()
        self.stall_excused = 0
        step_runs = {}
        for row in self.conn.execute(RUNS).fetchall():
            run = dict(zip(RUN_FIELDS, row, strict=True))
            end = run["ended"]
            process = (run["pid"], run["proc_start"])
            died = self.facts.deaths.get(process)  # the last moment known alive
            if died is None and process in self.facts.deaths:
                # Its process was gone before the soak looked: known dead, but not since when.
                # Ended at its start, so it hides a violation rather than invent one.
                died = run["started"]
            thread = (run["pid"], run["tid"], run["thread_start"])
            if thread in self.facts.thread_deaths:  # its thread ended (or its image was replaced)
                thread_died = self.facts.thread_deaths[thread]
                died = thread_died if died is None else min(died, thread_died)
            if end is None and died is not None:
                end = max(died, run["started"])
            taken = run["taken"]
            if taken is not None and (died is None or died > taken):
                if self._excused(run["worker"], taken):
                    if end is None or end > taken:
                        self.zombies.add(run["id"])
                        end = max(taken, run["started"])  # started after it: never counted
                else:
                    self._add(
                        "lease-lost",
                        (run["id"],),
                        f"job {run['job']} (run {run['id']}, worker {run['worker']} pid "
                        f"{run['pid']}) lost its lease at {taken:%H:%M:%S.%f} while its worker "
                        f"was neither stopped, disconnected nor killed by the soak"
                        + self._holds_before(taken),
                    )
            step_runs[run["id"]] = StepRun(
                worker=run["worker"],
                started=run["started"],
                ended=run["ended"],
                dead=process in self.facts.deaths or thread in self.facts.thread_deaths,
                zombie=run["id"] in self.zombies,
            )
            out.append((run, run["started"], end or now))
        self.step_runs = step_runs
        return out

    def _holds_before(self, taken):
        """The producer's open transactions on workflows depending on running jobs, in the
        lease before ``taken`` (issue 25, race 4: they row-lock a running job)."""
        window = datetime.timedelta(seconds=self.facts.lease + 1.0)
        holds = [
            f"jobs {deps} from {start:%H:%M:%S.%f} to "
            + (f"{until:%H:%M:%S.%f}" if until else "still open")
            for _kind, deps, start, until in list(self.facts.holds)
            if start <= taken and (until is None or until >= taken - window)
        ]
        grips = [
            f"{target} {ids} from {start:%H:%M:%S.%f} to "
            + (f"{until:%H:%M:%S.%f}" if until else "still open")
            for _kind, target, ids, start, until in list(self.facts.grips)
            if start <= taken and (until is None or until >= taken - window)
        ]
        return (
            f"; workflow inserts held open meanwhile depending on {'; '.join(holds)}"
            if holds
            else ""
        ) + (f"; callers' transactions held rows FOR UPDATE: {'; '.join(grips)}" if grips else "")

    @staticmethod
    def _episodes(intervals, limit):
        """Sweep: each moment more than ``limit`` intervals overlap, with the runs open then."""
        events = []
        for run, begin, end in intervals:
            if end <= begin:
                continue  # counted for no time: a zombie that started after its lease was taken
            events.append((begin, 1, run["id"], run))
            events.append((end, 0, run["id"], run))  # ends sort before starts at one instant
        events.sort(key=lambda e: (e[0], e[1], e[2]))
        open_runs, out, over = {}, [], False
        for at, is_start, run_id, run in events:
            if is_start:
                open_runs[run_id] = run
                if len(open_runs) > limit and not over:
                    out.append((at, dict(open_runs)))
                over = len(open_runs) > limit
            else:
                open_runs.pop(run_id, None)
                over = len(open_runs) > limit
        return out

    @staticmethod
    def _describe(runs):
        return ", ".join(
            f"job {r['job']} run {r['id']} ({r['worker']} pid {r['pid']}, {r['mode']}"
            f"{'' if r['ended'] else ', no end'})"
            for r in runs.values()
        )

    # One violation per run that was open when a limit was first exceeded, the oldest one: a
    # hung handler that keeps a limit exceeded while other runs come and go is one violation.

    def _limits(self, runs):
        for name, (column, value, limit) in LIMITS.items():
            mine = [(r, b, e) for r, b, e in runs if r[column] == value]
            for at, open_runs in self._episodes(mine, limit):
                self._add(
                    "limit",
                    (name, min(open_runs)),
                    f"{name}: {len(open_runs)} runs at once (limit {limit}) at {at:%H:%M:%S.%f}: "
                    + self._describe(open_runs),
                )

    def _serial_overlap(self, runs):
        by_key = collections.defaultdict(list)
        for r, b, e in runs:
            if r["serial_key"] is not None:
                by_key[r["serial_key"]].append((r, b, e))
        for key, mine in by_key.items():
            for at, open_runs in self._episodes(mine, 1):
                self._add(
                    "serial-overlap",
                    (key, min(open_runs)),
                    f"serial key {key!r}: {len(open_runs)} runs at once at {at:%H:%M:%S.%f}: "
                    + self._describe(open_runs),
                )

    def _rates(self):
        starts = collections.defaultdict(list)
        for job_id, started, queue, job_type, acct in self.conn.execute(STARTS).fetchall():
            for name, (column, value, _limit, _period, _key) in RATES.items():
                if (queue if column == "queue" else job_type) == value:
                    starts[(name, acct or "")].append((started, job_id))
        for (name, acct), times in starts.items():
            _c, _v, limit, period, _k = RATES[name]
            times.sort()
            span = datetime.timedelta(seconds=period)
            for i in range(len(times) - limit):
                if times[i + limit][0] - times[i][0] < span:
                    window = times[i : i + limit + 1]
                    self._add(
                        "rate",
                        (name, acct, window[0][1]),
                        f"{name} partition {acct!r}: {limit + 1} starts within "
                        f"{(window[-1][0] - window[0][0]).total_seconds():.3f}s (limit {limit} "
                        f"per {period:g}s), jobs {[j for _, j in window]}",
                    )

    def _serial_order(self):
        for newer, older, key, at in self.conn.execute(SERIAL_ORDER).fetchall():
            self._add(
                "serial-order",
                (newer, older),
                f"serial key {key!r}: job {newer} claimed at {at:%H:%M:%S.%f} while the older "
                f"job {older} of its key was pending",
            )

    def _workflow(self):
        for job_id, dep, on_failure_run, state, at in self.conn.execute(WORKFLOW).fetchall():
            self._add(
                "workflow",
                (job_id, dep),
                f"job {job_id} claimed at {at:%H:%M:%S.%f} while its dependency {dep} was "
                f"{state} (on_failure={'run' if on_failure_run else 'cancel'})",
            )

    def _waiting(self, now):
        seen = {}
        for job_id, waiting_on, unfinished, holding in self.conn.execute(WAITING).fetchall():
            if unfinished == 0 or waiting_on != holding:
                key = (job_id, waiting_on, holding, unfinished == 0)
                seen[key] = self._waiting_seen.get(key, now)
                if now - seen[key] >= PERSIST:
                    self._add(
                        "stuck-waiting",
                        (job_id,),
                        f"job {job_id} waiting with waiting_on={waiting_on}, while {holding} "
                        f"dependencies hold it back and {unfinished} are unfinished "
                        f"(for {(now - seen[key]).total_seconds():.1f}s)",
                    )
        self._waiting_seen = seen

    def _unrecorded(self):
        for job_id, cls, message in self.conn.execute(UNRECORDED).fetchall():
            self._add(
                "harness",
                (job_id, cls),
                f"job {job_id}: its run could not be recorded ({cls}: {message}); "
                f"the soak's record is incomplete",
            )

    def _steps(self):
        records = [
            StepRecord(*row) for row in self.conn.execute(STEP_RECORDS, [STEP_TYPE]).fetchall()
        ]
        done = self.conn.execute(STEP_DONE, [STEP_TYPE]).fetchall()
        bodies = [StepBody(*row) for row in self.conn.execute(STEP_BODIES).fetchall()]
        self.step_stats = StepStats()
        found = step_violations(
            records, bodies, self.step_runs, list(self.facts.faults), done, self.step_stats
        )
        for kind, key, text in found:
            self._add(kind, key, text)

    def _waits(self):
        calls = [WaitCall(*row) for row in self.conn.execute(WAIT_CALLS).fetchall()]
        signals = [SignalSent(*row) for row in self.conn.execute(WAIT_SIGNALS).fetchall()]
        records = self.conn.execute(WAIT_RECORDS, [WAIT_TYPE]).fetchall()
        stats = WaitStats()
        found = wait_violations(calls, signals, records, self.step_runs, stats)
        (stats.jobs_done,) = self.conn.execute(WAIT_DONE, [WAIT_TYPE]).fetchone()
        unheard = self.conn.execute(WAIT_UNHEARD, [WAIT_TYPE, UNHEARD_SLACK]).fetchall()
        found += unheard_violations(unheard)
        self.wait_stats = stats
        for kind, key, text in found:
            self._add(kind, key, text)

    def _publish(self):
        calls = list(self.facts.publishes)  # before the database: each names a committed event
        events = [
            soak_publish.PublishEvent(*row)
            for row in self.conn.execute(soak_publish.EVENTS, [soak_publish.EVENT]).fetchall()
        ]
        jobs = [
            soak_publish.SubscriberJob(*row)
            for row in self.conn.execute(soak_publish.JOBS, [soak_publish.EVENT]).fetchall()
        ]
        self.publish_stats = soak_publish.PublishStats()
        for kind, key, text in soak_publish.publish_violations(
            calls, events, jobs, self.publish_stats
        ):
            self._add(kind, key, text)

    def _batches(self):
        jobs = [
            soak_batch.BatchJob(*row)
            for row in self.conn.execute(soak_batch.JOBS, [soak_batch.TYPE]).fetchall()
        ]
        self.batch_stats = soak_batch.BatchStats()
        for kind, key, text in soak_batch.batch_violations(jobs, self.batch_stats):
            self._add(kind, key, text)

    def _fair(self):
        jobs = [
            soak_fair.FairJob(*row)
            for row in self.conn.execute(soak_fair.JOBS, [soak_fair.QUEUE]).fetchall()
        ]
        claims = self.conn.execute(soak_fair.CLAIMS, [soak_fair.QUEUE]).fetchall()
        tags = [row[0] for row in self.conn.execute(soak_fair.TAGS, [soak_fair.QUEUE])]
        self.fair_stats = soak_fair.FairStats()
        for kind, key, text in soak_fair.fair_violations(
            jobs,
            claims,
            tags,
            list(self.facts.faults),
            dict(self.facts.worker_deaths),
            self.fair_stats,
        ):
            self._add(kind, key, text)

    def _hostile(self, final):
        hostile = soak_hostile
        facts = self.facts
        stats = hostile.HostileStats()
        found = hostile.exit_violations(list(facts.worker_exits), list(facts.faults))
        calls = list(facts.door_calls)
        ids = [call.job for call in calls if call.job is not None]
        stored = dict(self.conn.execute(hostile.DOOR_STORED, [ids]).fetchall()) if ids else {}
        found += hostile.door_violations(calls, stored, stats)
        poisoned = dict(facts.poisoned)
        if poisoned:
            jobs = sorted(poisoned)
            rows = self.conn.execute(
                hostile.POISONED, [[poisoned[j].at for j in jobs], jobs]
            ).fetchall()
            found += hostile.poison_violations(poisoned, rows, final, stats)
        retyped = dict(facts.retyped)
        if retyped:
            rows = self.conn.execute(hostile.RETYPED, [sorted(retyped)]).fetchall()
            found += hostile.retype_violations(retyped, rows, final)
        found += hostile.dead_found(self.conn, facts.poisoned)
        pids = {pid: list(tags) for pid, tags in list(facts.worker_pids.items())}
        found += hostile.attempt_violations(
            self.conn.execute(hostile.UNRUN).fetchall(), list(facts.faults), pids, stats
        )
        stats.grips = len(facts.grips)
        self.hostile_stats = stats
        for kind, key, text in found:
            self._add(kind, key, text)

    def _effects(self):
        for key, n, job_id in self.conn.execute(EFFECTS).fetchall():
            self._add("effect", (key,), f"guarded effect {key!r} of job {job_id} happened {n}x")

    def _deadlocks(self):
        for path in self.log_paths():
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if DEADLOCK.search(line):
                    self._add("deadlock", (str(path), n), f"{path.name}:{n}: {line.strip()}")
        for n, text in enumerate(self.facts.errors):
            if DEADLOCK.search(text):
                self._add("deadlock", ("soak", n), f"soak action: {text}")

    def _left(self):
        for state, n, ids in self.conn.execute(LEFT).fetchall():
            self._add("left", (state,), f"{n} job(s) left {state} after the drain, e.g. {ids}")
