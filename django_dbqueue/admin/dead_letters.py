"""The dead letters' page: the jobs page over the dead jobs, newest death first."""

from django.contrib import admin

from ..models import DeadLetter
from ..states import JobState
from .filters import QueueFilter, TypeFilter
from .jobs import BackgroundJobAdmin


class DeadLetterAdmin(BackgroundJobAdmin):
    """The dead letters: jobs that spent their attempts or were discarded. Newest death first."""

    list_display = [
        "id",
        "type_display",
        "queue",
        "attempts_display",
        "finished_at_display",
        "last_error",
    ]
    list_filter = [QueueFilter, TypeFilter]
    ordering = ["-finished_at", "-id"]
    actions = ["requeue", "delete_finished"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(state=JobState.DEAD)

    def has_requeue_permission(self, request):
        return request.user.has_perm("django_dbqueue.requeue_backgroundjob")


admin.site.register(DeadLetter, DeadLetterAdmin)
