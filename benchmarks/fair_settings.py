"""Settings of the ``run_jobqueue`` process that ``benchmarks/fair_queues.py`` starts: those of
``drain_settings.py`` (everything at its defaults) with one fair queue, ``tenants``."""

from benchmarks.drain_settings import *  # noqa: F403

DBQUEUE = {"QUEUES": {"default": {}, "tenants": {"fair": True}}}
