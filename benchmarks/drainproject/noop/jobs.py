"""The drain project's one job type: ``noop`` reads its key and records when it ran.

Each handler appends ``(time.time(), key)`` to this process's buffer, which is written to
``$DRAIN_PROJECT_RECORDS/<pid>.txt`` every ``FLUSH_EVERY`` records and when the process exits.
``benchmarks/drain_project.py`` reads those files: the drain starts at the first record (the
handler's own wall clock), and every key must be there exactly once.
"""

import atexit
import os
import time

from django_dbqueue import job

from .records import Buffer

BUFFER = Buffer(os.environ.get("DRAIN_PROJECT_RECORDS"))
atexit.register(BUFFER.flush)


@job("noop")
def noop(ctx):
    """Reads the payload's key and records (now, key)."""
    BUFFER.add(time.time(), ctx.payload["key"])
