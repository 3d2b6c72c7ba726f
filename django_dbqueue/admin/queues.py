"""The admin's queue page (flow control): which queues are paused, how many slots of a
fleet-wide limit are in use, when a rate window reopens; pause and resume.

Imported by the admin package. Pausing and resuming need the queue model's change permission;
they go through ``flow.pause_queue``/``flow.resume_queue``, like the command and the API."""

import threading

from django.contrib import admin, messages

from .. import flow, store
from ..conf import get_settings
from ..models import QueueState

_shown = threading.local()  # the flow state read once per changelist request


class QueueStateAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "state_display",
        "running_display",
        "rate_display",
        "reopens_display",
        "changed_at",
        "changed_by",
    )
    ordering = ("name",)
    actions = ("pause", "resume")
    readonly_fields = ("name", "paused", "changed_at", "changed_by")

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        # The change permission is what Pause and Resume need (checked with obj=None), but a
        # queue's own page must never save: its Save would write back a paused flag read before
        # someone else's pause or resume. The page is read-only; the actions change queues.
        if obj is not None:
            return False
        return super().has_change_permission(request, obj)

    def changelist_view(self, request, extra_context=None):
        using = get_settings().DATABASE
        store.ensure_queues(using, list(get_settings().QUEUES))  # a row per configured queue
        _shown.flows = {q.name: q for q in flow.queue_flows(using)}
        return super().changelist_view(request, extra_context)

    def _flow(self, obj):
        return getattr(_shown, "flows", {}).get(obj.name)

    @admin.display(description="state")
    def state_display(self, obj):
        return "paused" if obj.paused else "active"

    @admin.display(description="running / limit")
    def running_display(self, obj):
        q = self._flow(obj)
        if q is None:
            return "-"
        return f"{q.running} / {q.global_concurrency or '∞'}"

    @admin.display(description="rate limit")
    def rate_display(self, obj):
        q = self._flow(obj)
        if q is None or q.rate_limit is None:
            return "-"
        rate = q.rate_limit
        per = f" per {rate['key']}" if rate["key"] else ""
        return f"{rate['limit']} / {rate['period']:g}s{per}"

    @admin.display(description="rate window reopens")
    def reopens_display(self, obj):
        q = self._flow(obj)
        return "-" if q is None or q.rate_reopens_at is None else q.rate_reopens_at

    def _switch(self, request, queryset, func, verb):
        known = get_settings().QUEUES
        names = [n for n in queryset.values_list("name", flat=True)]
        done = [n for n in names if n in known]
        who = f"admin:{request.user.get_username()}"[:200]  # as the cancel action records it
        for name in done:
            func(name, by=who)
        if done:
            self.message_user(request, f"{verb} {', '.join(done)}.", messages.SUCCESS)
        skipped = sorted(set(names) - set(done))
        if skipped:
            self.message_user(
                request,
                f"Left alone {', '.join(skipped)}: not in DBQUEUE['QUEUES'].",
                messages.WARNING,
            )

    @admin.action(description="Pause (no worker claims their jobs)", permissions=["change"])
    def pause(self, request, queryset):
        self._switch(request, queryset, flow.pause_queue, "Paused")

    @admin.action(description="Resume (and wake the workers)", permissions=["change"])
    def resume(self, request, queryset):
        self._switch(request, queryset, flow.resume_queue, "Resumed")


admin.site.register(QueueState, QueueStateAdmin)
