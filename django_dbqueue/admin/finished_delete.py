"""The jobs pages' "Delete finished jobs" action, at the scale of the table: a confirmation page
of counts, then the delete in batches of ids, each one statement of the store's.

Django's own confirm-then-delete (``delete_selected``) collects every selected row and every
related row as objects, lists each on the page with a hidden input per row, and logs a
``LogEntry`` per row: a select-all over 100,000 jobs took half a minute and 18 MB of HTML for
the page (a form of 100,000 fields, past ``DATA_UPLOAD_MAX_NUMBER_FIELDS``, which Django then
refuses) and about a minute to delete. Here the page costs one grouped count, whatever the selection; the delete reads ids in
keyset batches and deletes each batch with ``store.delete_finished``, which re-tests the state
(and the confirmation's time) in the DELETE itself, as requeue and cancel re-test theirs.

What the confirmation covers: the selected jobs that were finished when the page was shown.
The page carries the database's time then (``finished_before``); the delete takes the jobs of
the selection (re-read at the confirm: the same ids, or with select-all the same filters) that
are finished and finished no later than that. A job requeued since, or that finished only
after the page was shown, is left alone, and the message counts it.
"""

import datetime
import logging

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import model_ngettext
from django.db.models import Count
from django.template.response import TemplateResponse

from .. import store
from ..conf import get_settings
from ..states import FINISHED_STATES

logger = logging.getLogger("django_dbqueue")

BATCH = 10_000  # ids per DELETE: bounds one statement's locks and its array parameter
TEMPLATE = "admin/django_dbqueue/delete_finished_confirmation.html"
LEFT_ALONE = (
    "{n} selected job(s) were left alone: only finished jobs (done, dead or cancelled) can be "
    "deleted; cancel a pending job first, and let a running one finish."
)


def action(model_admin, request, queryset):
    """The action: the confirmation page, or (``post=yes``) the delete it confirms."""
    if request.POST.get("post") == "yes":
        confirm(model_admin, request, queryset)
        return None
    return confirmation_page(model_admin, request, queryset)


def counts(queryset):
    """``{state: number}`` of the selected jobs, in one grouped count."""
    return dict(queryset.order_by().values_list("state").annotate(n=Count("pk")))


def confirmation_page(model_admin, request, queryset):
    """The page that asks: how many finished jobs, by state, and how many left alone. None
    (with the warning) when none of the selection is finished."""
    using = get_settings().DATABASE
    shown_at = store.db_now(using)  # before the count: what it counts finished by then
    by_state = counts(queryset)
    finished = [(state, by_state[state]) for state in FINISHED_STATES if by_state.get(state)]
    deletable = sum(n for _, n in finished)
    refused = sum(by_state.values()) - deletable
    if refused:
        model_admin.message_user(request, LEFT_ALONE.format(n=refused), messages.WARNING)
    if not deletable:
        return None
    opts = model_admin.model._meta
    request.current_app = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Delete finished jobs",
        "subtitle": None,
        "opts": opts,
        "media": model_admin.media,
        "objects_name": model_ngettext(opts, deletable),
        "deletable": deletable,
        "by_state": finished,
        "refused": refused,
        "select_across": request.POST.get("select_across", "0"),
        # The ids the list's form posted: at most a page of them (with select-all the filters
        # of the URL choose the rows, not these).
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "action_name": "delete_finished",  # this action, whichever form of the list posted
        "finished_before": shown_at.isoformat(),
    }
    return TemplateResponse(request, TEMPLATE, context)


def _finished_before(request):
    """The confirmation page's time, or None when the POST carries none that reads as one."""
    try:
        value = datetime.datetime.fromisoformat(request.POST.get("finished_before", ""))
    except ValueError:
        return None
    return value if value.tzinfo is not None else None


def confirm(model_admin, request, queryset):
    """Delete what the confirmation page counted, in batches; report what was deleted and what
    was left alone."""
    finished_before = _finished_before(request)
    if finished_before is None:
        model_admin.message_user(
            request,
            "Nothing was deleted: the confirmation did not say when it was shown. Choose "
            "“Delete finished jobs” again.",
            messages.ERROR,
        )
        return
    selected = queryset.order_by().count()
    deleted = delete(queryset, finished_before=finished_before)
    if deleted:
        model_admin.message_user(
            request,
            f"Successfully deleted {deleted} {model_ngettext(model_admin.opts, deleted)}.",
            messages.SUCCESS,
        )
        logger.info(
            "dbqueue admin: %s deleted %d finished job(s) from %s",
            request.user.get_username(),
            deleted,
            model_admin.opts.label,
        )
    if selected > deleted:
        model_admin.message_user(
            request,
            f"{selected - deleted} selected job(s) were left alone: only finished jobs can be "
            "deleted, and only those finished when the confirmation page was shown (a job "
            "requeued since, or pending or running, stays).",
            messages.WARNING,
        )


def delete(queryset, *, finished_before=None):
    """Delete the finished jobs of ``queryset`` (finished at or before ``finished_before``
    when given), ``BATCH`` ids per statement, each committing on its own unless a transaction
    is open; returns how many were deleted. The ids are read in id order after the last batch
    (keyset), so each read is a short range scan of the primary key under the filters."""
    using = get_settings().DATABASE
    ids = queryset.order_by("pk").filter(state__in=FINISHED_STATES)
    if finished_before is not None:
        ids = ids.filter(finished_at__lte=finished_before)
    ids = ids.values_list("pk", flat=True)
    deleted, last = 0, 0
    while True:
        batch = list(ids.filter(pk__gt=last)[:BATCH])
        if not batch:
            return deleted
        deleted += len(store.delete_finished(using, batch, finished_before=finished_before))
        if len(batch) < BATCH:
            return deleted
        last = batch[-1]
