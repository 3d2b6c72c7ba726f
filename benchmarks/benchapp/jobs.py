"""Job types of the benchmark, discovered by django_dbqueue like any app's ``jobs.py``."""

import queue
import time

from django_dbqueue import job

# (seq, perf_counter at handler start) of every "bench-wakeup" run, for the latency test.
STARTED: queue.SimpleQueue = queue.SimpleQueue()


@job("bench-noop")
def noop(ctx):
    """Does nothing: the drain measures the queue, not the work."""


@job("bench-wakeup")
def record_start(ctx):
    """Records when the handler started, first thing, so latency ends here."""
    started = time.perf_counter()
    STARTED.put((ctx.payload["seq"], started))


@job("bench-sleep")
def sleep(ctx):
    """Sleeps ``payload["sleep"]`` seconds: a job that takes time, as real work does."""
    time.sleep(ctx.payload["sleep"])


from . import batch_jobs, step_jobs, wait_jobs  # noqa: E402, F401 - the types of benchmarks/steps.py, waits.py
