"""The admin's events page (docs/events.md): published events, read-only, each with the jobs it
made; and the link from a job's page to its event.

Nobody adds, changes or deletes an event here: ``publish()`` writes them and the sweeper's
prune deletes the ones no job refers to. Searched by exact id or exact idempotency key; listed
newest first, along the primary key."""

import json

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from .. import store
from ..conf import get_settings
from ..models import Event
from .common import CappedCountPaginator, exact_search, pre

JOBS_SHOWN = 100  # an event's jobs listed on its page (one per subscriber: rarely more)


def event_link(obj):
    """The job's event, linked to its page, or a dash for a job no publish made."""
    if obj.event_id is None:
        return "-"
    row = store.event(get_settings().DATABASE, obj.event_id)
    url = reverse("admin:django_dbqueue_event_change", args=[obj.event_id])
    if row is None:  # pruned: no job refers to it any more, except this one's stale id
        return format_html("event #{} (deleted)", obj.event_id)
    return format_html('<a href="{}">{} #{}</a>', url, row[0], obj.event_id)


def _job_url(job_id):
    return reverse("admin:django_dbqueue_backgroundjob_change", args=[job_id])


class EventAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "idempotency_key", "subscribers_display", "published_at"]
    search_fields = ["idempotency_key"]
    search_help_text = "An event id or an exact idempotency key."
    ordering = ["-id"]
    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    actions = None
    readonly_fields = [
        "id",
        "name",
        "idempotency_key",
        "published_at",
        "subscribers_display",
        "payload_pretty",
        "jobs_display",
    ]
    fields = readonly_fields

    def has_add_permission(self, request):
        return False  # events are created by publish(), which validates them

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_search_results(self, request, queryset, search_term):
        return exact_search(queryset, search_term, "idempotency_key"), False

    @admin.display(description="subscribers")
    def subscribers_display(self, obj):
        return ", ".join(obj.subscribers) or "none (no job was made)"

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return pre(json.dumps(obj.payload, indent=2, ensure_ascii=False))

    @admin.display(description="jobs")
    def jobs_display(self, obj):
        """The jobs that refer to the event, with their states, each linked to its page."""
        rows = store.event_jobs(get_settings().DATABASE, obj.pk)[:JOBS_SHOWN]
        if not rows:
            return "none left (never any subscriber, or pruned by retention)"
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                '<li><a href="{}">#{}</a> {} on {}: {} (attempts {})</li>',
                (
                    (_job_url(job_id), job_id, job_type, queue, state, attempts)
                    for job_id, job_type, queue, state, attempts in rows
                ),
            ),
        )


admin.site.register(Event, EventAdmin)
