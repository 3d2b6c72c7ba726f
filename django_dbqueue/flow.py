"""Flow control: fleet-wide concurrency limits, rate limits and paused queues.

PostgreSQL enforces all three inside the claim (``store.claiming.CLAIM_JOBS`` skips paused queues;
``store.claiming.CLAIM_LIMITED`` and ``dbqueue_claim_within_limits``, migrations 0010 and 0016, apply the
limits), never one elected worker. This module turns the ``QUEUES`` options and the ``@job`` options into the
claim's parameters, and is the API to pause and resume a queue (docs/concepts/flow-control.md).
"""

from dataclasses import dataclass

from django.db import transaction

from . import registry, schema, store, validation
from .conf import get_settings
from .exceptions import InvalidArgument
from .jobspec import database


class UnknownQueue(InvalidArgument):
    """A queue name that is not in ``DBQUEUE["QUEUES"]`` (or not a queue name at all)."""


def queue_limits(options):
    """``(global_concurrency, rate_limit)`` of one ``QUEUES`` entry (``None`` when unset)."""
    options = options or {}
    rate = options.get("rate_limit")
    return options.get("global_concurrency"), (
        None if rate is None else validation.rate_limit(rate)
    )


def claim_params(conf, queues):
    """The limited claim's extra parameters for a worker of ``queues``, or ``None`` when no
    limit applies to it: no queue of it has one and no registered type has one (then it runs
    the plain claim, which costs what it cost before flow control existed).

    A type's limits apply to its jobs in every queue, so a worker that knows of any limited
    type claims every queue through the limited claim."""
    q_conc, q_rate = [], []
    for name in queues:
        conc, rate = queue_limits(conf.QUEUES.get(name))
        q_conc.append(conc)
        q_rate.append(rate)
    types = [
        t
        for t in sorted(registry.all_types().values(), key=lambda t: t.name)
        if t.global_concurrency is not None or t.rate_limit is not None
    ]
    if not types and all(c is None for c in q_conc) and all(r is None for r in q_rate):
        return None
    return {
        "q_conc": q_conc,
        "q_rate_n": [r and r["limit"] for r in q_rate],
        "q_rate_period": [r and r["period"] for r in q_rate],
        "q_rate_key": [r and r["key"] for r in q_rate],
        "t_names": [t.name for t in types],
        "t_conc": [t.global_concurrency for t in types],
        "t_rate_n": [t.rate_limit and t.rate_limit["limit"] for t in types],
        "t_rate_period": [t.rate_limit and t.rate_limit["period"] for t in types],
        "t_rate_key": [t.rate_limit and t.rate_limit["key"] for t in types],
    }


def _known_queue(name):
    validation.queue_name(name, error=UnknownQueue)
    conf = get_settings()
    if name not in conf.QUEUES:
        raise UnknownQueue(
            f"queue {validation.shown(name)} is not in DBQUEUE['QUEUES'] "
            f"(known: {', '.join(sorted(conf.QUEUES))})"
        )
    return conf


def _by(by, action):
    """Who, for the record: "" when nobody said (``""`` or None, as ``cancel()`` takes None),
    else the rule of ``validation.by`` (the one ``cancel()`` applies)."""
    if by is None or (type(by) is str and not by):
        return ""
    return validation.by(by, f"{action}() by", error=InvalidArgument)


@schema.explains_unmigrated
def pause_queue(name, *, by="", using=None):
    """Stop every worker from claiming jobs of queue ``name``; running jobs finish. Jobs can
    still be enqueued. Takes effect at each worker's next claim. ``by``: who, for the record
    (the admin and the command fill it in; at most 200 characters). Commits at once (or with the
    caller's transaction).

    Raises ``UnknownQueue`` for a name not in ``QUEUES``, ``InvalidArgument`` for a ``by`` that
    is not a str PostgreSQL can store, ``UnknownDatabase``/``UnsupportedDatabase`` for a bad
    ``using`` and ``NotMigrated`` on a database without the queue's tables."""
    conf = _known_queue(name)
    by = _by(by, "pause_queue")
    store.pause_queue(database(using, conf), name=name, by=by)


@schema.explains_unmigrated
def resume_queue(name, *, by="", using=None):
    """Let the workers claim queue ``name`` again, and wake them (the wake-up is delivered when
    this commits). Raises as :func:`pause_queue`."""
    conf = _known_queue(name)
    by = _by(by, "resume_queue")
    using = database(using, conf)
    with transaction.atomic(using=using):
        store.resume_queue(using, name=name, by=by, channel=conf.NOTIFY_CHANNEL)


@dataclass(frozen=True)
class QueueFlow:
    """One queue's flow as the status command and the admin show it."""

    name: str
    paused: bool
    changed_at: object
    changed_by: str
    running: int
    global_concurrency: int | None
    rate_limit: dict | None
    rate_reopens_at: object  # when its (unkeyed) rate window has room again; None: room now


def queue_flows(using=None):
    """``[QueueFlow, ...]`` of every queue in ``QUEUES`` (and any paused queue not in it)."""
    conf = get_settings()
    using = database(using, conf)
    state = store.flow_state(using)
    names = list(conf.QUEUES) + sorted(set(state["queues"]) - set(conf.QUEUES))
    flows = []
    for name in names:
        conc, rate = queue_limits(conf.QUEUES.get(name))
        paused, changed_at, changed_by = state["queues"].get(name, (False, None, ""))
        reopens = None
        if rate is not None and rate["key"] is None:
            reopens = store.rate_window(
                using, scope="queue", name=name, part="", limit=rate["limit"], period=rate["period"]
            )
        flows.append(
            QueueFlow(
                name=name,
                paused=paused,
                changed_at=changed_at,
                changed_by=changed_by,
                running=state["running_queue"].get(name, 0),
                global_concurrency=conc,
                rate_limit=rate,
                rate_reopens_at=reopens,
            )
        )
    return flows


def type_flows(using=None):
    """``[(type name, running, global_concurrency, rate_limit, reopens_at), ...]`` of the
    registered types that have a limit."""
    conf = get_settings()
    using = database(using, conf)
    state = store.flow_state(using)
    result = []
    for t in sorted(registry.all_types().values(), key=lambda t: t.name):
        if t.global_concurrency is None and t.rate_limit is None:
            continue
        reopens = None
        if t.rate_limit is not None and t.rate_limit["key"] is None:
            reopens = store.rate_window(
                using,
                scope="type",
                name=t.name,
                part="",
                limit=t.rate_limit["limit"],
                period=t.rate_limit["period"],
            )
        running = state["running_type"].get(t.name, 0)
        result.append((t.name, running, t.global_concurrency, t.rate_limit, reopens))
    return result
