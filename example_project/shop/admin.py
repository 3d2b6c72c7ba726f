from django.contrib import admin

from .models import Customer, Invoice, ProviderCharge


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ("name", "email")
    search_fields = ("name", "email")


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ("number", "customer", "amount", "created_at", "emailed_at", "paid_at")
    list_filter = (
        ("emailed_at", admin.EmptyFieldListFilter),
        ("paid_at", admin.EmptyFieldListFilter),
    )
    search_fields = ("number", "customer__email", "customer__name", "=charge_id")
    list_select_related = ("customer",)
    readonly_fields = ("created_at", "emailed_at", "paid_at", "charge_id")
    date_hierarchy = "created_at"


@admin.register(ProviderCharge)
class ProviderChargeAdmin(admin.ModelAdmin):
    """The fake payment provider's "dashboard": read-only, as the real one would be to the shop."""

    list_display = ("charge_id", "idempotency_key", "amount", "customer", "requests", "created_at")
    search_fields = ("=charge_id", "=idempotency_key", "customer")
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
