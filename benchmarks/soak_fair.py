"""The soak's fairness invariant (benchmarks/soak_check.py runs it; docs/soak.md).

The queue ``fair`` (benchmarks/soak_settings.py: ``{"fair": True}``) is served by one worker
slot only, the last of four or more (benchmarks/soak.py, ``Slot``), started with
``DBQUEUE_SOAK_FAIR`` set: benchmarks/soakapp/jobs.py then registers no type with a fleet-wide
limit, so that the worker claims through the fair claim (under any limit it would run the
limited claim, which knows no fairness: docs/fairness.md, ``dbqueue.W004``). The producer's kind
``fair`` (:func:`produce`) enqueues either a backlog of 20 to 60 jobs of the key ``hog`` or
one job each of two to six new keys, ``soak-work`` jobs with the step's failure plan.

- ``fair-starve``: a key starved: from a job's enqueue until the first claim that took a job of
  its key (this one or another: the key had its turn), or the job's cancel, or now when it is
  still pending, another key got jobs in more than ``K`` of the claims that began in that
  time. The bound (docs/fairness.md, "The bound"):
  a claim visits the keys after the last one its worker served, one job each while keys
  outnumber its slots, or every key at once; so before the waiting key's turn no other key is
  visited twice, and one more claim may have begun before the job's commit made it visible:
  ``K`` = 2. A claim is the set of jobs that went ``pending -> running`` under one lease token
  (``soak_transition``). Excused: a wait in which a fair worker died, was restarted, stopped,
  or lost its sessions (a new process starts the rotation from the first key; a claim whose
  reply was lost leaves the cursor where it was).
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass

QUEUE = "fair"
HOG = "hog"
K = 2
MIN_WORKERS = 4  # the fair slot is the last of this many or more; fewer: no fair jobs


def is_fair_slot(index, workers):
    """Whether worker slot ``index`` of ``workers`` serves the fair queue (and only it)."""
    return workers >= MIN_WORKERS and index == workers - 1


def produce(d, payload, workers):
    """The ``fair`` producer's items for ``enqueue_many`` (none without a fair slot): a backlog
    of the key ``hog`` (d[0] < 0.3), else one job each of two to six keys never used before
    (often more keys than the fair worker's slots, so that a claim cannot serve them all)."""
    if workers < MIN_WORKERS:
        return []
    if d[0] < 0.3:
        job = {"ms": 20, "fail": [], "ignore_cancel": False}
        return [{"type": "soak-work", "payload": job, "queue": QUEUE, "fair_key": HOG}] * (
            20 + int(d[1] * 41)
        )
    key = f"t{int(d[2] * 10**9)}"
    return [
        {"type": "soak-work", "payload": payload, "queue": QUEUE, "fair_key": f"{key}.{n}"}
        for n in range(2 + int(d[3] * 5))
    ]


# Every claim of the fair queue: its lease token, when its transaction began, and the key of
# each job it took.
CLAIMS = """
SELECT t.new_token, t.xact_at, j.fair_key
FROM soak_transition AS t JOIN dbqueue_job AS j ON j.id = t.job_id
WHERE j.queue = %s AND t.old_state = 'pending' AND t.new_state = 'running'
"""
# Every job of the fair queue: its key, its enqueue (the INSERT's clock) and the end of its
# first wait (when the first transaction that took it out of pending began; NULL: pending).
JOBS = """
SELECT j.id, j.fair_key, i.at,
       (SELECT min(t.xact_at) FROM soak_transition AS t
        WHERE t.job_id = j.id AND t.old_state = 'pending')
FROM dbqueue_job AS j
JOIN soak_transition AS i ON i.job_id = j.id AND i.old_state IS NULL AND i.new_state = 'pending'
WHERE j.queue = %s
ORDER BY j.id
"""
# The worker tags that ran jobs of the fair queue: their slots are the fair ones.
TAGS = "SELECT DISTINCT worker FROM soak_run WHERE queue = %s"


@dataclass(frozen=True)
class FairJob:
    id: int
    key: str
    due: object  # datetime: its INSERT
    end: object  # datetime or None: the start of the transaction that ended its first wait


@dataclass
class FairStats:
    jobs: int = 0
    claims: int = 0
    keys: int = 0
    excused: int = 0  # waits past the bound that a fault or a restart of the fair worker excused
    worst: int = 0  # the most claims one other key got during one wait (not excused)


def fair_violations(jobs, claims, tags, faults=(), deaths=None, stats=None, k=K):
    """``[(kind, key, text)]``. ``claims``: ``(token, began, key)`` rows; ``tags``: the fair
    workers' tags; ``faults``: the soak's ``(kind, tag, from, until)``; ``deaths``: tag -> when
    reaped."""
    stats = stats if stats is not None else FairStats()
    slots = {tag.split(".")[0] + "." for tag in tags}

    def fair(tag):
        return any(tag.startswith(slot) for slot in slots)

    # A stop lasts until its SIGCONT (None while stopped); the other faults are instants (a
    # SIGTERM's restart is its death).
    troubles = [
        (f, f if u is None and kind != "stop" else u) for kind, tag, f, u in faults if fair(tag)
    ]
    troubles += [(at, at) for tag, at in (deaths or {}).items() if fair(tag)]
    by_token = {}
    for token, began, key in claims:
        began_keys = by_token.setdefault(token, (began, set()))
        began_keys[1].add(key)
    ordered = sorted(by_token.values(), key=lambda c: c[0])
    starts = [c[0] for c in ordered]
    stats.jobs, stats.claims = len(jobs), len(ordered)
    stats.keys = len({job.key for job in jobs})
    out = []
    for job in jobs:
        end = job.end
        if end is None and ordered:
            end = ordered[-1][0]  # still pending: every claim so far, the last one included
        if end is None or end < job.due:
            continue
        lo = bisect.bisect_right(starts, job.due)
        hi = len(ordered) if job.end is None else bisect.bisect_left(starts, end)
        # The key's turn: the first claim that took a job of it ends its wait.
        turn = next((i for i in range(lo, hi) if job.key in ordered[i][1]), hi)
        per_key = collections.Counter(key for _, keys in ordered[lo:turn] for key in keys)
        if not per_key:
            continue
        other, n = per_key.most_common(1)[0]
        if n > k and any(f <= end and (u is None or u >= job.due) for f, u in troubles):
            stats.excused += 1
            continue
        stats.worst = max(stats.worst, n)
        if n > k:
            out.append((
                "fair-starve",
                (job.id,),
                f"fair job {job.id} of key {job.key!r}, due at {job.due}, waited for its key's "
                f"turn while key {other!r} got jobs in {n} claims (bound {k})",
            ))  # fmt: skip
    return out
