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
from .conf import SHARED_FAIR_KEY
from .connections import BUSY_ERRORS, DB_ERRORS, OTHER_DB_ERRORS
from .context import JobContext
from .inflight import BatchRun, Entry
from .outcomes import error_record

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
        except BUSY_ERRORS:
            # A lock wait ran out (a row another transaction holds; the completion locks what
            # it changes with SKIP LOCKED first, so it is rarely one of the completion's): the
            # connection is fine. The successes go their own way, where a held one is put off
            # alone (acks.py), and the claim runs alone: successes that failed it once must not
            # ride on every later claim and fail each of them the same way. (In autocommit the
            # pipeline's transaction rolled back at its Sync; the connection is idle.)
            _write_done(w, done)
            claimed = w.session.execute(*statement)
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
    rows = _read(w, claimed, token)
    taken = _Taken(rows)
    if w.fair is not None and w.flow is None:
        next_cursors(w.fair_cursors, rows)
    got = len(rows) + len(rows.unreadable)  # every job the claim took, readable or not
    w.timing.claimed(
        time.monotonic(),
        got=got,
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
    if not got:
        w.empty_claims += 1
    w.claimed_total += got
    entries = [_entry(w, row, token, sent) for row in rows]
    if rows.keyed:
        # A keyed job was claimed for a free thread: it goes first (a stable sort keeps the
        # claim's order otherwise), not behind the prefetched ones.
        entries.sort(key=lambda entry: not entry.keyed)
    units = entries
    if (sizes := registry.batch_sizes()) and rows and getattr(w.pool, "runs_batches", False):
        try:
            entries, units = _batches(
                w, entries, sizes, token=token, sent=sent, threads=threads, taken=taken
            )
        except BaseException:
            # The top-up failed after this claim committed: its jobs never reach this worker's
            # books, and the recovery after the reconnect hands them back (recover), unrun;
            # so they do not count against max_jobs (nor do its unreadable ones: handed back
            # unfailed with the rest).
            w.claimed_total -= got
            raise
    w.inflight.add(entries)
    w.pool.submit(units)
    if taken.unreadable:
        fail_unreadable(w, taken.unreadable, token)
    if rows and logger.isEnabledFor(logging.DEBUG):
        logger.debug("dbqueue claimed %d jobs: %s", len(rows), [r.id for r in rows])
    return len(rows), asked


class _Taken:
    """What one claim took under its token so far, top-ups included: the ids (left out of a top-up's
    read back: store.read_claimed), and the rows Python cannot read, failed once the claim is
    through (fail_unreadable)."""

    def __init__(self, rows):
        self.ids = set()
        self.unreadable = []
        self.add(rows)

    def add(self, rows):
        self.ids.update(row.id for row in rows)
        self.ids.update(row.id for row, _ in rows.unreadable)
        self.unreadable.extend(rows.unreadable)


def _read(w, reply, token, known=()):
    """The claimed rows of ``reply``: store.read_claimed (one decode, or row by row when that
    fails: then logged), the unreadable ones in ``rows.unreadable``."""
    rows = store.read_claimed(w.session, reply, worker_id=w.worker_id, token=token, known=known)
    if rows.reread is not None:
        logger.warning(
            "dbqueue worker %s: a claim's reply did not decode (%s: %s); its %d jobs were read "
            "back one by one, %d of them unreadable",
            w.worker_id,
            type(rows.reread).__name__,
            _short(rows.reread),
            len(rows) + len(rows.unreadable),
            len(rows.unreadable),
        )
    return rows


def _short(exc):
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


def fail_unreadable(w, unreadable, token):
    """Fail dead, through the acknowledgement buffer (fenced by ``token``, durable, its error in
    the job's history, the job_dead signal), each ``(row, UnreadableJob)`` of a claim: the job
    never runs and spends only the attempt its claim took. No other job of the claim is
    touched."""
    for row, exc in unreadable:
        ctx = JobContext(row, worker_id=w.worker_id, using=w.using)
        entry = Entry(ctx, token, None, keyed=row.keyed)
        error = error_record(exc, attempt=row.attempt, worker_id=w.worker_id)
        w.acks.fail(entry, error, delay=0.0, dead=True)


def next_cursors(cursors, rows):
    """Update ``cursors`` after a fair claim that returned ``rows``: per fair queue, the key of
    the last place in the walk that a job was claimed from. The jobs with no key at all (NULL,
    served after the walk) move no cursor. A queue nothing was claimed from keeps its cursor."""
    last = {}
    for row in rows:
        placed = row.fair_pos and row.fair_key is not None
        if placed and row.fair_pos > last.get(row.queue, (0, None))[0]:
            last[row.queue] = (row.fair_pos, row.fair_key)
    for queue, (_, key) in last.items():
        cursors[queue] = key
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


def _batches(w, entries, sizes, *, token, sent, threads, taken):
    """Group the claimed jobs of batch types (docs/batches.md) into BatchRuns of up to their
    type's batch_size, each run one unit of work (one thread, one slot). While threads are free,
    a run that is not full is topped up with more due jobs of its type from its queue (the
    top-up claim, store/batches.py), so that a batch fills; never under fleet-wide limits (each
    job a limit counts goes through its claim), nor past a queue's own ``concurrency``, which
    counts a batch's jobs one by one. Returns ``(entries, units)``: every job claimed, and what
    the pool runs, in claim order (a batch where its first job was). ``taken``: what the claim
    took so far (each top-up adds to it)."""
    groups = {}
    for entry in entries:
        if entry.ctx.type in sizes:
            groups.setdefault(entry.ctx.type, []).append(entry)
    if not groups:
        return entries, entries
    running = w.inflight.by_queue()
    for entry in entries:
        running[entry.ctx.queue] = running.get(entry.ctx.queue, 0) + 1
    free_threads = threads
    for job_type, group in groups.items():
        size = sizes[job_type]
        chunks = [group[i : i + size] for i in range(0, len(group), size)]
        last = chunks[-1]
        if len(last) < size and free_threads >= len(chunks) and w.flow is None:
            more = _top_up(
                w, job_type, last[0].ctx.queue, size - len(last), running, token, sent, taken
            )
            last.extend(more)
            entries = entries + more
        free_threads -= len(chunks)
        for chunk in chunks:
            run = BatchRun(chunk)
            for entry in chunk:
                entry.batch = run
    units, seen = [], set()
    for entry in entries:
        if entry.batch is None:
            units.append(entry)
        elif entry.batch not in seen:
            seen.add(entry.batch)
            units.append(entry.batch)
    return entries, units


def _top_up(w, job_type, queue, limit, running, token, sent, taken):
    """Up to ``limit`` more due jobs of ``job_type`` from ``queue``, as entries."""
    cap = (w.conf.QUEUES.get(queue) or {}).get("concurrency")
    if cap is not None:
        limit = min(limit, cap - running.get(queue, 0))
    if w.max_jobs is not None:
        limit = min(limit, w.max_jobs - w.claimed_total)
    if limit <= 0 or w._stop_requested():
        return []
    if w.fair is None or not w.fair[w.queues.index(queue)]:
        rows = _claim_more(w, job_type, queue, limit, token, taken)
    else:
        # A fair queue's top-up goes on round-robin from where the claim left it. It may
        # come back short once every key with a due job of the type has had its share: the
        # rest of the batch is then filled in claim order, from keys that have more.
        rows = _claim_more(
            w, job_type, queue, limit, token, taken, w.fair_cursors.get(queue, SHARED_FAIR_KEY)
        )
        next_cursors(w.fair_cursors, rows)
        if 0 < len(rows) < limit:
            rows = [*rows, *_claim_more(w, job_type, queue, limit - len(rows), token, taken)]
    w.claimed_total += len(rows)
    running[queue] = running.get(queue, 0) + len(rows)
    return [_entry(w, row, token, sent) for row in rows]


def _claim_more(w, job_type, queue, limit, token, taken, fair_cursor=None):
    """One top-up statement (store/batches.py): its claimed rows, added to ``taken`` (a read
    back leaves out what the claim took before, under the same token). Its unreadable rows
    count as claimed."""
    statement = store.claim_more_statement(
        worker_id=w.worker_id,
        queue=queue,
        job_type=job_type,
        limit=limit,
        token=token,
        async_commit=w.async_commit,
        fair_cursor=fair_cursor,
    )
    rows = _read(w, w.session.execute(*statement), token, known=taken.ids)
    taken.add(rows)
    w.claimed_total += len(rows.unreadable)
    return rows


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
    try:
        released, busy = store.hand_back_unknown(
            w.session, worker=w.worker_id, known=known_tokens(w)
        )
    except BUSY_ERRORS as exc:  # a wait past lock_timeout: look again on a later pass
        logger.warning("dbqueue worker: handing back lost claims waited for a lock (%s)", exc)
        return None
    # A job whose row another transaction holds is handed back on a later pass.
    w._reconnected = bool(busy)
    if busy:
        logger.warning(
            "dbqueue worker %s: %d jobs it held without knowing are locked by another "
            "transaction; handing them back later: %s",
            w.worker_id,
            len(busy),
            sorted(busy),
        )
    if released:
        logger.warning(
            "dbqueue worker %s released %d jobs it held without knowing (a claim whose "
            "reply was lost with the connection): %s",
            w.worker_id,
            len(released),
            sorted(released),
        )
    return released


def known_tokens(w):
    """The lease tokens of every job ``w`` holds: its entries and its unwritten outcomes."""
    return w.inflight.tokens() | {token for _, token in w.acks.pending_keys()}


def own_jobs(w):
    """For ``w``'s sweeper: ``(worker id, known_tokens)``; None after a lost connection until
    ``recover`` looked (a lost claim's jobs are handed back there, unspent)."""
    return None if w._reconnected else (w.worker_id, known_tokens(w))
