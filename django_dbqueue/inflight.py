"""What a worker holds: the jobs it claimed and has not finished, behind one lock.

The claim loop adds entries, the handler pool starts and finishes them, the heartbeat extends the
leases of those still held and marks the ones it lost, the watchdog gives up runs past their
timeout, and shutdown releases what is left. Each of them goes through the narrow methods here;
none touches the table or its lock directly.
"""

import threading
import time
from dataclasses import dataclass


@dataclass(eq=False)
class Entry:
    """One claimed job. ``token`` is the claim's lease token: the fence of every write about it."""

    ctx: object
    token: int
    timeout: float | None
    started: float | None = None  # time.monotonic() when a handler took it
    timed_out: bool = False  # given up by the watchdog: its outcome is discarded
    # A job whose run must never overlap another (a fleet-wide concurrency limit of its queue or
    # type counts it, or it has a serial key): past its timeout it stays ``running``, its lease
    # renewed, while its thread still runs; ``timeout_failure`` is written when the run ends.
    exclusive: bool = False
    # Past its timeout with its lease kept until its run ends (exclusive, or in a child process
    # that is being killed); ``timeout_failure`` is then written by Worker.finished.
    kept_past_timeout: bool = False
    timeout_failure: tuple | None = None  # (error record, retry delay) held for the run's end
    ended: bool = False  # the pool is done with it (Inflight.end)
    lost: bool = False  # the lease went to someone else: never start it, discard its outcome
    released: bool = False  # handed back at shutdown
    busy: bool = False  # the last beat found its row locked by another transaction
    withdrawn: bool = False  # cancelled before it started: never start it; its end is written
    keyed: bool = False  # it has a serial key
    batch: object = None  # the BatchRun it runs in (a batch type's job), or None

    @property
    def given_up(self):
        """This worker no longer speaks for the job: nothing it does about it is written."""
        return self.timed_out or self.lost or self.released or self.withdrawn

    @property
    def holds_lease(self):
        """This worker still holds the job's lease: not lost, released or withdrawn, and either
        not timed out or timed out with its failure held until the run ends."""
        if self.lost or self.released or self.withdrawn:
            return False
        return not self.timed_out or self.kept_past_timeout

    @property
    def key(self):
        return (self.ctx.id, self.token)


@dataclass(eq=False)
class BatchRun:
    """The jobs of a batch type that one handler call runs (docs/batches.md): one unit of work
    for the pool, one slot of the worker. Each job keeps its own Entry (lease, timeout, cancel,
    outcome); the pool gives up or replaces the run's thread once for all of them."""

    entries: list
    abandoned: bool = False  # the watchdog gave up its runs: its thread was replaced (once)
    # The Batch its handler holds, once the call began: at the timeout, the marks made so far
    # are the outcomes of the jobs they name (heartbeat.check_timeouts).
    batch: object = None

    @property
    def ctx(self):  # what the pool's log lines name: the batch's first job
        return self.entries[0].ctx

    @property
    def started(self):
        return min((e.started for e in self.entries if e.started is not None), default=None)


