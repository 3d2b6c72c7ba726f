"""Prometheus metrics: counters from the workers, gauges from the table (the ``[prometheus]`` extra).

Two sources, one exposition:

- **The workers** count what they run: receivers of the job signals (``signals.py``) feed
  counters of jobs started, succeeded, retried and dead, and histograms of run duration and
  queue wait, labelled by type and queue (a ``django.tasks`` job's type label is its task's
  path when the worker knows that task: ``names.label``). They are connected by
  :func:`install`, which ``run_jobqueue --metrics-port`` calls; without it the worker sends its signals to nobody and
  pays nothing. With ``--processes`` every child writes to ``PROMETHEUS_MULTIPROC_DIR`` and the
  parent serves their sum (prometheus_client's multiprocess mode).
- **The table** gives the gauges (depth by queue and state, oldest due job, stuck jobs, dead
  letters, how long a queue has been paused, the live workers from the registry with their
  jobs and heartbeat age, unconfirmed deliveries) from ONE
  statement (``METRICS_SNAPSHOT``, store/metrics.py), run at most once per ``METRICS_CACHE``
  seconds per process on a connection of its own, however often the endpoint is scraped.

Exposed by ``run_jobqueue --metrics-port PORT`` and by :func:`metrics_view` (mount it in your
URLconf; staff with the view permission on jobs, or ``Authorization: Bearer <METRICS_TOKEN>``).
The module imports without prometheus_client, and imports it only when metrics are used: its
multiprocess mode is chosen when it is first imported, and ``run_jobqueue --processes`` must set
``PROMETHEUS_MULTIPROC_DIR`` before that (a URLconf that mounts ``metrics_view`` is imported by
the command's system checks, earlier).
"""

import hmac
import importlib.util
import logging
import os
import threading
import time

from django.http import HttpResponse

from . import signals, store
from .conf import get_settings
from .connections import Session

logger = logging.getLogger("django_dbqueue")

__all__ = ["TableCollector", "exposition_registry", "install", "metrics_view", "serve"]

MISSING = (
    "django-dbqueue's metrics need prometheus-client: pip install 'django-dbqueue[prometheus]'"
)
# Seconds. Waits span a hot queue's milliseconds to a backlog's hours; runs, a no-op to a report.
WAIT_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400)
DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.25, 1, 2.5, 10, 30, 60, 300, 1800)
LABELS = ("type", "queue")


def available():
    """Whether prometheus-client (the ``[prometheus]`` extra) is installed."""
    return importlib.util.find_spec("prometheus_client") is not None


def _client():
    """prometheus_client, imported on first use; RuntimeError saying what to install."""
    try:
        import prometheus_client
    except ImportError:
        raise RuntimeError(MISSING) from None
    return prometheus_client


