"""The soak's hostile actors and their invariants (issue 35; benchmarks/soak_check.py runs them).

Issue 35: nothing a row, a role or a caller's transaction does can stop the fleet, charge
another job an attempt, or raise a privilege. The soak's actor ``hostile`` (its own
``random.Random``, drawn at every step as the others are: the other actors' schedules are the
same with it or without it) does, now and then, one of:

- ``door``: a call of the SQL door ``dbqueue_enqueue()`` (docs/sql.md, "Payloads") of the type
  ``soak-hostile`` with a payload from :data:`DOOR_PAYLOADS`: some Python cannot read back (a
  5000-digit integer, arrays nested 1500 or 101 deep, a number with a fraction past a float's
  range or not the float Python reads), which the door must refuse, and some at the edge of
  what it takes (100 levels, 4300 digits, ``1e400``, ``5e-324``, a list, a string), which it must
  take, and which a worker must run; any other error than the documented refusal (SQLSTATE
  22023) is ``door-error``;
- ``poison``: a ``soak-poison`` job enqueued a little in the future, whose payload a plain
  ``UPDATE`` then replaces, while it is pending, by one of :data:`POISONS` (the table's CHECKs
  allow any jsonb): the job must end dead at its first claim with ``UnreadableJob`` naming the
  payload, its handler never entered, and the jobs claimed with it run as usual;
- ``retype``: the same, but the ``UPDATE`` changes the pending job's type to one no worker
  registers (:data:`UNKNOWN_TYPE`), and puts it back 1 to 4 s later: a worker that claims it
  meanwhile hands it back without spending the attempt, due again after ``UNKNOWN_TYPE_DELAY``
  (1 s in the soak); once its type is back it must run;
- ``grip``: a caller's transaction (its own connection) that locks ``FOR UPDATE`` a few pending
  jobs, a few running jobs, or a few limiter rows, holds them 1 to 5 s, and commits.

What the soak records for them (``Facts``): each door call with its outcome, each poisoned job,
each grip's span; and, for every worker process, the exits the soak did not cause at the end
(``Facts.worker_exits``) and the pids of its slots (``Facts.worker_pids``, to tell whose lease
an ``LeaseExpired`` entry names).

The invariants (each a pure function over what was read, tested in
tests/unit/test_soak_check_hostile.py):

- ``worker-exit``: a worker process exited although the soak had sent its slot neither a kill
  nor a SIGTERM before (a poison row, a held row, a refused payload must never end a worker);
- ``door-accepted``: the door took a payload Python cannot read back; ``door-refused``: it
  refused one docs/sql.md says it takes; ``door-unreadable``: a job the door wrote holds a
  payload Python cannot read (decoding.json_value);
- ``poison-ran``: a handler run of a poisoned job began after the poison; ``poison-end``: a
  poisoned job ended other than dead (or cancelled by the operator), or dead without
  ``UnreadableJob`` naming the payload as its last entry, or with more attempts than the one
  claim that found the poison; after the drain, one still pending or running;
- ``retype-end``: a job whose type was made unknown ended dead, or, after the drain, neither
  done nor cancelled;
- ``dead-unowned``: a dead job the soak did not poison with no entry in its error history, or
  with an ``UnreadableJob`` entry (it died of another job's poison);
- ``attempt-charged``: an attempt of a job (``1..attempts``) that no handler run of the job
  began (``soak_run``) and no entry of its error history names, other than the last attempt of
  a job still running (its run is on its way) or cancelled (a cancel may end a claimed job
  before its handler starts);
- ``attempt-swept``: an attempt that no handler run began, ended by ``LeaseExpired`` naming a
  worker the soak had not killed, stopped, terminated or sent SIGTERM before the entry: a live
  worker's job taken back from it (say, while a caller's transaction held its row).
"""

from __future__ import annotations

import collections
import datetime
from dataclasses import dataclass, field

from django_dbqueue.decoding import json_value
from django_dbqueue.exceptions import UnreadableJob

DOOR_TYPE = "soak-hostile"
POISON_TYPE = "soak-poison"
EXIT_FAULTS = {"kill", "sigterm"}  # faults the soak sends that end a worker's process
SWEEP_FAULTS = {"kill", "stop", "terminate", "sigterm"}  # faults after which a lease may go


def _deep(levels):
    return "[" * levels + "]" * levels


