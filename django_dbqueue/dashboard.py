"""The data of the admin's queue dashboard, read through store functions and shaped for charts.

Finished counts and waits come from the rollup (rollup.py) for the minutes it has counted, and
from the job table itself for the rest (the current minute, or the whole window before any
worker has rolled up), so the page is right on a fresh install and cheap once workers run.
"""

from dataclasses import dataclass, field
from datetime import timedelta

from . import store
from .conf import get_settings
from .rollup import WAIT_BOUNDS

# Hours shown -> seconds per bucket: 60 to 72 points per chart, whichever window.
WINDOWS = {1: 60, 6: 300, 24: 1200}
DEFAULT_HOURS = 1
FINISHED_STATES = ("done", "dead", "cancelled")
TOP_FAILURES = 10
WORKER_LIMIT = 200


@dataclass
class Dashboard:
    hours: int
    step: int  # seconds per bucket
    now: object
    starts: list  # the first instant of each bucket
    finished: dict  # state -> jobs per minute in each bucket
    depth: dict  # queue -> largest due sample in each bucket (None: no sample)
    wait_p50: list  # seconds, None where nothing finished
    wait_p95: list
    failures: list  # [(type, dead, failed_attempts)], most first
    workers: list  # [Worker]
    from_table_since: object  # finished counts from this instant on read the job table
    notes: list = field(default_factory=list)


@dataclass
class Worker:
    id: str
    host: str
    pid: str
    queues: list
    jobs: int
    stuck: int
    heartbeat_age: float


def parse_hours(value):
    """The ``?hours=`` of the page: one of ``WINDOWS``; anything else is the default."""
    try:
        hours = int(value)
    except (TypeError, ValueError):
        return DEFAULT_HOURS
    return hours if hours in WINDOWS else DEFAULT_HOURS


def percentile(histogram, q):
    """The ``q`` quantile (0..1) of waits binned as ``WAIT_BOUNDS`` (``{bin: count}``),
    interpolated inside its bin; the last (open) bin answers its lower bound. None if empty."""
    total = sum(histogram.values())
    if not total:
        return None
    target = q * total
    seen = 0
    for index in sorted(histogram):
        count = histogram[index]
        if count and seen + count >= target:
            low = 0.0 if index <= 0 else WAIT_BOUNDS[min(index, len(WAIT_BOUNDS)) - 1]
            if index >= len(WAIT_BOUNDS):
                return low
            high = WAIT_BOUNDS[index]
            return low + (high - low) * (target - seen) / count
        seen += count
    return None  # not reached: the counts sum to total


def split_worker_id(worker_id):
    """``host:pid:hex`` (worker.make_worker_id) -> ``(host, pid)``; ``(id, "")`` otherwise."""
    host, sep, _hex = worker_id.rpartition(":")
    host2, sep2, pid = host.rpartition(":")
    if sep and sep2 and pid.isdigit():
        return host2, pid
    return worker_id, ""


def build(using=None, hours=DEFAULT_HOURS):
    """Everything the page shows for the last ``hours`` (a key of ``WINDOWS``)."""
    conf = get_settings()
    using = using or conf.DATABASE
    step = WINDOWS[hours]
    window = hours * 3600
    count = window // step
    now, since, split = store.dashboard_clock(using, window=window)
    starts = [since + timedelta(seconds=step * i) for i in range(count)]
    per_minute = 60.0 / step

    finished = {state: [0.0] * count for state in FINISHED_STATES}
    by_type = {}
    for bucket, job_type, done, dead, cancelled, failed in store.dashboard_finished(
        using, since=since, split=split, step=step
    ):
        if 0 <= bucket < count:
            for state, n in zip(FINISHED_STATES, (done, dead, cancelled), strict=True):
                finished[state][bucket] += n * per_minute
        if dead or failed:
            entry = by_type.setdefault(job_type, [0, 0])
            entry[0] += dead
            entry[1] += failed

    histograms = [{} for _ in range(count)]
    for bucket, index, n in store.dashboard_waits(
        using, since=since, split=split, step=step, bounds=WAIT_BOUNDS
    ):
        if 0 <= bucket < count and index is not None:
            histograms[bucket][index] = histograms[bucket].get(index, 0) + n

    depth = {name: [None] * count for name in conf.QUEUES}
    for bucket, queue, due, _scheduled, _running in store.dashboard_depth(
        using, since=since, step=step
    ):
        if 0 <= bucket < count:
            depth.setdefault(queue, [None] * count)[bucket] = due

    workers = []
    for worker_id, queues, jobs, stuck, age in store.dashboard_workers(using, limit=WORKER_LIMIT):
        host, pid = split_worker_id(worker_id)
        workers.append(Worker(worker_id, host, pid, list(queues), jobs, stuck, age))

    dashboard = Dashboard(
        hours=hours,
        step=step,
        now=now,
        starts=starts,
        finished=finished,
        depth=depth,
        wait_p50=[percentile(h, 0.5) for h in histograms],
        wait_p95=[percentile(h, 0.95) for h in histograms],
        failures=sorted(
            ((t, d, f) for t, (d, f) in by_type.items()), key=lambda row: (-row[1] - row[2], row[0])
        )[:TOP_FAILURES],
        workers=workers,
        from_table_since=split,
    )
    retention = conf.DONE_RETENTION
    if split <= since and retention is not None and retention < window:
        # No rollup in the window: every count comes from the job table, which has lost what
        # retention deleted. (Once a worker rolls up, its counts outlive the jobs.)
        dashboard.notes.append(
            f"Done jobs are kept {retention:g} s (DONE_RETENTION) and no worker has rolled up "
            "their counts yet: jobs finished before that are missing from the chart."
        )
    if len(workers) == WORKER_LIMIT:
        dashboard.notes.append(f"Only the first {WORKER_LIMIT} workers are listed.")
    return dashboard