def multiprocess_dir():
    """The directory of prometheus_client's multiprocess mode, or ``None`` (single process)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


# The workers' counters ----------------------------------------------------------------------------


class _WorkerMetrics:
    """The counters and histograms of one process, fed by the job signals."""

    def __init__(self):
        client = _client()
        c, h = client.Counter, client.Histogram
        self.started = c("dbqueue_jobs_started", "Runs started.", LABELS)
        self.succeeded = c("dbqueue_jobs_succeeded", "Runs that succeeded.", LABELS)
        self.failed = c("dbqueue_jobs_failed", "Runs that failed and will be retried.", LABELS)
        self.dead = c("dbqueue_jobs_dead", "Jobs that went to the dead letters.", LABELS)
        self.cancelled = c(
            "dbqueue_jobs_cancelled", "Claimed jobs that ended cancelled (job_cancelled).", LABELS
        )
        self.duration = h(
            "dbqueue_job_duration_seconds",
            "Seconds a handler ran, by outcome.",
            (*LABELS, "outcome"),
            buckets=DURATION_BUCKETS,
        )
        self.wait = h(
            "dbqueue_job_wait_seconds",
            "Seconds from a job coming due (enqueue, schedule or retry) to its claim.",
            LABELS,
            buckets=WAIT_BUCKETS,
        )

    # The ``type`` label is the signal's ``job_name`` (names.label): the type, or a django.tasks
    # job's task path when the worker knows that task, never a path only a row carries, so the
    # label takes at most one value per job type and @task defined in the code.
    def on_started(self, sender, *, job_type, queue, wait=None, job_name=None, **kwargs):
        name = job_name or job_type
        self.started.labels(name, queue).inc()
        if wait is not None:
            self.wait.labels(name, queue).observe(max(0.0, wait))

    def _outcome(self, counter, outcome, job_type, queue, duration):
        counter.labels(job_type, queue).inc()
        if duration is not None:
            self.duration.labels(job_type, queue, outcome).observe(duration)

    def on_succeeded(self, sender, *, job_type, queue, duration=None, job_name=None, **kwargs):
        self._outcome(self.succeeded, "succeeded", job_name or job_type, queue, duration)

    def on_failed(self, sender, *, job_type, queue, duration=None, job_name=None, **kwargs):
        self._outcome(self.failed, "retried", job_name or job_type, queue, duration)

    def on_dead(self, sender, *, job_type, queue, duration=None, job_name=None, **kwargs):
        self._outcome(self.dead, "dead", job_name or job_type, queue, duration)

    def on_cancelled(self, sender, *, job_type, queue, duration=None, job_name=None, **kwargs):
        self._outcome(self.cancelled, "cancelled", job_name or job_type, queue, duration)


_lock = threading.Lock()
_worker_metrics = None
_table_collector = None


def install():
    """Connect the workers' counters to the job signals (once per process); returns them.

    Call it before the worker starts (``run_jobqueue --metrics-port`` does): in a forked
    ``--processes`` child the receivers are inherited.
    """
    global _worker_metrics
    _client()
    with _lock:
        if _worker_metrics is None:
            metrics = _WorkerMetrics()
            for signal, receiver in (
                (signals.job_started, metrics.on_started),
                (signals.job_succeeded, metrics.on_succeeded),
                (signals.job_failed, metrics.on_failed),
                (signals.job_dead, metrics.on_dead),
                (signals.job_cancelled, metrics.on_cancelled),
            ):
                signal.connect(receiver, weak=False, dispatch_uid=f"dbqueue-metrics-{signal!r}")
            _worker_metrics = metrics
        return _worker_metrics


# The table's gauges -------------------------------------------------------------------------------


class TableCollector:
    """A prometheus_client collector of the table's gauges, from one statement cached for
    ``cache`` seconds (``METRICS_CACHE``). Thread-safe: scrapes that arrive together share one
    query. A failed query is logged and exposed as ``dbqueue_table_up 0``."""

    def __init__(self, using=None, cache=None):
        conf = get_settings()
        self.using = using or conf.DATABASE
        self.cache = conf.METRICS_CACHE if cache is None else cache
        self._session = Session(self.using, prepare=False)
        self._lock = threading.Lock()
        self._rows = None
        self._taken = None  # time.monotonic() of the last query
        self.queries = 0  # statements run, for the tests and the benchmark
        # A --processes child forked after a scrape must not touch (or, exiting, terminate)
        # the parent's connection: it forgets it without closing it. And no child is forked
        # while a scrape's query runs in the parent's HTTP thread: a fork in the middle of its
        # connect copied libpq's locks held, and the child hung in its own first connect
        # (seen in CI: a --processes 2 worker stuck in PQconnectPoll). The fork waits for the
        # query, which is bounded, by taking the lock the query holds.
        os.register_at_fork(
            before=self._lock.acquire,
            after_in_parent=self._lock.release,
            after_in_child=self._after_fork_in_child,
        )

    def _after_fork_in_child(self):
        self._lock = threading.Lock()
        self._session.conn = None

    def snapshot(self):
        """``(rows, ok)``: the cached rows, refreshed when older than ``cache`` seconds."""
        with self._lock:
            now = time.monotonic()
            if self._taken is not None and now - self._taken < self.cache:
                return self._rows, self._rows is not None
            self._taken = now
            try:
                self._rows = store.metrics_snapshot(self._session)
                self.queries += 1
            except Exception:
                self._session.reset()
                self._rows = None
                logger.warning("dbqueue metrics: the table query failed", exc_info=True)
            return self._rows, self._rows is not None

    def close(self):
        with self._lock:
            self._session.close()

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        rows, ok = self.snapshot()
        up = GaugeMetricFamily("dbqueue_table_up", "1 if the last table query succeeded.")
        up.add_metric([], 1.0 if ok else 0.0)
        yield up
        if not ok:
            return
        jobs = GaugeMetricFamily(
            "dbqueue_queue_jobs",
            "Live jobs by queue and state: due (pending, due now), scheduled (pending, later), "
            "suspended (pending, in a durable sleep or wait for a signal), waiting (on workflow "
            "dependencies), running, stuck (running past its lease) and dead.",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "dbqueue_queue_oldest_due_seconds",
            "Age of the oldest due job of the queue (0 when none is due).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "dbqueue_queue_paused_seconds",
            "Seconds since the queue was paused (0 while it is claimed).",
            labels=["queue"],
        )
        held = GaugeMetricFamily(
            "dbqueue_worker_jobs",
            "Running jobs held by each worker in the registry.",
            labels=["worker"],
        )
        beat = GaugeMetricFamily(
            "dbqueue_worker_heartbeat_age_seconds",
            "Seconds since each worker in the registry last sent its heartbeat (it is shown "
            "stale, then gone, when this grows: docs/operations.md#workers).",
            labels=["worker"],
        )
        workers = GaugeMetricFamily(
            "dbqueue_workers",
            "Live workers (in the registry and not stale) serving the queue, by host.",
            labels=["queue", "host"],
        )
        deliveries = GaugeMetricFamily(
            "dbqueue_deliveries",
            "Delivery records by state (recorded: outcome unknown, unconfirmed).",
            labels=["state"],
        )
        queues = {name: {} for name in get_settings().QUEUES}
        for kind, name, label, value in rows:
            if kind == "queue":
                queues.setdefault(name, {})[label] = value
            elif kind == "worker":
                (held if label == "jobs" else beat).add_metric([name], value or 0.0)
            elif kind == "workers":
                workers.add_metric([name, label], value)
            elif kind == "delivery":
                deliveries.add_metric([name], value)
        for name, values in sorted(queues.items()):
            for state in ("due", "scheduled", "suspended", "waiting", "running", "stuck", "dead"):
                jobs.add_metric([name, state], values.get(state) or 0.0)
            oldest.add_metric([name], values.get("oldest_due_seconds") or 0.0)
            paused.add_metric([name], values.get("paused_seconds") or 0.0)
        yield from (jobs, oldest, paused, workers, held, beat, deliveries)


def table_collector():
    """This process's table collector (one, so its cache is shared by every scrape)."""
    global _table_collector
    _client()
    with _lock:
        if _table_collector is None:
            _table_collector = TableCollector()
        return _table_collector


