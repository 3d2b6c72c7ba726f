"""Building a worker's parts and starting its threads (the mirror of shutdown.py).

``assemble`` gives a ``Worker`` (``w``) its Session, acknowledger, heartbeat, presence, handler
pool, wake-up waiting and maintenance services; ``set_flow`` its fleet-wide limits (again at
``start``, once the tasks backend's @task functions are known); ``start`` starts the handler
pool and the listener (or the supervisor's wake-up pipe).
"""

import logging

from . import claiming, flow, waiters
from .acks import Acknowledger
from .connections import Session
from .heartbeat import Heartbeat
from .maintenance import Maintenance
from .notifications import Listener
from .pools import make_pool
from .presence import Presence
from .rollup import Rollup
from .scheduler import Scheduler
from .sweeper import Sweeper

logger = logging.getLogger("django_dbqueue")


def assemble(w, conf, *, waker):
    """Build ``w``'s parts (from its settings, read by ``Worker.__init__``)."""
    # The loop's own connection: prepared statements; claims, completions and heartbeats
    # commit asynchronously with ASYNC_COMMIT (see connections.Session).
    # It LISTENs too when this process listens for itself on the queue's database: the
    # backend that delivers a notification then runs the claim (docs/performance.md).
    listen_here = (
        w.listen and not w.burst and waker is None and (conf.LISTEN_DATABASE or w.using) == w.using
    )
    w.session = Session(
        w.using,
        prepare=conf.PREPARE,
        listen=conf.NOTIFY_CHANNEL if listen_here else None,
        on_notify=w._wakeup.set,
        track_backend=True,  # a claim its lost connection left running is ended (_recover)
        # No statement of the loop waits long for a row another transaction holds (a caller's
        # select_for_update(), an early SET CONSTRAINTS): the hot ones pass such rows over
        # (SKIP LOCKED), and this bounds the rest (a trigger's, a function's).
        lock_timeout=lock_timeout(conf),
    )
    w.acks = Acknowledger(
        worker_id=w.worker_id,
        batch=conf.ACK_BATCH,
        async_commit=w.async_commit,
        unknown_type_delay=conf.UNKNOWN_TYPE_DELAY,
        unknown_type_grace=conf.UNKNOWN_TYPE_GRACE,
        max_snoozes=conf.MAX_SNOOZES,
    )
    w.acks.on_ready = w._on_ack
    w.heartbeat = Heartbeat(w)
    w.presence = Presence(w)  # its row in the worker registry
    hung_limit = conf.HUNG_THREAD_LIMIT
    w.pool = make_pool(
        w,
        w.execution,
        w.concurrency,
        hung_limit=w.concurrency if hung_limit is None else hung_limit,
    )
    # Whether this worker says, on its own connection, that it waits for wake-ups (so that
    # enqueues send them only while some worker waits: waiters.py). Not when it is never
    # woken, nor when its connection may be a pooled one (LISTEN_DATABASE names another
    # alias): then its listener, on the direct connection, says it for as long as it runs.
    w.waiting = waiters.Waiting(
        w.session,
        w.queues,
        waiting_mode(w)
        if w.listen and not w.burst and (conf.LISTEN_DATABASE or w.using) == w.using
        else None,
        slots=waker is None,  # a group's listener picks whom to wake: its workers hold none
    )
    w.sweeper = Sweeper(w.using, conf=conf, db=w.session, owner=lambda: claiming.own_jobs(w))
    w.scheduler = Scheduler(w.using, conf=conf)
    w.rollup = Rollup(w.using, conf=conf, db=w.session)  # the dashboard's minutes
    w.maintenance = Maintenance(w)


def lock_timeout(conf):
    """Seconds a statement of the worker's own connection may wait for a lock: a quarter of a
    heartbeat interval, from 0.2 s to 1 s. Long enough for the locks workers take from each
    other for an instant (a limiter row, a dependent counted down), short enough that a
    caller's transaction holding a row never costs the other jobs' leases a heartbeat."""
    return min(1.0, max(0.2, conf.HEARTBEAT_INTERVAL / 4))


def set_flow(w, conf):
    """Fleet-wide limits (flow.py): ``w.flow`` None runs the plain claim. A limited claim says
    what held it back: a full concurrency limit (claim again when one of our jobs ends) or a
    rate window (claim again when it reopens, not at every poll)."""
    w.flow = flow.claim_params(conf, w.queues)
    # Fair queues (docs/fairness.md): per queue whether it is fair (None: none is), and per fair
    # queue the last key this worker served in it, where its next claim goes on.
    fair = [bool((conf.QUEUES.get(name) or {}).get("fair")) for name in w.queues]
    w.fair = fair if any(fair) else None
    w.fair_cursors = getattr(w, "fair_cursors", {})
    if w.fair is not None and w.flow is not None and not getattr(w, "_fair_warned", False):
        w._fair_warned = True  # set_flow runs twice: at __init__ and at start
        logger.warning(
            "dbqueue worker: fleet-wide limits apply to its queues, so the limited claim takes "
            "the jobs of its fair queues (%s) in priority order, not round-robin by key "
            "(docs/fairness.md)",
            ", ".join(n for n, f in zip(w.queues, fair, strict=True) if f),
        )
    # The queues whose fleet-wide concurrency limit counts their running jobs: a run of
    # theirs past its timeout stays `running` until its thread returns (heartbeat.py).
    w._limited_queues = {
        name for name in w.queues if flow.queue_limits(conf.QUEUES.get(name))[0] is not None
    }
    if w.flow is not None:
        # A job claimed under a fleet-wide limit takes a slot of the whole fleet from its
        # claim on: never claim one ahead of a free thread, where it would wait in our
        # buffer while other workers' threads sit idle. Such a worker does not prefetch.
        w.timing.no_prefetch()
    waiting = getattr(w, "waiting", None)
    if waiting is not None and waiting.mode is not None:
        waiting.mode = waiting_mode(w)


def waiting_mode(w):
    """``"dynamic"``: wait for wake-ups only while the last claim came back short; a worker
    whose claim came back full claims again by itself whenever a thread would go idle
    (with a prefetch of at least its threads, half its slots free means a free thread).
    ``"always"``: a worker without that prefetch (it claims for free threads only, under a
    fleet-wide limit, or by its PREFETCH) wants every wake-up."""
    if w.flow is not None or w.timing.prefetch < w.concurrency:
        return "always"
    return "dynamic"


def start(w):
    """Start the handler pool and the listener."""
    from .apps import DBQueueConfig

    if DBQueueConfig._uses_tasks_backend():
        from .tasks import discover_tasks

        discover_tasks()  # import every app's tasks.py, so @task functions are known
        set_flow(w, w.conf)
    w.pool.start()
    if w.waker is not None:
        w.waker.start(w._on_notify, w.stopped, on_crash=w.fatal)
    elif w.listen and not w.burst and w.session.listen is None:
        w.listener = Listener(
            w.conf.LISTEN_DATABASE or w.using,
            w.conf.NOTIFY_CHANNEL,
            w._on_notify,
            w.stopped,
            on_crash=w.fatal,
            wait_queues=w.queues,
        )
        w.listener.start()