class Inflight:
    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, int], Entry] = {}
        # Per batch held, its entries that still take its slot: a batch takes one slot, as
        # long as one of its jobs does (empty for a worker without batch types).
        self._batches: dict[BatchRun, int] = {}

    def add(self, entries):
        with self._lock:
            for entry in entries:
                self._entries[entry.key] = entry
                if entry.batch is not None:
                    self._batches[entry.batch] = self._batches.get(entry.batch, 0) + 1

    def _unbatch(self, entry):
        left = self._batches.get(entry.batch, 0) - 1
        if left > 0:
            self._batches[entry.batch] = left
        else:
            self._batches.pop(entry.batch, None)

    def remove(self, entry):
        """Forget ``entry``; returns how many entries still occupy a slot."""
        with self._lock:
            popped = self._entries.pop(entry.key, None)
            if popped is not None and entry.batch is not None and not entry.timed_out:
                self._unbatch(entry)
            return self._occupied()

    def _occupied(self):
        # A run the watchdog gave up on keeps its (hung) thread, but the pool replaced that
        # thread, so it no longer takes a slot. A batch takes one slot for all its jobs.
        if self._batches:
            return len(self._batches) + sum(
                1 for e in self._entries.values() if not e.timed_out and e.batch is None
            )
        return sum(1 for e in self._entries.values() if not e.timed_out)

    def occupied(self):
        with self._lock:
            return self._occupied()

    def past_timeout(self):
        """How many runs given up past their timeout keep their lease until they end."""
        with self._lock:
            return sum(1 for e in self._entries.values() if e.kept_past_timeout)

    def __len__(self):
        with self._lock:
            return len(self._entries)

    def by_queue(self):
        """``{queue: slots occupied}``, for the per-queue caps of the claim."""
        counts = {}
        with self._lock:
            for entry in self._entries.values():
                if not entry.timed_out:
                    counts[entry.ctx.queue] = counts.get(entry.ctx.queue, 0) + 1
        return counts

    def held(self):
        """Entries whose lease this worker still holds (``Entry.holds_lease``)."""
        with self._lock:
            return [e for e in self._entries.values() if e.holds_lease]

    def tokens(self):
        """Every lease token this worker knows of, given up or not."""
        with self._lock:
            return {e.token for e in self._entries.values()}

    def snapshot(self):
        with self._lock:
            return list(self._entries.values())

    def mark_lost(self, entries):
        """Mark ``entries`` lost unless they finished meanwhile; returns those really lost."""
        lost = []
        with self._lock:
            for entry in entries:
                if entry.key in self._entries and entry.holds_lease:
                    entry.lost = True
                    entry.ctx._lease_gone = True
                    lost.append(entry)
        return lost

    def expire(self, now=None, *, keep=lambda entry: False):
        """Give up the started runs past their timeout; returns them (now marked ``timed_out``,
        and ``kept_past_timeout`` where ``keep(entry)`` says so)."""
        now = time.monotonic() if now is None else now
        expired = []
        with self._lock:
            for entry in self._entries.values():
                if (
                    entry.timeout
                    and entry.started is not None
                    and not entry.given_up
                    and now - entry.started > entry.timeout
                ):
                    entry.timed_out = True
                    if entry.batch is not None:
                        self._unbatch(entry)
                    entry.kept_past_timeout = keep(entry)
                    # Written as failed now: a step the run reaches is not run (steps.stored).
                    entry.ctx._lease_gone = not entry.kept_past_timeout
                    expired.append(entry)
        return expired

    def hold_failure(self, entry, failure):
        """Keep ``failure`` for ``entry``'s end (Worker.finished writes it). Returns False when
        the run has ended already: then the caller writes it."""
        with self._lock:
            if entry.ended or entry.key not in self._entries:
                return False
            entry.timeout_failure = failure
            return True

    def end(self, entry):
        """``entry``'s run has ended (or it never started): returns the timeout failure held for
        it (``hold_failure``), None when there is none; none can be held from now on. The
        entry stays until ``remove``, so that the failure is buffered before it is gone."""
        with self._lock:
            entry.ended = True
            return entry.timeout_failure

    def cancel(self, ids):
        """The cancel of the jobs ``ids`` was asked for. Returns ``(running, withdrawn)``: the
        started entries not told yet (their handlers are to be told), and the entries not
        started, now withdrawn (never started; the caller writes their end)."""
        ids = set(ids)
        running, withdrawn = [], []
        with self._lock:
            for entry in self._entries.values():
                if entry.ctx.id not in ids or entry.given_up:
                    continue
                if entry.started is None:
                    entry.withdrawn = True
                    withdrawn.append(entry)
                elif not entry.ctx.cancelled:
                    running.append(entry)
        return running, withdrawn

    def start(self, entry):
        """A handler takes ``entry``. Returns False when it must not run (lost, released or
        withdrawn)."""
        with self._lock:
            if entry.given_up:
                return False
            entry.started = time.monotonic()
            return True

    def release_unstarted(self):
        """Mark every entry not started yet as released; returns them."""
        with self._lock:
            entries = [e for e in self._entries.values() if e.started is None and not e.given_up]
            for entry in entries:
                entry.released = True
        return entries

    def release_all(self, runs_are_killed=False):
        """After the shutdown grace: mark every entry still held as released, except the runs
        that must not be handed back while they may still run: an exclusive job a handler still
        runs (a second run could start beside it), and a run past its timeout whose failure
        waits for its end. Those stay ``running`` and are written when they end, or taken back
        when their lease expires after the process is gone. With ``runs_are_killed`` (process
        mode: every run's child is killed, and gone, before the release) only the runs past
        their timeout are not released: their attempts count, and their failures are written
        once their children are dead (Worker.finished), not handed back with the attempt given
        back. Returns ``(released, kept)``; ``kept`` without those of process mode."""
        with self._lock:
            held = [e for e in self._entries.values() if e.holds_lease]
            kept = [
                e
                for e in held
                if not runs_are_killed and e.started is not None and (e.exclusive or e.timed_out)
            ]
            # A run past its timeout is a spent attempt, whatever the mode.
            released = [e for e in held if e not in kept and not e.kept_past_timeout]
            for entry in released:
                entry.released = True
                entry.ctx._lease_gone = True
        return released, kept
