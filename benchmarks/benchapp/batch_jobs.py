"""The batch type of ``benchmarks/batch_handlers.py``: a no-op over a batch of up to 100 jobs.

Registered only where the package knows ``batch_size`` (``benchmarks/against.py`` runs today's
benchmarks against older trees too)."""

import inspect

from django_dbqueue import job

if "batch_size" in inspect.signature(job).parameters:

    @job("bench-batch-noop", batch_size=100)
    def batch_noop(batch):
        """Does nothing with its jobs: the drain measures the queue, not the work."""