# (name, JSON text, "refused" or "taken" by dbqueue_enqueue(): docs/sql.md, "Payloads")
DOOR_PAYLOADS = [
    ("digits-5000", '{"n": ' + "9" * 5000 + "}", "refused"),
    ("deep-1500", _deep(1500), "refused"),
    ("deep-101", _deep(101), "refused"),
    ("float-400", '{"x": 1' + "0" * 400 + ".5}", "refused"),
    ("float-inexact", '{"x": 0.1000000000000000055}', "refused"),
    ("float-tiny", '{"x": 1e-400}', "refused"),
    ("digits-4300", '{"n": ' + "9" * 4300 + "}", "taken"),
    ("deep-100", _deep(100), "taken"),
    ("e400", '{"n": 1e400}', "taken"),
    ("denormal", '{"x": 5e-324}', "taken"),
    ("list", "[1, 2, 3]", "taken"),
    ("string", '"text"', "taken"),
]

# (name, JSON text): payloads a plain UPDATE may write, that Python cannot read.
POISONS = [
    ("digits-5000", '{"n": ' + "9" * 5000 + "}"),
    ("deep-1500", _deep(1500)),
    ("float-400", '{"x": 1' + "0" * 400 + ".5}"),
]

# The type poison: a pending job's type changed to one no worker registers. By design
# (docs/settings.md, UNKNOWN_TYPE_DELAY) a worker that claims it hands it back to pending
# without spending the attempt, due again after the delay (1 s in the soak); the hostile actor
# puts the type back 1 to 4 s later (the drain does it at once), and the job must then run.
UNKNOWN_TYPE = "soak-no-such-type"
RETYPE_SQL = """
UPDATE dbqueue_job SET type = %s
WHERE id = %s AND state = 'pending'
RETURNING attempts, clock_timestamp()
"""
REPAIR_SQL = "UPDATE dbqueue_job SET type = %s WHERE id = %s AND type = %s RETURNING id"
RETYPED = "SELECT id, state, attempts, type FROM dbqueue_job WHERE id = ANY(%s) ORDER BY id"

POISON_SQL = """
UPDATE dbqueue_job SET payload = %s::jsonb
WHERE id = %s AND state = 'pending'
RETURNING attempts, clock_timestamp()
"""

GRIP_TARGETS = {
    "pending": "SELECT id FROM dbqueue_job WHERE state = 'pending' ORDER BY id",
    "running": "SELECT id FROM dbqueue_job WHERE state = 'running' ORDER BY id",
    "limiter": "SELECT id FROM dbqueue_limiter ORDER BY id",
}
GRIP_LOCK = {
    "pending": "SELECT id FROM dbqueue_job WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
    "running": "SELECT id FROM dbqueue_job WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
    "limiter": "SELECT id FROM dbqueue_limiter WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
}


# -- what the checker reads ----------------------------------------------------------------------

# The payloads of the jobs the door wrote, as text (decoded by the checker, not psycopg).
DOOR_STORED = "SELECT id, payload::text FROM dbqueue_job WHERE id = ANY(%s)"

# Each poisoned job's end so far, its last error entry, and the runs that began after the poison.
POISONED = """
SELECT j.id, j.state, j.attempts, j.errors -> -1 ->> 'class', j.errors -> -1 ->> 'message',
       j.cancelled_by,
       (SELECT array_agg(r.id ORDER BY r.id) FROM soak_run AS r
        WHERE r.job_id = j.id AND r.started_at >= k.at),
       (SELECT count(*) FROM jsonb_array_elements(j.errors) AS e
        WHERE e ->> 'class' LIKE '%%LeaseExpired' AND (e ->> 'at')::timestamptz >= k.at)
FROM unnest(%s::timestamptz[], %s::bigint[]) AS k(at, id)
JOIN dbqueue_job AS j ON j.id = k.id
"""

DEAD = """
SELECT j.id, jsonb_array_length(j.errors),
       (SELECT e ->> 'message' FROM jsonb_array_elements(j.errors) AS e
        WHERE e ->> 'class' LIKE '%%UnreadableJob' LIMIT 1)
FROM dbqueue_job AS j
WHERE j.state = 'dead'
  AND (jsonb_array_length(j.errors) = 0
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(j.errors) AS e
                  WHERE e ->> 'class' LIKE '%%UnreadableJob'))
ORDER BY j.id
"""

