"""The delivery records' page: read-only, settled by hand (mark sent, mark failed)."""

from django.contrib import admin, messages

from .. import store
from ..models import JobDelivery
from ..states import DeliveryState
from .common import CappedCountPaginator, exact_search


class UnconfirmedFilter(admin.SimpleListFilter):
    title = "confirmation"
    parameter_name = "unconfirmed"

    def lookups(self, request, model_admin):
        return [("yes", "unconfirmed (outcome unknown)")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(state=DeliveryState.RECORDED)
        return queryset


class JobDeliveryAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "key",
        "state",
        "job_id",
        "attempt",
        "provider_reference",
        "created_at",
        "updated_at",
    ]
    list_filter = [UnconfirmedFilter, "state"]
    search_fields = ["key"]
    search_help_text = "An exact delivery key, or the id of the job that made it."
    ordering = ["-id"]
    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["mark_sent", "mark_failed"]
    readonly_fields = [
        "key",
        "state",
        "job",
        "attempt",
        "provider_reference",
        "error",
        "created_at",
        "updated_at",
    ]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # a record is the only memory that an effect happened: deleting it lets a
        # retry perform the effect again

    def get_search_results(self, request, queryset, search_term):
        return exact_search(queryset, search_term, "key", id_field="job_id"), False

    def has_settle_permission(self, request):
        return request.user.has_perm("django_dbqueue.settle_jobdelivery")

    def _settle(self, request, queryset, state, note):
        selected = list(queryset.values_list("id", flat=True))
        moved = store.settle_deliveries(queryset.db, selected, state=str(state), error=note)
        if moved:
            self.message_user(
                request, f"Marked {moved} delivery record(s) {state}.", messages.SUCCESS
            )
        if len(selected) - moved:
            self.message_user(
                request,
                f"{len(selected) - moved} selected record(s) were left alone: only unconfirmed "
                "(recorded) deliveries can be settled.",
                messages.WARNING,
            )

    @admin.action(
        description="Mark sent (the provider confirms it happened)", permissions=["settle"]
    )
    def mark_sent(self, request, queryset):
        self._settle(request, queryset, DeliveryState.SENT, "")

    @admin.action(
        description="Mark failed (it did not happen; a retry may send it)", permissions=["settle"]
    )
    def mark_failed(self, request, queryset):
        self._settle(
            request, queryset, DeliveryState.FAILED, f"marked failed by {request.user} in the admin"
        )


admin.site.register(JobDelivery, JobDeliveryAdmin)
