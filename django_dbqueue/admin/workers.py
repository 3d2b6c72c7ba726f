"""The admin's workers page: the worker registry (presence.py), read-only.

Imported by the admin package. It lists the workers that are not expired, as ``jobqueue_status``
does (``presence.live_workers``): host, pid, version, queues, concurrency, execution mode, state
(running, stopping, restarting, or stale: it missed its heartbeats), start, last heartbeat and
the jobs it runs now, which link to those jobs. Nobody adds, changes or deletes a worker here: each worker
writes its own row, and a deleted row would come back at its next heartbeat. Seeing the page
needs the "view worker" permission."""

import threading
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from .. import presence
from ..conf import get_settings
from ..models import WorkerRecord

_shown = threading.local()  # the registry read once per changelist request


class WorkerRecordAdmin(admin.ModelAdmin):
    list_display = (
        "worker_id",
        "host",
        "pid",
        "status_display",
        "queues_display",
        "concurrency",
        "execution",
        "group_display",
        "running_display",
        "heartbeat_display",
        "started_display",
        "version",
    )
    ordering = ("host", "started_at", "worker_id")
    search_fields = ("worker_id", "host")
    actions = None
    readonly_fields = [f.name for f in WorkerRecord._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        # An expired row is a worker that is gone; the next sweep deletes it.
        return super().get_queryset(request).filter(expires_at__gt=Now())

    def changelist_view(self, request, extra_context=None):
        if self.has_view_permission(request):
            shown = presence.live_workers(get_settings().DATABASE)
            _shown.workers = {w.worker_id: w for w in shown}
        extra_context = {
            **(extra_context or {}),
            "title": "Workers",
            "subtitle": (
                f"stale after {presence.stale_after(get_settings().HEARTBEAT_INTERVAL):g}s "
                f"without a heartbeat, gone after "
                f"{presence.expire_after(get_settings().HEARTBEAT_INTERVAL):g}s"
            ),
        }
        return super().changelist_view(request, extra_context)

    def _live(self, obj):
        return getattr(_shown, "workers", {}).get(obj.worker_id)

    @admin.display(description="state")
    def status_display(self, obj):
        live = self._live(obj)
        return live.status if live is not None else obj.state

    @admin.display(description="queues")
    def queues_display(self, obj):
        return ", ".join(obj.queues or [])

    @admin.display(description="group of pid", ordering="group_pid")
    def group_display(self, obj):
        return "-" if obj.group_pid is None else obj.group_pid

    @admin.display(description="started", ordering="started_at")
    def started_display(self, obj):
        return timezone.localtime(obj.started_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="running jobs")
    def running_display(self, obj):
        live = self._live(obj)
        count = live.running if live is not None else obj.running
        if not count:
            return "0"
        url = reverse("admin:django_dbqueue_backgroundjob_changelist")
        query = urlencode({"worker_id": obj.worker_id, "state__exact": "running"})
        return format_html('<a href="{}?{}">{}</a>', url, query, count)

    @admin.display(description="heartbeat", ordering="heartbeat_at")
    def heartbeat_display(self, obj):
        live = self._live(obj)
        if live is None:
            return obj.heartbeat_at
        return f"{live.heartbeat_age:.0f}s ago"


admin.site.register(WorkerRecord, WorkerRecordAdmin)
