"""The queue dashboard's data and charts (the view is the jobs page's ``dashboard_view``)."""

from django.utils import timezone

from .. import charts, dashboard, store
from ..conf import get_settings

DASHBOARD_REFRESH = 30  # seconds between the dashboard page's own reloads


def dashboard_context(request):
    """The dashboard's data and charts for the template (``?hours=1|6|24``)."""
    hours = dashboard.parse_hours(request.GET.get("hours"))
    data = dashboard.build(get_settings().DATABASE, hours)
    labels = [timezone.localtime(start).strftime("%H:%M") for start in data.starts]
    every = max(1, len(labels) // 6)
    finished = charts.stacked_bars(
        "dbq-finished",
        f"Jobs finished per minute by state, last {hours} h",
        [(state, data.finished[state]) for state in dashboard.FINISHED_STATES],
        labels,
        unit="jobs/min",
        every=every,
    )
    depth = charts.lines(
        "dbq-depth",
        f"Queue depth (due jobs) by queue, last {hours} h",
        sorted(data.depth.items()),
        labels,
        unit="jobs",
        every=every,
    )
    waits = charts.lines(
        "dbq-wait",
        f"Wait from due to start, p50 and p95, last {hours} h",
        [("p50", data.wait_p50), ("p95", data.wait_p95)],
        labels,
        unit="seconds",
        every=every,
    )
    failures = charts.horizontal_bars(
        "dbq-failures",
        f"Failures by job type, last {hours} h",
        [(job_type, [dead, failed]) for job_type, dead, failed in data.failures],
        names=["dead letters", "failed attempts"],
        unit="jobs",
    )
    return {
        "dashboard": data,
        "charts": {"finished": finished, "depth": depth, "waits": waits, "failures": failures},
        "windows": sorted(dashboard.WINDOWS),
        "refresh": DASHBOARD_REFRESH,
        "step_minutes": data.step // 60,
        "status": sorted(store.status(get_settings().DATABASE, get_settings().QUEUES).items()),
    }
