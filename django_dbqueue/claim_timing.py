"""When the worker claims next, and how many jobs it asks for: the claim-timing policy.

The worker's loop (worker.py) asks this object, and only this object, whether to claim now. It
holds no connection, no thread and no clock of its own: every method is given what it needs
(what just finished, how many slots are occupied, what the last claim returned, the time) and
only reads and writes the few fields below, so tests/unit/test_claim_timing.py drives every rule
without a database.

The rules, in one place:

* **How many.** A worker has ``concurrency`` handler threads plus ``prefetch`` slots for jobs
  claimed ahead of a free thread; it asks for what is free (``free``). Without a PREFETCH
  setting the prefetch adapts: it starts at the concurrency, doubles (up to 4x) while a full
  claim finds threads that starved waiting for it, and falls back to the concurrency as soon as
  a claim comes back short (``adapt``). Under a fleet-wide limit there is no prefetch at all
  (``no_prefetch``): such a job takes a slot of the whole fleet from its claim on.
* **Claim at once** (``claim_next``): at start, after a wake-up or a lost connection, after a
  claim that came back full (there may be more), and when a finishing handler says so.
* **A finishing handler makes the claim due** (``finished``) when: the slots were full of a
  backlog (``want_capacity``) and half of them (``min_batch``) are free again, so a real batch
  fits rather than one job per round trip; a wake-up came while every thread was busy
  (``missed``) and a thread is free now; a fleet-wide limit held the last claim back (``held``)
  and this job's slot may be ours again; a job with a serial key ended (``keyed_ended``) and
  half the threads or all of them are free, since its key's next job may now be claimable and
  nothing else says so (``keyed_due``); or, in a burst run, the worker went idle.
* **A short claim** means the queue was empty then: wait for a wake-up or the poll. Except when
  the plain claim left keyed jobs out for want of free threads (``cut``): that is a backlog
  too, waited out like a full claim, on capacity.
* **The poll** (``next_poll``) is the backstop: ``poll_interval`` after each claim; sooner when a
  rate window reopens (``reopen_at``, with a little jitter so the fleet does not come at once),
  when a job this worker failed comes due again, when the wake-up registration must be retried
  (the worker calls ``poll_by``), and within half a second after a claim that wants capacity.
* **A burst run** ends on a claim that asked for work, found none, with nothing in flight,
  nothing held back by a limit and every outcome written (``after_result`` says DRAINED).

Fields are read and written from the loop's thread and from handler threads (``finished``) as
plain attributes, as the loop always did: each write is one attribute, and the loop re-reads
them at every pass.
"""

AGAIN = "again"  # claim again at once
WAIT = "wait"  # sleep until a wake-up, a finish or the poll
DRAINED = "drained"  # a burst run is done


