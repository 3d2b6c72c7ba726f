"""Our side of ``benchmarks/celery_compare.py``: the one job type, ``bench-counted``.

It does what the Celery side's task does (``benchmarks/celery_tasks.py``): nothing, between a
:func:`~benchmarks.celery_count.started` and a :func:`~benchmarks.celery_count.finished` that
count its run under the key ``payload["i"]``. The type is registered by this app's ``ready()``
(``INSTALLED_APPS`` entry ``benchmarks.celery_jobs.CountedJobs``, in
``benchmarks/celery_settings.py``), or by :func:`register` in the harness's own process.
"""

from django.apps import AppConfig

from benchmarks import celery_count

TYPE = "bench-counted"


def counted(ctx):
    """Does nothing but count its run."""
    key = ctx.payload["i"]
    celery_count.finished(key, celery_count.started(key))


def register():
    from django_dbqueue import job

    job(TYPE)(counted)


class CountedJobs(AppConfig):
    name = "benchmarks.celery_jobs"
    label = "bench_celery_jobs"

    def ready(self):
        register()
