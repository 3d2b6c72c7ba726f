"""What ``run_jobs()`` returns: one :class:`Run` per handler run, gathered in a :class:`Ran`."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """One handler run: the job, its attempt, and what the run came to (``outcome``): "done",
    "retried", "dead", "cancelled", "snoozed", "waiting" (a durable wait began: ``ctx.sleep``,
    ``ctx.wait_for_signal``), "deferred" (no handler for its type) or "fenced" (its write
    matched nothing). ``result``: the decoded return value of a run that ended "done";
    ``error``: the recorded error of a failed one (class, message, traceback, attempt)."""

    id: int
    type: str
    name: str
    queue: str
    attempt: int
    outcome: str
    result: object = None
    error: dict | None = None
    duration: float | None = None

    def describe(self):
        text = f"#{self.id} {self.name} attempt {self.attempt}: {self.outcome}"
        if self.error:
            text += f" ({self.error.get('class')}: {self.error.get('message')})"
        return text


class Ran:
    """What ``run_jobs()`` did: ``runs`` (every run, in order), by outcome (``done``,
    ``retried``, ``dead``, ``cancelled``, ``snoozed``, ``waiting``: lists of :class:`Run`),
    ``counts`` (outcome -> runs, outcomes that happened only), and ``left``: the jobs of the
    queues (and types) it ran that were not finished when it stopped (:class:`QueuedJob`:
    scheduled for later, back off before a retry, snoozed, in a durable wait, waiting for
    their dependencies, held by a paused queue or a limit)."""

    def __init__(self, runs, left):
        self.runs = runs
        self.left = left

    def _of(self, outcome):
        return [run for run in self.runs if run.outcome == outcome]

    done = property(lambda self: self._of("done"))
    retried = property(lambda self: self._of("retried"))
    dead = property(lambda self: self._of("dead"))
    cancelled = property(lambda self: self._of("cancelled"))
    snoozed = property(lambda self: self._of("snoozed"))
    waiting = property(lambda self: self._of("waiting"))

    @property
    def counts(self):
        counts = {}
        for run in self.runs:
            counts[run.outcome] = counts.get(run.outcome, 0) + 1
        return counts

    def __len__(self):
        return len(self.runs)

    def __iter__(self):
        return iter(self.runs)

    def __repr__(self):
        lines = [f"<Ran {len(self.runs)} runs {self.counts}; {len(self.left)} jobs left"]
        lines += [f"  {run.describe()}" for run in self.runs[-20:]]
        lines += [f"  left: {job.describe()}" for job in self.left[:20]]
        return "\n".join(lines) + ">"