def exposition_registry():
    """The registry to expose: the table's gauges plus this process's counters, or, in
    multiprocess mode, the counters of every process writing to ``PROMETHEUS_MULTIPROC_DIR``."""
    client = _client()
    registry = client.CollectorRegistry(auto_describe=False)
    if multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_DefaultRegistry())
    registry.register(table_collector())
    return registry


class _DefaultRegistry:
    """prometheus_client's default registry (process, platform and our counters) as a collector."""

    def collect(self):
        return _client().REGISTRY.collect()


def serve(port, addr="0.0.0.0"):  # noqa: S104 - a metrics port is meant to be scraped
    """Serve ``/metrics`` on ``port`` from a daemon thread; returns ``(server, thread)``."""
    return _client().start_http_server(port, addr=addr, registry=exposition_registry())


# The Django view ----------------------------------------------------------------------------------


def _allowed(request):
    token = get_settings().METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[7:].encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(
        user is not None
        and user.is_active
        and user.is_staff
        and user.has_perm("django_dbqueue.view_backgroundjob")
    )


def metrics_view(request):
    """The Prometheus text exposition, for your URLconf:
    ``path("metrics/", django_dbqueue.metrics.metrics_view)``.

    Allowed for an active staff user with the "view background job" permission, or for a request
    carrying ``Authorization: Bearer <DBQUEUE["METRICS_TOKEN"]>`` (for a Prometheus server).
    Anything else gets 403 and no data. Without prometheus-client installed it answers 501.
    """
    if not _allowed(request):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    if not available():
        return HttpResponse(MISSING + "\n", status=501, content_type="text/plain")
    client = _client()
    body = client.generate_latest(exposition_registry())
    return HttpResponse(body, content_type=client.CONTENT_TYPE_LATEST)
