"""The soak's publish/subscribe invariant (benchmarks/soak_check.py runs it; docs/soak.md).

The producer publishes ``EVENT`` to the subscribers ``SUBSCRIBERS`` (benchmarks/soakapp/jobs.py),
most often with an idempotency key drawn from a small set, so that keys repeat, and notes each
call that returned (after its commit: the producer runs in autocommit) in ``Facts.publishes``:
``(key, event id, created, [job ids])``. The checker reads those first, then the database, so
every event a call names is committed and visible to it.

- ``publish-jobs``: an event whose subscriber list is not ``SUBSCRIBERS``, or whose jobs are not
  exactly one per subscriber it names (one missing, two of one type, one of a type it does not
  name);
- ``publish-repeat``: a key whose calls made more than one event or none, returned different
  events, or a repeated call that returned a job the first call did not make (a new job), or a
  call without a key that did not create its event;
- ``publish-done-twice``: a subscriber's job that reached ``done`` twice (two transitions into
  ``done``), or whose atomic subscriber (``soak-sub-ledger``, its effect written in the job's
  transaction) committed its effect twice: two successful runs. A plain subscriber's run that
  returned twice is the at-least-once price of a fault between its return and its completion
  (kill -9, SIGSTOP past the lease, a terminated session): counted, not flagged.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

EVENT = "soak.paid"
SUBSCRIBERS = ("soak-sub-ledger", "soak-sub-notify")  # by type name, as subscribers() orders
KEYS = 12  # the idempotency keys the producer draws from

# Each soak event with the subscribers it names and the types of the jobs that refer to it (one
# statement: an event and its jobs commit together).
EVENTS = """
SELECT e.id, e.idempotency_key, e.subscribers,
       COALESCE(jsonb_agg(j.type ORDER BY j.type) FILTER (WHERE j.id IS NOT NULL), '[]'::jsonb)
FROM dbqueue_event AS e LEFT JOIN dbqueue_job AS j ON j.event_id = e.id
WHERE e.name = %s
GROUP BY e.id ORDER BY e.id
"""
# Each subscriber's job: its transitions into done, its runs that returned, its atomic effect.
JOBS = """
SELECT j.id, j.type,
       (SELECT count(*) FROM soak_transition AS t WHERE t.job_id = j.id AND t.new_state = 'done'),
       (SELECT count(*) FROM soak_run AS r WHERE r.job_id = j.id AND r.outcome = 'returned'),
       (SELECT f.n FROM soak_effect AS f WHERE f.key = 'atomic:' || j.id)
FROM dbqueue_job AS j JOIN dbqueue_event AS e ON e.id = j.event_id
WHERE e.name = %s
ORDER BY j.id
"""


@dataclass(frozen=True)
class PublishEvent:
    id: int
    key: str | None
    subscribers: list  # the types it names
    jobs: list  # the types of the jobs that refer to it


@dataclass(frozen=True)
class SubscriberJob:
    id: int
    type: str
    done: int  # transitions into done
    returned: int  # runs whose handler returned
    effects: int | None  # the atomic subscriber's committed effects


@dataclass
class PublishStats:
    calls: int = 0
    repeats: int = 0  # calls that repeated a key: created nothing
    events: int = 0
    jobs: int = 0
    done: int = 0
    returned_twice: collections.Counter = field(default_factory=collections.Counter)  # type -> n


def publish_violations(calls, events, jobs, stats=None):
    """``[(kind, key, text)]`` from the producer's ``calls`` (``(key, event id, created, [job
    ids])``), the ``events`` (:class:`PublishEvent`) and the subscribers' ``jobs``
    (:class:`SubscriberJob`)."""
    stats = stats if stats is not None else PublishStats()
    out = []
    for event in events:
        named, made = list(event.subscribers), sorted(event.jobs)
        if sorted(named) != sorted(SUBSCRIBERS) or made != sorted(named):
            out.append((
                "publish-jobs",
                (event.id,),
                f"event {event.id} (key {event.key!r}) names subscribers {named} and has jobs of "
                f"{made}: one job per subscriber of {list(SUBSCRIBERS)} expected",
            ))  # fmt: skip
    out += _repeats(calls, {event.id: event for event in events}, stats)
    for job in jobs:
        if job.done > 1 or (job.effects or 0) > 1:
            out.append((
                "publish-done-twice",
                (job.id,),
                f"{job.type} job {job.id} reached done {job.done}x, committed its effect "
                f"{job.effects or 0}x ({job.returned} runs returned): two successful runs",
            ))  # fmt: skip
        if job.returned > 1:
            stats.returned_twice[job.type] += 1
    stats.calls, stats.events, stats.jobs = len(calls), len(events), len(jobs)
    stats.done = sum(1 for job in jobs if job.done)
    return out


def _repeats(calls, events, stats):
    out, by_key = [], collections.defaultdict(list)
    for key, event_id, created, job_ids in calls:
        if key is None:
            if not created:
                out.append((
                    "publish-repeat",
                    (None, event_id),
                    f"a publish without a key returned event {event_id} with created=False",
                ))  # fmt: skip
            continue
        by_key[key].append((event_id, created, sorted(job_ids)))
    for key, mine in by_key.items():
        made = [(event_id, job_ids) for event_id, created, job_ids in mine if created]
        ids = sorted({event_id for event_id, _c, _j in mine})
        held = sorted(e.id for e in events.values() if e.key == key)
        stats.repeats += len(mine) - len(made)
        if len(made) != 1 or len(ids) != 1 or held != ids:
            out.append((
                "publish-repeat",
                (key,),
                f"key {key!r}: {len(mine)} publishes created {len(made)} events, returned "
                f"events {ids}, and the database holds events {held} for it: exactly one "
                "expected",
            ))  # fmt: skip
            continue
        first = set(made[0][1])
        for event_id, created, job_ids in mine:
            if not created and not set(job_ids) <= first:
                out.append((
                    "publish-repeat",
                    (key, tuple(job_ids)),
                    f"key {key!r}: a repeated publish returned jobs {job_ids} of event "
                    f"{event_id}, where the first made {sorted(first)}: a new job",
                ))  # fmt: skip
    return out