# Attempts no handler run began, in one snapshot with the runs: (job, state, attempts, attempt,
# the class, worker and time of the error entry naming that attempt, if any; the last one).
UNRUN = """
SELECT j.id, j.state, j.attempts, n.n, e.cls, e.worker, e.at
FROM dbqueue_job AS j
CROSS JOIN LATERAL generate_series(1, j.attempts) AS n(n)
LEFT JOIN LATERAL (
    SELECT x ->> 'class' AS cls, x ->> 'worker' AS worker, x ->> 'at' AS at
    FROM jsonb_array_elements(j.errors) WITH ORDINALITY AS y(x, i)
    WHERE (x ->> 'attempt') = n.n::text
    ORDER BY y.i DESC LIMIT 1
) AS e ON true
WHERE j.attempts > 0
  AND NOT EXISTS (SELECT 1 FROM soak_run AS r WHERE r.job_id = j.id AND r.attempt = n.n)
ORDER BY j.id, n.n
"""


# -- the invariants ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DoorCall:
    name: str
    expect: str  # "refused" or "taken"
    outcome: str  # "refused" (SQLSTATE 22023, as documented), "taken", or "error" (any other)
    job: int | None  # the id the door returned
    detail: str  # the refusal's SQLSTATE and message


@dataclass(frozen=True)
class Poisoned:
    job: int
    name: str
    at: datetime.datetime  # the UPDATE's clock
    attempts: int  # the job's attempts when it was poisoned


@dataclass
class HostileStats:
    doors: collections.Counter = field(default_factory=collections.Counter)  # "name outcome"
    poisoned: collections.Counter = field(default_factory=collections.Counter)  # state -> jobs
    unrun: collections.Counter = field(default_factory=collections.Counter)  # why allowed


def exit_violations(exits, faults):
    """``worker-exit`` from ``exits`` ([(tag, code, at)]: a worker process ended while the soak
    was not stopping) and ``faults`` (``Facts.faults``)."""
    out = []
    for tag, code, at in exits:
        if any(
            kind in EXIT_FAULTS and who == tag and start <= at for kind, who, start, _ in faults
        ):
            continue
        out.append((
            "worker-exit",
            (tag,),
            f"worker {tag} exited with code {code} at {at:%H:%M:%S.%f}, although the soak sent "
            "it neither a kill nor a SIGTERM: something else stopped it (see its log)",
        ))  # fmt: skip
    return out


def readable(text):
    """None when Python reads the JSON ``text`` back, else why not."""
    try:
        json_value(text, "payload")
    except UnreadableJob as exc:
        return str(exc)
    return None


def door_violations(calls, stored, stats=None):
    """``door-*`` from the door ``calls`` (:class:`DoorCall`) and ``stored`` ({job id: the
    payload's text}, of the jobs the door wrote, when read)."""
    out = []
    for n, call in enumerate(calls):
        if stats is not None:
            stats.doors[f"{call.name} {call.outcome}"] += 1
        if call.outcome != call.expect:
            kind = {"taken": "door-accepted", "refused": "door-refused"}.get(
                call.outcome, "door-error"
            )
            out.append((
                kind,
                (call.name, n),
                f"dbqueue_enqueue() {call.outcome} the payload {call.name} (docs/sql.md: "
                f"{call.expect})" + (f": {call.detail}" if call.detail else "")
                + (f"; job {call.job}" if call.job is not None else ""),
            ))  # fmt: skip
        if call.job is not None and call.job in stored:
            why = readable(stored[call.job])
            if why is not None:
                out.append((
                    "door-unreadable",
                    (call.job,),
                    f"job {call.job}, written by dbqueue_enqueue() with the payload {call.name}, "
                    f"holds a payload Python cannot read: {why}",
                ))  # fmt: skip
    return out


def poison_violations(poisoned, rows, final=False, stats=None):
    """``poison-*`` from ``poisoned`` ({job: :class:`Poisoned`}) and ``rows`` (:data:`POISONED`:
    job, state, attempts, last entry's class and message, cancelled_by, runs begun after, the
    leases that expired after it). A claim whose worker the soak killed before it read the row
    is charged by the lease's expiry (the design's count for a worker that dies); those are
    excused here, and ``attempt-swept`` checks that each such worker was one the soak faulted."""
    out = []
    for job, state, attempts, cls, message, cancelled_by, runs, expired in rows:
        p = poisoned[job]
        if stats is not None:
            stats.poisoned[state] += 1
        if runs:
            out.append((
                "poison-ran",
                (job,),
                f"job {job}, its payload poisoned ({p.name}) at {p.at:%H:%M:%S.%f}, was run by a "
                f"handler after that (runs {runs})",
            ))  # fmt: skip
        why = None
        if state in ("pending", "running"):
            if final:
                why = f"still {state} after the drain"
        elif state == "cancelled":
            if cancelled_by is None:
                why = "cancelled, by nobody"
        elif state != "dead":
            why = f"{state}, not dead"
        elif _short(cls) != "UnreadableJob" or not (message or "").startswith("payload:"):
            why = (
                f"dead with the last entry {cls}: {message!r}, not UnreadableJob naming the payload"
            )
        elif attempts > p.attempts + 1 + expired:
            why = f"dead after {attempts} attempts: more than the one claim that found the poison"
        if why:
            out.append((
                "poison-end",
                (job,),
                f"job {job}, its payload poisoned ({p.name}) at {p.at:%H:%M:%S.%f}: {why}",
            ))  # fmt: skip
    return out


