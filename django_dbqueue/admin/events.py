"""The admin's events page (docs/events.md): published events, read-only, each with the jobs it
made; and the link from a job's page to its event.

Nobody adds, changes or deletes an event here: ``publish()`` writes them and the sweeper's
prune deletes the ones no job refers to. Searched by exact id or exact idempotency key; listed
newest first, along the primary key.

The JSON columns (payload, subscribers) are read as text and decoded here, each on its own: a
row written by hand may hold JSON that Python's ``json`` refuses, which the model's fields would
have raised for the whole page; such a value is shown as ``unreadable: <why>`` and the start of
its text, as on a job's page (readable.py)."""

from django.contrib import admin
from django.db.models import TextField
from django.db.models.functions import Cast
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from .. import decoding, store
from ..conf import get_settings
from ..exceptions import UnreadableJob
from ..models import Event
from .common import CappedCountPaginator, exact_search, pre
from .readable import RAW_CHARS, pretty

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

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .defer("payload", "subscribers")
            .annotate(
                payload_text=Cast("payload", TextField()),
                subscribers_text=Cast("subscribers", TextField()),
            )
        )

    @admin.display(description="subscribers")
    def subscribers_display(self, obj):
        try:
            subscribers = decoding.json_value(obj.subscribers_text, "subscribers")
        except UnreadableJob as exc:
            return f"unreadable: {exc.reason}"
        if not isinstance(subscribers, list):
            return f"not a list: {_cut(obj.subscribers_text)}"
        return ", ".join(map(str, subscribers)) or "none (no job was made)"

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        try:
            payload = decoding.json_value(obj.payload_text, "payload")
        except UnreadableJob as exc:
            return format_html("<p>unreadable: {}</p>{}", exc.reason, pre(_cut(obj.payload_text)))
        shown = pretty(payload)
        return pre(shown if shown is not None else _cut(obj.payload_text))

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


def _cut(text):
    text = text or ""
    return text if len(text) <= RAW_CHARS else text[:RAW_CHARS] + f"... ({len(text):,} characters)"


admin.site.register(Event, EventAdmin)