class ClaimTiming:
    """The claim-timing state of one worker and the rules over it (see the module docstring)."""

    def __init__(self, *, concurrency, prefetch=None, poll_interval, burst=False):
        self.concurrency = concurrency
        self.adaptive = prefetch is None
        self.prefetch = concurrency if prefetch is None else prefetch
        self.prefetch_max = 4 * concurrency if prefetch is None else prefetch
        self.poll_interval = poll_interval
        self.burst = burst
        self.starved = 0  # times a handler thread found no job waiting
        self.claim_next = True  # claim at once: at start, after a notification, when capacity
        self.keyed_due = False  # ... and at once when keyed jobs ended (finished)
        self.keyed_ended = False  # a keyed job ended since the last claim
        self.cut = False  # the last claim left keyed jobs out for want of free threads
        self.held = False  # a fleet-wide concurrency limit held the last claim back
        self.reopen_at = None  # ... or a rate window, which reopens then
        self.want_capacity = False  # the last claim came back full (or cut): a backlog
        self.missed = False  # a wake-up for us came while every thread was busy: claim later
        self.next_poll = 0.0  # ... or at the latest at the poll

    # -- how many ---------------------------------------------------------------------------
    def no_prefetch(self):
        """Claim for free threads only (a fleet-wide limit applies)."""
        self.adaptive = False
        self.prefetch = self.prefetch_max = 0

    def free(self, occupied):
        """The slots free for a claim while ``occupied`` are taken."""
        return self.concurrency + self.prefetch - occupied

    @property
    def min_batch(self):
        """A claim worth its round trip: half the slots."""
        return max(1, (self.concurrency + self.prefetch) // 2)

    def adapt(self, claimed, asked):
        """Grow the prefetch after a full claim that threads starved for; drop it after a short
        one."""
        if not self.adaptive or not asked:
            return
        if claimed < asked:
            self.prefetch = self.concurrency  # the backlog is gone: hold no more than needed
        elif self.starved:
            self.prefetch = min(self.prefetch_max, self.prefetch * 2)
        self.starved = 0

    # -- when -------------------------------------------------------------------------------
    def due(self, now):
        """Whether the loop claims on this pass."""
        return self.claim_next or now >= self.next_poll

    def wake(self):
        """Claim on the next pass: a wake-up (or a lost connection, which may have missed some)."""
        self.claim_next = True

    def poll_by(self, at):
        """Claim at ``at`` at the latest."""
        self.next_poll = min(self.next_poll, at)

    def before_claim(self):
        """Before the completions that ride on the claim are taken: a keyed job that ends after
        this marks the next claim due again."""
        self.keyed_ended = False

    def claiming(self):
        """The claim runs now: what made it due is spent."""
        self.claim_next = self.keyed_due = False

    def claimed(
        self, now, *, got, asked, threads, keyed, held, reopen_in, limited, jitter=0.0, fair=False
    ):
        """A claim that asked for ``asked`` returned ``got`` jobs (``keyed`` of them with a serial
        key), with ``threads`` free; ``held``/``reopen_in`` say what a fleet-wide limit did
        (``limited``: the claim ran under one; ``fair``: the fair claim, store/fair.py, whose
        batch comes back short when its keys hold fewer jobs than their share)."""
        self.held = held
        self.reopen_at = None if reopen_in is None else now + reopen_in + jitter
        # A short batch may not mean an empty queue: the plain claim leaves out the keyed jobs
        # beyond the free threads (all of them when none is free). When it may have, claim
        # again as capacity frees up rather than wait for a notification.
        self.cut = (
            not limited and got < asked and (threads == 0 or keyed >= threads or (fair and got))
        )
        self.adapt(asked if self.cut else got, asked)

    def after_claim(self, claimed, asked):
        """Whether the slots want capacity (a backlog) after a claim: it asked for nothing, came
        back full, or keyed jobs cut it short."""
        self.want_capacity = asked == 0 or claimed == asked or self.cut
        return self.want_capacity

    def poll_from(self, now):
        """The next poll, counted from the claim just made (sooner if a rate window reopens)."""
        self.next_poll = now + self.poll_interval
        if self.reopen_at is not None:
            self.next_poll = min(self.next_poll, self.reopen_at)

    def after_result(self, now, *, claimed, asked, occupied, acks_pending):
        """What the loop does after a claim: AGAIN, WAIT or (a burst run) DRAINED."""
        # A burst run ends when a claim that asked for work found none, nothing is in flight
        # and every outcome is written. (A claim that asked for nothing, because every slot
        # was busy, proves nothing about the queue; nor does one that a fleet-wide limit held
        # back: it waits for its poll or the window.)
        if (
            self.burst
            and asked
            and claimed == 0
            and not occupied
            and not self.held
            and self.reopen_at is None
        ):
            if not acks_pending:
                return DRAINED
            self.claim_next = True
            return AGAIN
        # (A batch that keyed jobs cut short means a backlog too, as want_capacity says;
        # claiming again at once would only meet the same keys, so wait for capacity like a
        # full one.)
        if asked and claimed == asked:
            self.claim_next = True
            return AGAIN  # there may be more: claim again at once
        if self.want_capacity:
            # Full: claim again when a real batch fits (a finishing handler says so), or in
            # half a second whatever fits then.
            self.next_poll = min(self.next_poll, now + 0.5)
        return WAIT

    def reportable_free(self, free):
        """The free slots to tell a supervisor's group listener: none while a backlog waits for
        a batch's worth."""
        return free if not self.want_capacity or free >= self.min_batch else 0

    def due_for_acks(self, free):
        """Whether a claim is due that buffered completions can ride on (so do not wait for
        more of them)."""
        if (self.claim_next and free) or self.keyed_due:
            return True
        if free >= self.min_batch and self.want_capacity:
            self.claim_next = True  # due, though no finish said so since the last claim
            return True
        return False

    def finished(self, *, keyed, occupied):
        """A handler ended (``keyed``: its job had a serial key), leaving ``occupied`` slots taken.
        Returns whether the claim is due now (wake the loop). Waking on every finish would claim
        one job at a time; after a claim that came back short the queue was empty then, and a
        new job announces itself."""
        free = self.concurrency + self.prefetch - occupied
        # Keyed jobs are claimed for free threads only: claim when half of them are free (a
        # batch, not a round trip per job) or nothing is left.
        self.keyed_ended = self.keyed_ended or keyed  # until the next claim
        keyed_due = self.keyed_ended and (
            not occupied or self.concurrency - occupied >= (self.concurrency + 1) // 2
        )
        missed = self.missed and occupied < self.concurrency
        if missed:
            self.missed = False
        if (
            missed  # a wake-up came while every thread was busy: claim for it now
            or (self.want_capacity and free >= self.min_batch)
            or (self.burst and not occupied)
            or self.held  # a fleet-wide limit was full: this job's slot may be ours again
            or keyed_due
        ):
            self.keyed_due = self.keyed_due or keyed_due
            self.claim_next = True
            return True
        return False

    def keep_wakeup(self, occupied):
        """A wake-up for this worker came while every thread was busy: claim once a thread frees
        (``finished``). ``occupied`` (a callable) is read after the flag is set, so a thread that
        freed just before, whose ``finished`` could not see the flag, is not missed: returns True
        then (claim now, the flag taken back)."""
        self.missed = True
        if occupied() >= self.concurrency:
            return False
        self.missed = False
        return True
