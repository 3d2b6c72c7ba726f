"""The jobs page: the list, a job's detail, its actions (requeue, run now, cancel, delete
finished) and the queue dashboard's URL."""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.db.models import Case, CharField, Q, When
from django.db.models.fields.json import KeyTextTransform
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from .. import cancellation, names, store, wakeup
from ..conf import get_settings
from ..models import UNIQUE_HELD, BackgroundJob
from ..states import FINISHED_STATES, JobState
from . import finished_delete, readable
from .common import CappedCountPaginator, exact_search, pre, shorten
from .dashboard_page import dashboard_context
from .events import event_link
from .filters import FlowFilter, QueueFilter, StuckFilter, TypeFilter, live_serial
from .job_steps import steps_html


def _time_column(name, description):
    """The list's and the page's view of the timestamp ``name``: its value, or PostgreSQL's text
    of it, marked, for one Python cannot read back (readable.py); sorted by the column."""

    @admin.display(description=description, ordering=name)
    def show(self, obj):
        return readable.time_of(obj, name)

    return show


class BackgroundJobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "type_display",
        "queue",
        "state",
        "attempts_display",
        "run_after_display",
        "created_at_display",
        "last_error",
    ]
    list_filter = ["state", QueueFilter, TypeFilter, StuckFilter, FlowFilter]
    # Searched by exact id, idempotency key, or unique/serial key of a live job
    # (get_search_results), each served by an index.
    search_fields = ["idempotency_key"]
    search_help_text = (
        "A job id, an exact idempotency key, or the exact unique or serial key of a live job."
    )
    ordering = ["-id"]
    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # per-filter counts would scan the whole table
    list_per_page = 50
    actions = ["requeue", "run_now", "cancel", "delete_finished"]
    readonly_fields = [
        "id",
        "type",
        "queue",
        "state",
        "priority",
        "run_after_display",
        "attempts",
        "max_attempts",
        "lease_seconds",
        "leased_until_display",
        "worker_id",
        "idempotency_key",
        "unique_key",
        "unique_while",
        "unique_held",
        "serial_key",
        "created_at_display",
        "started_at_display",
        "finished_at_display",
        "cancel_requested_at_display",
        "cancelled_by",
        "payload_pretty",
        "result_pretty",
        "errors_pretty",
        "steps_display",
        "snoozes",
        "waiting_for_display",
        "workflow_display",
        "event_display",
    ]
    fieldsets = [
        (None, {"fields": ["id", "type", "queue", "state", "priority", "idempotency_key"]}),
        (
            "Timing",
            {
                "fields": [
                    "created_at_display",
                    "run_after_display",
                    "started_at_display",
                    "finished_at_display",
                ]
            },
        ),
        ("Cancellation", {"fields": ["cancel_requested_at_display", "cancelled_by"]}),
        (
            "Attempts",
            {
                "fields": [
                    "attempts",
                    "max_attempts",
                    "worker_id",
                    "lease_seconds",
                    "leased_until_display",
                ]
            },
        ),
        (
            "Flow control",
            {"fields": ["unique_key", "unique_while", "unique_held", "serial_key"]},
        ),
        ("Data", {"fields": ["payload_pretty", "result_pretty", "errors_pretty"]}),
        ("Steps and waits", {"fields": ["waiting_for_display", "snoozes", "steps_display"]}),
        ("Workflow", {"fields": ["workflow_display"]}),
        ("Published event", {"fields": ["event_display"]}),
    ]
    change_list_template = "admin/django_dbqueue/change_list.html"

    def has_add_permission(self, request):
        return False  # jobs are created by enqueue(), which validates them

    def has_change_permission(self, request, obj=None):
        return False  # state changes go through the actions, never through a form

    def has_requeue_permission(self, request):
        return request.user.has_perm("django_dbqueue.requeue_backgroundjob")

    def has_run_now_permission(self, request):
        return request.user.has_perm("django_dbqueue.run_now_backgroundjob")

    def has_cancel_permission(self, request):
        return request.user.has_perm("django_dbqueue.cancel_backgroundjob")

    # Deleting: finished jobs only (done, dead, cancelled), behind Django's delete permission.
    # A pending or running job is work still to do or under way; cancel it first.

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.state not in FINISHED_STATES:
            return False  # no Delete button, and the delete page refuses
        return super().has_delete_permission(request, obj)

    def get_actions(self, request, action_location=None):
        # Django 6.1 passes action_location (and warns about an override without it); 5.2 doesn't.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)
        actions.pop("delete_selected", None)  # it would delete running jobs: delete_finished
        return actions

    @admin.action(
        description="Delete finished jobs (done, dead or cancelled)", permissions=["delete"]
    )
    def delete_finished(self, request, queryset):
        """Confirm, then delete the finished jobs of the selection only: a page of counts and
        a delete in batches, whatever the selection's size (admin/finished_delete.py)."""
        return finished_delete.action(self, request, queryset)

    def delete_queryset(self, request, queryset):
        deleted = finished_delete.delete(queryset)
        left = queryset.count()
        if left:
            self.message_user(
                request,
                f"{left} job(s) were not deleted: only finished jobs can be deleted.",
                messages.WARNING,
            )
        return deleted

    def delete_model(self, request, obj):
        self._delete_finished(request, [obj.pk])

    def _delete_finished(self, request, ids):
        # One DELETE that re-tests the state, and keeps delivery records' job ids (the ORM's
        # delete would set them to NULL).
        deleted = store.delete_finished(get_settings().DATABASE, ids)
        if len(deleted) < len(ids):
            self.message_user(
                request,
                f"{len(ids) - len(deleted)} job(s) were not deleted: they were requeued or are "
                "gone since they were selected.",
                messages.WARNING,
            )

    def get_queryset(self, request):
        # The payload stays deferred (it can be large); a django.tasks job's task path comes
        # as one short annotation, for the type column. Timestamps and the last error come as
        # annotations that any row can give, even one Python cannot read (readable.py).
        task = Case(
            When(type=names.TASKS_TYPE, then=KeyTextTransform("task", "payload")),
            output_field=CharField(),
        )
        return readable.readable(super().get_queryset(request)).annotate(task_path=task)

    run_after_display = _time_column("run_after", "run after")
    created_at_display = _time_column("created_at", "created at")
    started_at_display = _time_column("started_at", "started at")
    finished_at_display = _time_column("finished_at", "finished at")
    leased_until_display = _time_column("leased_until", "leased until")
    cancel_requested_at_display = _time_column("cancel_requested_at", "cancel requested at")

    def get_search_results(self, request, queryset, search_term):
        found = exact_search(queryset, search_term, "idempotency_key")
        term = search_term.strip()
        if term:
            # Live rows only: the partial indexes of the unique and serial keys hold only those.
            found = found | queryset.filter((Q(unique_key=term) & UNIQUE_HELD) | live_serial(term))
        return found, False

    @admin.display(description="holds its unique key now")
    def unique_held(self, obj):
        """Whether this job is the one an enqueue with its unique key would return now."""
        if obj.unique_key is None:
            return "no unique key"
        never_started = obj.at_started_at is None and obj.text_started_at is None
        held = obj.state in ("pending", "waiting", "running") and (
            obj.unique_while == "active" or never_started
        )
        if held:
            return "yes"
        if obj.state in FINISHED_STATES:
            return f"no: it is {obj.state}"
        return "no: it has started (held only until then, unique_while='pending')"

    @admin.display(description="type", ordering="type")
    def type_display(self, obj):
        """The type, or a ``django.tasks`` job's task path as stored (text: never resolved or
        imported), marked as such."""
        path = getattr(obj, "task_path", None)
        if not path or obj.type != names.TASKS_TYPE:
            return obj.type
        return format_html('{} <span class="quiet">({})</span>', path, names.TASKS_TYPE)

    @admin.display(description="attempts")
    def attempts_display(self, obj):
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="last error")
    def last_error(self, obj):
        # As text from the list's query: never decoded, so no history can fail the page.
        if obj.last_error_class is None and obj.last_error_message is None:
            return ""
        return shorten(f"{obj.last_error_class or ''}: {obj.last_error_message or ''}", 120)

    def _json_html(self, obj, column, **options):
        value, unreadable = readable.json_of(obj, column)
        if unreadable is not None:
            return readable.unreadable_html(obj, column, unreadable)
        text = readable.pretty(value, **options)
        return pre(readable.json_texts(obj)[column] if text is None else text)

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return self._json_html(obj, "payload", sort_keys=True)

    @admin.display(description="result")
    def result_pretty(self, obj):
        if readable.json_texts(obj)["result"] is None:
            return ""
        return self._json_html(obj, "result")

    @admin.display(description="recorded steps")
    @admin.display(description="waiting for")
    def waiting_for_display(self, obj):
        """What a pending job in a durable wait waits for (docs/steps.md), else a dash."""
        from ..steps import waiting_for

        waiting = obj.state == "pending" and obj.wait_token == obj.lease_token
        return waiting_for(obj.wait_reason if waiting else None, obj.at_run_after)

    def steps_display(self, obj):
        """The steps the job recorded (ctx.step), at most job_steps.STEPS_SHOWN of them."""
        return steps_html(obj.pk)

    @admin.display(description="made by the event")
    def event_display(self, obj):
        return event_link(obj)  # docs/events.md

    @admin.display(description="waits on / waited on by")
    def workflow_display(self, obj):
        """The job's neighbours in its workflow (docs/workflows.md), in id order with their
        states: the jobs it waits on, then the jobs waiting on it."""
        rows = store.workflow_neighbours(get_settings().DATABASE, obj.pk)
        if not rows:
            return "not part of a workflow"
        meta = BackgroundJob._meta  # a dead letter's neighbours are jobs of any state
        parts = []
        for relation, title in (("depends_on", "Waits on"), ("dependent", "Waited on by")):
            items = [row for row in rows if row[0] == relation]
            if not items:
                continue
            parts.append(
                format_html(
                    '<div class="dbqueue-workflow"><strong>{}</strong><ol>{}</ol></div>',
                    title,
                    format_html_join(
                        "",
                        '<li><a href="{}">#{} {}</a> — {}{}</li>',
                        (
                            (
                                reverse(
                                    f"admin:{meta.app_label}_{meta.model_name}_change",
                                    args=[job_id],
                                ),
                                job_id,
                                job_type,
                                state,
                                " (runs even if it fails)" if run_on_failure else "",
                            )
                            for _, job_id, job_type, state, run_on_failure in items
                        ),
                    ),
                )
            )
        if obj.state == JobState.WAITING:
            parts.append(format_html("<p>waiting for {} more</p>", obj.waiting_on))
        return format_html_join("", "{}", ((part,) for part in parts))

    @admin.display(description="errors (every failed attempt)")
    def errors_pretty(self, obj):
        errors, unreadable = readable.json_of(obj, "errors")
        if unreadable is not None:
            return readable.unreadable_html(obj, "errors", unreadable)
        if not errors:
            return "none"
        if not isinstance(errors, list):  # written by hand: shown as it is
            return pre(readable.json_texts(obj)["errors"])
        entries = [e if isinstance(e, dict) else {"message": str(e)} for e in errors]
        return format_html_join(
            "",
            '<div style="margin-bottom: 1em"><strong>attempt {} — {}</strong> at {} on {}<br>{}{}</div>',
            (
                (
                    e.get("attempt", "?"),
                    e.get("class", ""),
                    e.get("at", ""),
                    e.get("worker", "") or "?",
                    pre(e.get("message", "")),
                    pre(e.get("traceback", "")) if e.get("traceback") else "",
                )
                for e in entries
            ),
        )

    def changelist_view(self, request, extra_context=None):
        extra_context = dict(extra_context or {})
        try:
            extra_context["dbqueue_status"] = sorted(
                store.status(get_settings().DATABASE, get_settings().QUEUES).items()
            )
        except DatabaseError:  # a slow or failing summary must not take the list down
            extra_context["dbqueue_status"] = None
        return super().changelist_view(request, extra_context)

    def get_urls(self):
        if self.model is not BackgroundJob:  # the dead letters' page inherits this class
            return super().get_urls()
        # Before the model's own URLs, whose "<object_id>/" would take "dashboard/".
        view = self.admin_site.admin_view(self.dashboard_view)
        return [path("dashboard/", view, name="django_dbqueue_dashboard"), *super().get_urls()]

    def dashboard_view(self, request):
        """The queue dashboard: charts of the last hours and the workers holding jobs now."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(
            request,
            "admin/django_dbqueue/dashboard.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.model._meta,
                "title": "Queue dashboard",
                **dashboard_context(request),
            },
        )

    def _report(self, request, verb, moved, selected, refused_why):
        if moved:
            self.message_user(request, f"{verb} {len(moved)} job(s).", messages.SUCCESS)
        refused = len(selected) - len(moved)
        if refused:
            self.message_user(
                request,
                f"{refused} selected job(s) were left alone: {refused_why}.",
                messages.WARNING,
            )

    @admin.action(
        description="Requeue (dead or cancelled → pending, attempts reset)", permissions=["requeue"]
    )
    def requeue(self, request, queryset):
        ids = list(queryset.values_list("id", flat=True))
        using = get_settings().DATABASE
        moved = store.requeue(using, ids)
        wakeup.jobs_ready(using, moved.values())
        left = sorted(set(ids) - set(moved))
        blocked = store.requeue_blocked(using, left) if left else []
        for job_id, key, holder, state in blocked:
            self.message_user(
                request,
                f"Job #{job_id} was not requeued: its unique key {key!r} is held by job "
                f"#{holder} ({state}). Requeue it once that job has finished.",
                messages.WARNING,
            )
        self._report(
            request,
            "Requeued",
            moved,
            [i for i in ids if i not in {row[0] for row in blocked}],
            "only dead or cancelled jobs can be requeued",
        )

    @admin.action(description="Run now (scheduled → due now)", permissions=["run_now"])
    def run_now(self, request, queryset):
        ids = list(queryset.values_list("id", flat=True))
        using = get_settings().DATABASE
        moved = store.run_now(using, ids)
        wakeup.jobs_ready(using, moved.values())
        self._report(
            request,
            "Made due now",
            moved,
            ids,
            "only pending jobs scheduled for later can be run now",
        )

    @admin.action(
        description="Cancel (pending or waiting → cancelled; running → cancelled when its "
        "handler stops)",
        permissions=["cancel"],
    )
    def cancel(self, request, queryset):
        """The public ``cancel()``, in the name of the user (``cancelled_by`` =
        ``admin:<username>``)."""
        ids = list(queryset.values_list("id", flat=True))
        outcomes = cancellation.cancel(
            ids, by=f"admin:{request.user.get_username()}"[:200], using=get_settings().DATABASE
        )
        now = [i for i, o in outcomes.items() if o == cancellation.CANCELLED]
        marked = [i for i, o in outcomes.items() if o == cancellation.CANCELLING]
        if now:
            self.message_user(request, f"Cancelled {len(now)} job(s).", messages.SUCCESS)
        if marked:
            self.message_user(
                request,
                f"Cancelling {len(marked)} running job(s): each ends cancelled when its handler "
                "stops (at once for a handler that checks ctx.cancelled).",
                messages.SUCCESS,
            )
        refused = len(ids) - len(now) - len(marked)
        if refused:
            self.message_user(
                request,
                f"{refused} selected job(s) were left alone: they had finished already (done, "
                "dead or cancelled).",
                messages.WARNING,
            )


admin.site.register(BackgroundJob, BackgroundJobAdmin)
