"""The admin's schedule page: stored entries, editable; the settings entries, read-only.

Imported by the admin package. Every write goes through ``schedule_entries`` (``save_entry``,
``delete_entry``), like the code API, so an edit in the admin keeps the guarantee of one job per
tick and no gap while workers tick the entry. The form's validation is the scheduler's own
(``schedule_entries.validate``), its errors shown on the field they name. Adding, changing,
enabling, disabling and deleting need the model's add/change/delete permissions."""

import threading

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils.html import format_html, format_html_join

from .. import decoding, registry, schedule_entries, scheduler
from ..conf import get_settings
from ..exceptions import UnreadableJob
from ..models import ScheduleEntry
from . import readable

_shown = threading.local()  # the status rows computed once per changelist request

# ScheduleError.field -> the form's field (the entry's "type" is the model's job_type).
_FORM_FIELD = {"type": "job_type"}


# A valid value for each field, put in place of a wrong one to look for further mistakes.
_NEUTRAL = {
    "name": dict,  # (the name is replaced on its own)
    "type": lambda: {"job_type": next(iter(sorted(registry.all_types())), "")},
    "cron": lambda: {"cron": "0 0 * * *", "every": None},
    "every": lambda: {"every": 60.0, "cron": ""},
    "timezone": lambda: {"timezone": ""},
    "payload": lambda: {"payload": {}},
    "queue": lambda: {"queue": ""},
    "priority": lambda: {"priority": None},
    "catch_up": lambda: {"catch_up": "latest", "catch_up_window": None},
    "catch_up_window": lambda: {"catch_up_window": None},
    "misfire_grace": lambda: {"misfire_grace": 60.0},
}


def _unreadable(obj):
    """``(text, UnreadableJob)`` of an entry read by get_object whose payload Python cannot
    read back, else None."""
    return getattr(obj, "_dbqueue_unreadable_payload", None)


class DatalistInput(forms.TextInput):
    """A text input that suggests ``options()`` (and accepts anything, for the form to judge)."""

    def __init__(self, options, attrs=None):
        super().__init__(attrs)
        self.options = options

    def render(self, name, value, attrs=None, renderer=None):
        attrs = {**(attrs or {}), "list": f"{name}_options"}
        html = super().render(name, value, attrs, renderer)
        options = format_html_join("", '<option value="{}">', ((o,) for o in self.options()))
        return html + format_html('<datalist id="{}_options">{}</datalist>', name, options)


class ScheduleEntryForm(forms.ModelForm):
    class Meta:
        model = ScheduleEntry
        fields = ["name", "enabled", *[k for k in schedule_entries.DEFAULTS if k != "enabled"]]
        widgets = {
            "job_type": DatalistInput(lambda: sorted(registry.all_types())),
            "queue": DatalistInput(lambda: list(get_settings().QUEUES)),
        }

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned  # the field errors first (a payload that is not JSON, ...)
        name = cleaned.get("name")
        fields = {key: cleaned.get(key) for key in schedule_entries.DEFAULTS}
        # The parser stops at the first mistake; to show every one at once, each field found
        # wrong is set to a neutral value and the entry checked again.
        fixed = set()
        while True:
            try:
                schedule_entries.validate(name, fields)
                return cleaned
            except schedule_entries.ScheduleError as exc:
                field = _FORM_FIELD.get(exc.field, exc.field)
                self.add_error(field if field in self.fields else None, str(exc))
                if exc.field not in _NEUTRAL or exc.field in fixed:
                    return cleaned
                fixed.add(exc.field)
                if exc.field == "name":
                    name = "entry"
                else:
                    fields.update(_NEUTRAL[exc.field]())