def retype_violations(retyped, rows, final=False):
    """``retype-end`` from ``retyped`` ({job: :class:`Poisoned`}, name ``type-unknown``) and
    :data:`RETYPED`'s rows (job, state, attempts, type): a job whose type was unknown for a
    while must never end dead (an unknown type spends no attempt) and, once its type is back,
    must run: after the drain, done or cancelled."""
    out = []
    for job, state, attempts, job_type in rows:
        p = retyped[job]
        why = None
        if state == "dead":
            why = f"dead after {attempts} attempts"
        elif final and state not in ("done", "cancelled"):
            why = f"still {state} after the drain (type {job_type!r})"
        if why:
            out.append((
                "retype-end",
                (job,),
                f"job {job}, its type made unknown at {p.at:%H:%M:%S.%f} (then put back): {why}",
            ))  # fmt: skip
    return out


def dead_found(conn, poisoned):
    """``dead-unowned`` now: :data:`DEAD` read first, then the ids poisoned so far (the live
    mapping ``poisoned``, which the hostile actor writes on another thread). The actor notes a
    poison before its ``UPDATE``, and a job dies of it only after: every death the query sees
    was noted before the query ran, so the mapping read after it names each one. (Read before
    it, a poison noted, written and fatal in between looked unowned: a false violation.)"""
    rows = conn.execute(DEAD).fetchall()
    return dead_violations(rows, dict(poisoned))


def dead_violations(rows, poisoned):
    """``dead-unowned`` from :data:`DEAD`'s rows (job, entries, an UnreadableJob message) and
    the ids the soak poisoned."""
    out = []
    for job, entries, unreadable in rows:
        if job in poisoned:
            continue
        if not entries:
            why = "with no entry in its error history"
        elif unreadable is not None:
            why = f"of UnreadableJob ({unreadable!r}), although the soak never poisoned it"
        else:
            continue
        out.append(("dead-unowned", (job,), f"job {job} is dead {why}"))
    return out


def _short(cls):
    """An error entry's class without its module (``django_dbqueue.exceptions.UnreadableJob``)."""
    return (cls or "").rsplit(".", 1)[-1]


def _when(text):
    try:
        return datetime.datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def _pid(worker_id):
    """The pid in a worker id (``host:pid:hex``, django_dbqueue.worker.make_worker_id)."""
    parts = (worker_id or "").rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def attempt_violations(rows, faults, worker_pids, stats=None):
    """``attempt-charged`` and ``attempt-swept`` from :data:`UNRUN`'s rows, ``faults``
    (``Facts.faults``) and ``worker_pids`` ({pid: [slot tags]})."""
    out = []
    for job, state, attempts, n, cls, worker, at in rows:
        if cls is None:
            if n == attempts and state in ("running", "cancelled"):
                if stats is not None:
                    stats.unrun[f"last attempt, {state}"] += 1
                continue
            out.append((
                "attempt-charged",
                (job, n),
                f"job {job} ({state}, {attempts} attempts) was charged attempt {n}, which no "
                "handler run began and no entry of its error history names",
            ))  # fmt: skip
            continue
        if _short(cls) != "LeaseExpired":
            if stats is not None:
                stats.unrun[_short(cls)] += 1
            continue
        tags = worker_pids.get(_pid(worker), [])
        when = _when(at)
        if any(
            kind in SWEEP_FAULTS and tag in tags and (when is None or start <= when)
            for kind, tag, start, _ in faults
        ):
            if stats is not None:
                stats.unrun["LeaseExpired after a fault"] += 1
            continue
        out.append((
            "attempt-swept",
            (job, n),
            f"job {job} was charged attempt {n}, which no handler run began, by LeaseExpired at "
            f"{at} naming worker {worker} ({', '.join(tags) or 'not a worker of the soak'}), "
            "which the soak had not faulted",
        ))  # fmt: skip
    return out
