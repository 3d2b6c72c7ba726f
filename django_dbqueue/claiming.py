"""One claim of the worker's loop: what to ask for, the statement (with the completions that ride
on it), the rows handed to the handler pool; and, after a lost connection, the release of what a
claim whose reply was lost took.

When to claim and how many jobs to ask for is the claim-timing policy's (claim_timing.py); the
SQL is the store's. These functions act on a ``Worker`` (``w``), on its loop's thread.
"""

import logging
import random
import time

from . import registry, store
from .connections import DB_ERRORS, OTHER_DB_ERRORS
from .context import JobContext
from .inflight import Entry

logger = logging.getLogger("django_dbqueue")


def claim(w, done=None):
    """Claim what fits into the free slots and hand it to the handler pool.

    ``done``: successes taken from the acknowledgement buffer (``acks.take_done()``), written in
    the same round trip as the claim (two statements, one pipeline): a busy worker pays one
    round trip per batch, not two. Returns ``(claimed, asked)``.
    """
    occupied = w.inflight.occupied()
    asked = w.timing.free(occupied)
    if w.max_jobs is not None:
        asked = min(asked, w.max_jobs - w.claimed_total)
    if asked <= 0 or w._stop_requested():
        if done:
            _write_done(w, done)
        return 0, 0
    running = w.inflight.by_queue()
    limits = [
        max(0, min(asked, cap - running.get(name, 0)))
        for name, cap in zip(w.queues, w.queue_caps, strict=True)
    ]
    threads = max(0, w.concurrency - occupied)
    token = store.new_token()
    statement = store.claim_statement(
        worker_id=w.worker_id,
        queues=w.queues,
        limits=limits,
        limit=asked,
        token=token,
        async_commit=w.async_commit,
        flow=w.flow,
        # A job with a serial key holds its key from its claim on: only for a free thread.
        threads=threads,
        # Fair queues (docs/fairness.md): taken round-robin by key from where the last claim
        # of this worker left each one.
        fair=w.fair,
        cursors=w.fair_cursors,
    )
    # Before the statement: the lease it takes ends no sooner than LEASE after this instant.
    sent = time.monotonic()
    if done:
        try:
            completed, claimed = w.session.execute_pipelined(
                [w.acks.done_statement(done), statement]
            )
        except DB_ERRORS:
            w.acks.restore_done(done)
            raise
        except OTHER_DB_ERRORS:
            # Not the connection: let the acknowledger narrow it down to the refused write.
            w.session.reset()
            _write_done(w, done)
            claimed = w.session.execute(*statement)
        else:
            w.acks.report_done(w.session, done, store.completed_endings(completed))
    else:
        claimed = w.session.execute(*statement)
    rows = store.claimed_rows(claimed)
    if w.fair is not None and w.flow is None:
        next_cursors(w.fair_cursors, rows)
    w.timing.claimed(
        time.monotonic(),
        got=len(rows),
        asked=asked,
        threads=threads,
        keyed=rows.keyed,
        held=rows.held,
        reopen_in=rows.reopen_in,
        limited=w.flow is not None,
        fair=w.fair is not None and w.flow is None,
        # A little jitter, so that the fleet's workers do not all come at the same instant.
        jitter=random.uniform(0.0, 0.02),
    )
    w.claims += 1
    if not rows:
        w.empty_claims += 1
    w.claimed_total += len(rows)
    entries = [_entry(w, row, token, sent) for row in rows]
    if rows.keyed:
        # A keyed job was claimed for a free thread: it goes first (a stable sort keeps the
        # claim's order otherwise), not behind the prefetched ones.
        entries.sort(key=lambda entry: not entry.keyed)
    w.inflight.add(entries)
    w.pool.submit(entries)
    if rows and logger.isEnabledFor(logging.DEBUG):
        logger.debug("dbqueue claimed %d jobs: %s", len(rows), [r.id for r in rows])
    return len(rows), asked


def next_cursors(cursors, rows):
    """Update ``cursors`` after a fair claim that returned ``rows``: per fair queue, the key of
    the last place in the walk that a job was claimed from ('' for the jobs without a key: the
    next walk starts again at the first key). A queue nothing was claimed from keeps its cursor."""
    last = {}
    for row in rows:
        if row.fair_pos and row.fair_pos > last.get(row.queue, (0, None))[0]:
            last[row.queue] = (row.fair_pos, row.fair_key)
    for queue, (_, key) in last.items():
        cursors[queue] = "" if key is None else key
    return cursors


def _entry(w, row, token, sent):
    job_type = registry.get(row.type)
    ctx = JobContext(row, worker_id=w.worker_id, using=w.using)
    ctx._renewed = sent
    return Entry(
        ctx,
        token,
        timeout_of(job_type),
        keyed=row.keyed,
        # Its run must never overlap another that the same limit or key counts.
        exclusive=row.keyed
        or row.queue in w._limited_queues
        or (job_type is not None and job_type.global_concurrency is not None),
    )


def timeout_of(job_type):
    """When the watchdog gives up a run of ``job_type``, in seconds (None: never)."""
    if job_type is None or not job_type.timeout:
        return None
    if job_type.is_async:
        # The coroutine is cancelled at its timeout; the watchdog steps in only when its
        # event loop is blocked and cancelling cannot work.
        return job_type.timeout + max(1.0, 0.1 * job_type.timeout)
    return job_type.timeout


def _write_done(w, done):
    """Write ``done`` on its own (the acknowledger's usual path, with its retries)."""
    w.acks.restore_done(done)
    w.acks.flush_once(w.session)


def recover(w):
    """After a lost connection: hand back jobs this worker holds but never heard of (a claim
    that committed while its reply was lost). First the lost connection's backend is ended and
    seen gone, so that a claim it was still running has committed or rolled back: one that
    commits after the release looked would hold its jobs until their lease runs out. Returns
    the ids released, or None when that backend is not gone yet (tried again on the next pass).
    """
    if not w.session.end_lost_backends():
        logger.warning(
            "dbqueue worker %s: its lost database session has not ended yet; releasing the "
            "jobs it may have claimed later",
            w.worker_id,
        )
        return None
    known = w.inflight.tokens() | {token for _, token in w.acks.pending_keys()}
    released = store.release_unknown(w.session, worker=w.worker_id, known=known)
    w._reconnected = False
    if released:
        logger.warning(
            "dbqueue worker %s released %d jobs it held without knowing (a claim whose "
            "reply was lost with the connection): %s",
            w.worker_id,
            len(released),
            sorted(released),
        )
    return released
