"""The job lists' filters: type (or task), queue, stuck, flow control.

The choices come from settings and the registry, never from a ``SELECT DISTINCT``.
"""

from django.contrib import admin
from django.db.models import Q
from django.db.models.functions import Now

from .. import names, registry
from ..conf import get_settings
from ..models import UNIQUE_HELD
from ..states import JobState

TASK_PREFIX = "task:"


class TypeFilter(admin.SimpleListFilter):
    """By registered type, or by the task of a ``django.tasks`` job (``?type=task:<path>``).

    The choices are the registered types and the ``@task``s this process knows (names.py), not
    a ``SELECT DISTINCT``; any task path typed into the URL filters as well, compared as text.
    """

    title = "type"
    parameter_name = "type"

    def lookups(self, request, model_admin):
        choices = [(name, name) for name in sorted(registry.all_types())]
        return choices + [(TASK_PREFIX + path, path) for path in names.known_tasks()]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        if value.startswith(TASK_PREFIX) and registry.get(value) is None:
            return queryset.filter(type=names.TASKS_TYPE, payload__task=value[len(TASK_PREFIX) :])
        return queryset.filter(type=value)


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [(name, name) for name in get_settings().QUEUES]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


class StuckFilter(admin.SimpleListFilter):
    """Running past its lease: its worker died or hung; the sweeper will take it back."""

    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request, model_admin):
        return [("yes", "running past its lease")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(state=JobState.RUNNING, leased_until__lt=Now())
        return queryset


class FlowFilter(admin.SimpleListFilter):
    """Jobs holding a unique key now, or live jobs with a serial key (docs/concepts/keys.md)."""

    title = "flow control"
    parameter_name = "flow"

    def lookups(self, request, model_admin):
        return [("unique", "holding a unique key"), ("serial", "live, with a serial key")]

    def queryset(self, request, queryset):
        if self.value() == "unique":
            return queryset.filter(UNIQUE_HELD)
        if self.value() == "serial":
            return queryset.filter(live_serial(None))
        return queryset


def live_serial(key):
    """Live jobs with serial key ``key`` (any key for ``None``): dbqueue_job_serial_idx."""
    condition = Q(state__in=[JobState.PENDING, JobState.RUNNING])
    return condition & (Q(serial_key__isnull=False) if key is None else Q(serial_key=key))
