"""The Celery side of ``benchmarks/celery_compare.py``: the app, laid out as Celery's Django guide
lays it out, and its one task. Imported only in the benchmark's own venv (``.venvs/bench-celery``),
by the workers (``celery -A benchmarks.celery_tasks worker``) and the producers.

The settings are Django's (``benchmarks/celery_settings.py``, ``CELERY_`` namespace), so Celery
installs its Django fix-up as in a Django project: the task class is ``DjangoTask``
(``delay_on_commit``) and the worker closes unusable database connections around each task.
"""

import os
from pathlib import Path

from celery import Celery
from celery.signals import worker_ready

from benchmarks import celery_count

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.celery_settings")
os.environ.setdefault("DBQUEUE_BENCH_SIDE", "celery")

app = Celery("dbqueue_bench")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(name="bench.counted")
def counted(key):
    """Does nothing but count its run, as our ``bench-counted`` job does."""
    celery_count.finished(key, celery_count.started(key))


@worker_ready.connect
def say_ready(sender=None, **kwargs):
    """Tell the harness that this worker consumes: a file ``ready-<pid>`` beside the counts."""
    directory = os.environ.get(celery_count.COUNT_DIR)
    if directory:
        (Path(directory) / f"ready-{os.getpid()}").touch()
