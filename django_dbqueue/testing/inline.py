"""``inline()``: jobs run at the commit that made them, in the committing thread.

While it is active, every statement on the queue's database connection of this thread that
writes jobs (an enqueue, ``enqueue_many``, a workflow, a publish, a schedule's tick, a signal, a
requeue: :data:`WRITES_JOBS`) registers ``transaction.on_commit(run_jobs)``: at the commit, ``run_jobs()`` runs
whatever is due, through the same code as ever. In autocommit that is right after the
statement; inside ``atomic()`` at its commit; inside ``TestCase`` never by itself (nothing
commits there): wrap the code under test in ``self.captureOnCommitCallbacks(execute=True)``
(pytest-django: ``django_capture_on_commit_callbacks(execute=True)``), which runs the hooks at
the end of its block. It is watched with Django's ``connection.execute_wrapper()``; nothing of
the package's own code changes.
"""

import contextlib
import re

from django.db import connections, transaction

from ..jobspec import database
from .runner import run_jobs

# The statements that make jobs due or change them: an enqueue of any kind (INSERT INTO
# dbqueue_job: enqueue, enqueue_many, workflows, publish, the scheduler, the Tasks backend; an SQL
# enqueue function: dbqueue_enqueue(), dbqueue_enqueue_many(), dbqueue_debounce()), a signal
# (INSERT INTO dbqueue_signal), a requeue, a run now or a cancel (UPDATE dbqueue_job). Reads
# never are.
WRITES_JOBS = re.compile(
    r"INSERT\s+INTO\s+dbqueue_(?:job|signal)\b|UPDATE\s+dbqueue_job\b"
    r"|dbqueue_(?:enqueue|enqueue_many|debounce)\s*\(",
    re.IGNORECASE,
)


class Inline:
    """The inline mode of one database alias on this thread; ``ran``: what each commit ran
    (one :class:`~django_dbqueue.testing.Ran` per run)."""

    def __init__(self, using, queues=None, types=None):
        self.using, self.queues, self.types = using, queues, types
        self.ran = []
        self._running = False
        self._generation = 0  # bumped by each run: older hooks of the same commit do nothing

    def __call__(self, execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not self._running and WRITES_JOBS.search(sql):
            generation = self._generation
            transaction.on_commit(lambda: self._committed(generation), using=self.using)
        return result

    def _committed(self, generation):
        # The hooks one transaction registered run one after the other at its commit: the
        # first runs the jobs, the others find the generation moved on.
        if self._running or generation != self._generation:
            return
        self._generation += 1
        self._running = True
        try:
            self.ran.append(run_jobs(self.queues, self.types, using=self.using))
        finally:
            self._running = False

    @property
    def runs(self):
        """Every run of every commit, in order."""
        return [run for ran in self.ran for run in ran.runs]


@contextlib.contextmanager
def inline(queues=None, types=None, *, using=None):
    """Run jobs at the commit that enqueued them, in the committing thread, while inside
    (see the module's doc). Yields an :class:`Inline` whose ``ran`` lists what ran.

    It exercises the handlers, the outcomes and whatever the jobs enqueue in turn; it does
    not exercise what makes a worker a worker: separate transactions and processes, leases
    and heartbeats, concurrency (SKIP LOCKED between workers, serial keys and limits across
    a fleet), LISTEN and wake-ups, timeouts of sync handlers, retries after their backoff
    (a retried job is not due at the commit: ``run_jobs(advance=...)`` runs it)."""
    alias = database(using)
    mode = Inline(alias, queues, types)
    with connections[alias].execute_wrapper(mode):
        yield mode