class ScheduleEntryAdmin(admin.ModelAdmin):
    form = ScheduleEntryForm
    list_display = (
        "name",
        "enabled",
        "job_type",
        "timing",
        "queue_display",
        "catch_up",
        "last_tick_display",
        "next_tick_display",
    )
    list_filter = ("enabled",)
    search_fields = ("name", "job_type")
    ordering = ("name",)
    actions = ("enable", "disable")
    readonly_fields = ("last_enqueued", "last_tick", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "enabled", "job_type", "payload", "queue", "priority")}),
        ("When", {"fields": ("cron", "every", "timezone")}),
        (
            "Missed ticks",
            {
                "fields": ("catch_up", "catch_up_window", "misfire_grace"),
                "description": "Ticks that came due while no worker ran: none, the latest "
                "only, or all within the window. Ticks late by less than the misfire grace "
                "are on time and always run.",
            },
        ),
        ("State", {"fields": ("last_enqueued", "last_tick", "created_at", "updated_at")}),
    )

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return self.fieldsets[:-1]
        if _unreadable(obj) is None:
            return self.fieldsets
        # Shown read-only (has_change_permission), the payload as its text.
        (name, options), *rest = self.fieldsets
        fields = tuple("payload_unreadable" if f == "payload" else f for f in options["fields"])
        return ((name, {**options, "fields": fields}), *rest)

    def get_queryset(self, request):
        # No page loads the payload through the ORM, whose JSON decode of one that Python cannot
        # read back (a row written by hand: nested too deep, a 5000-digit number) raised out of
        # the page (RecursionError: a 500) or out of get_object (ValueError: "doesn't exist").
        # The list shows none (its entry shows why the scheduler ignores it: scheduler.status);
        # an entry's pages read it as text (get_object), as a job's page does (readable.py).
        return super().get_queryset(request).defer("payload")

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            text = (
                type(obj)
                ._base_manager.using(obj._state.db)
                .filter(pk=obj.pk)
                .values_list(Cast("payload", TextField()), flat=True)
                .first()
            )
            try:
                obj.payload = decoding.json_value(text, "payload")
            except UnreadableJob as exc:
                obj._dbqueue_unreadable_payload = (text, exc)
        return obj

    def has_change_permission(self, request, obj=None):
        # An entry whose payload Python cannot read is shown, not edited: its form would have
        # no payload to show or to keep. It can be deleted, or stored again with schedule_job().
        if obj is not None and _unreadable(obj) is not None:
            return False
        return super().has_change_permission(request, obj)

    @admin.display(description="payload")
    def payload_unreadable(self, obj):
        text, exc = _unreadable(obj)
        return format_html(
            "{}<p>The scheduler ignores this entry. Delete it, or store it again with "
            "schedule_job().</p>",
            readable.unreadable_text_html(text, exc),
        )

    def changelist_view(self, request, extra_context=None):
        rows = scheduler.status(get_settings().DATABASE)
        _shown.rows = {row["name"]: row for row in rows if row["source"] == "database"}
        extra_context = {
            **(extra_context or {}),
            "settings_schedules": [row for row in rows if row["source"] == "settings"],
        }
        return super().changelist_view(request, extra_context)

    def _row(self, obj):
        return getattr(_shown, "rows", {}).get(obj.name)

    @admin.display(description="when")
    def timing(self, obj):
        if obj.cron:
            return f"cron {obj.cron} ({obj.timezone or settings.TIME_ZONE or 'UTC'})"
        return f"every {obj.every:g} s" if obj.every is not None else "—"

    @admin.display(description="queue")
    def queue_display(self, obj):
        return obj.queue or "(the type's)"

    @admin.display(description="last tick")
    def last_tick_display(self, obj):
        return obj.last_enqueued or "never"

    @admin.display(description="next tick")
    def next_tick_display(self, obj):
        row = self._row(obj)
        if row is None:
            return "—"
        if row["error"]:
            return format_html('<span style="color: #ba2121">ignored: {}</span>', row["error"])
        if not row["enabled"]:
            return "disabled"
        return row["next_tick"] or "none"

    def save_model(self, request, obj, form, change):
        fields = {key: form.cleaned_data.get(key) for key in schedule_entries.DEFAULTS}
        saved = schedule_entries.save_entry(
            form.cleaned_data["name"], fields, entry_id=obj.pk if change else None
        )
        obj.pk = saved.pk
        for field in ScheduleEntry._meta.concrete_fields:
            setattr(obj, field.attname, getattr(saved, field.attname))

    def delete_model(self, request, obj):
        schedule_entries.delete_entry(obj.pk)

    def delete_queryset(self, request, queryset):
        for pk in queryset.values_list("pk", flat=True):
            schedule_entries.delete_entry(pk)

    def _set_enabled(self, request, queryset, enabled):
        changed = 0
        for entry in queryset:
            if entry.enabled != enabled:
                schedule_entries.update_schedule(entry.name, enabled=enabled)
                changed += 1
        word = "Enabled" if enabled else "Disabled"
        self.message_user(request, f"{word} {changed} schedule entry(ies).", messages.SUCCESS)

    @admin.action(description="Enable (ticks restart from now)", permissions=["change"])
    def enable(self, request, queryset):
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable (no more ticks)", permissions=["change"])
    def disable(self, request, queryset):
        self._set_enabled(request, queryset, False)


admin.site.register(ScheduleEntry, ScheduleEntryAdmin)
