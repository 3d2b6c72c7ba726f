"""Schedule entries stored in the database: periodic jobs an operator edits without a deploy.

Beside ``DBQUEUE["SCHEDULE"]`` (read-only, from settings), entries live in the table
``dbqueue_schedule_entry`` (model ``ScheduleEntry``), editable in the admin and from code with
:func:`schedule_job`, :func:`update_schedule` and :func:`unschedule_job`. Every write, the
admin's included, goes through :func:`save_entry` or :func:`delete_entry`, which keep the
leaderless guarantee (one job per tick, no gap) while workers tick the entry:

- the write locks the entry's row ``FOR UPDATE``, waiting for a worker that is ticking it (whose
  ticks then are committed, and its ``last_tick`` is read back); workers skip a row the write
  holds (``SKIP LOCKED``) until it commits;
- under that lock it first enqueues, with the *old* definition, the ticks that came due before
  the write (what the next worker pass would have enqueued), in the caller's transaction;
- then it writes the new definition. A changed timing (``cron``, ``every``, ``timezone``) or an
  entry enabled again restarts the ticks at the write: the new timing's first tick is its first
  after the write, so a change never fires a burst of ticks the new timing would have had in the
  past, and ticks that came due while an entry was disabled never run. Any other change (payload,
  queue, priority, type, catch-up) takes effect from the next tick;
- disabling or deleting stops the ticks after those due before the write are enqueued.

The writes run in the caller's transaction when there is one (a savepoint otherwise): the row
stays locked, and workers skip the entry, until it commits; a rollback undoes the edit and the
ticks it enqueued alike. A raw ``UPDATE`` of the table (or ``QuerySet.update()``) bypasses all
of this and the validation: use these functions.
"""

import datetime
import logging

from django.db import IntegrityError, ProgrammingError, transaction
from django.db.models.functions import Now

from . import scheduler, schema, store
from .conf import get_settings
from .schedule_parser import ScheduleError

__all__ = [
    "ScheduleError",
    "delete_entry",
    "save_entry",
    "schedule_job",
    "unschedule_job",
    "update_schedule",
    "validate",
]

logger = logging.getLogger("django_dbqueue")

# The model's definition columns, and their defaults (an entry made by schedule_job()).
DEFAULTS = {
    "job_type": None,
    "cron": "",
    "every": None,
    "timezone": "",
    "payload": None,
    "queue": "",
    "priority": None,
    "catch_up": "latest",
    "catch_up_window": None,
    "misfire_grace": 60.0,
    "enabled": True,
}
TIMING = ("cron", "every", "timezone")  # a change of these restarts the ticks


def _normalised(fields):
    """``fields`` with ``None`` as ``""`` in the text columns and the payload ``{}`` if unset."""
    result = dict(fields)
    for key in ("cron", "timezone", "queue"):
        if result.get(key) is None:
            result[key] = ""
    if result.get("payload") is None:
        result["payload"] = {}
    if isinstance(result.get("every"), datetime.timedelta):
        result["every"] = result["every"].total_seconds()
    return result


def validate(name, fields, conf=None):
    """The :class:`Schedule` of a stored entry ``name`` with ``fields`` (the model's columns), or
    a :class:`ScheduleError` naming the wrong key in ``.field`` (``"type"`` is ``job_type``)."""
    conf = conf or get_settings()
    where = f"schedule entry {name!r}"
    unknown = set(fields) - set(DEFAULTS)
    if unknown:
        raise ScheduleError(
            f"{where}: unknown fields {sorted(unknown)}; allowed: {sorted(DEFAULTS)}"
        )
    if not isinstance(fields.get("enabled", True), bool):
        raise ScheduleError(f"{where}: enabled must be True or False", field="enabled")
    if isinstance(name, str) and name in conf.SCHEDULE:
        raise ScheduleError(
            f"{where}: DBQUEUE['SCHEDULE'] has an entry of that name; choose another name",
            field="name",
        )
    columns = {k: v for k, v in _normalised(fields).items() if k != "enabled"}
    return scheduler.parse_entry(name, scheduler.stored_entry(**columns), conf, where=where)


def schedule_job(
    name,
    job_type,
    *,
    cron=None,
    every=None,
    timezone=None,
    payload=None,
    queue=None,
    priority=None,
    enabled=True,
    catch_up="latest",
    catch_up_window=None,
    misfire_grace=60.0,
    using=None,
):
    """Create the stored schedule entry ``name``, or replace the definition of the one there is
    (keeping its ticks' progress); returns the ``ScheduleEntry``.

    Give exactly one of ``cron`` (a 5-field expression, read in ``timezone``, an IANA zone
    name, else ``TIME_ZONE``; six or seven fields are refused) and ``every`` (seconds or a ``timedelta``, aligned to the Unix epoch).
    ``catch_up``: ``"none"``, ``"latest"`` or ``"all"`` (with ``catch_up_window`` seconds, one
    day by default) for ticks missed while no worker ran. Raises :class:`ScheduleError` naming
    what is wrong (unknown job type, bad cron, unknown zone, a payload JSON cannot carry, ...).
    Runs in the caller's transaction, if any: see the module's docstring.
    """
    fields = {
        "job_type": job_type,
        "cron": cron,
        "every": every,
        "timezone": timezone,
        "payload": payload,
        "queue": queue,
        "priority": priority,
        "catch_up": catch_up,
        "catch_up_window": catch_up_window,
        "misfire_grace": misfire_grace,
        "enabled": enabled,
    }
    return save_entry(name, fields, using=using)


def update_schedule(name, *, using=None, **changes):
    """Change some fields of the stored entry ``name`` (``enabled=False`` disables it, ``cron=``
    moves it, ...); returns the ``ScheduleEntry``. Raises :class:`ScheduleError` when there is no
    such entry or the result is invalid. Setting ``cron`` clears ``every`` and the reverse."""
    from .models import ScheduleEntry

    using = using or get_settings().DATABASE
    try:
        entry = ScheduleEntry.objects.using(using).filter(name=name).first()
    except ProgrammingError as exc:
        schema.raise_if_unmigrated(exc, using)  # in the caller's transaction, if any
        raise
    if entry is None:
        raise ScheduleError(f"no stored schedule entry is named {name!r}", field="name")
    new_name = changes.pop("name", name)
    fields = {key: getattr(entry, key) for key in DEFAULTS}
    if changes.get("cron"):
        fields["every"] = None
    if changes.get("every") is not None:
        fields["cron"] = ""
    fields.update(changes)
    return save_entry(new_name, fields, entry_id=entry.pk, using=using)


def unschedule_job(name, using=None):
    """Delete the stored entry ``name`` (after enqueueing the ticks already due); returns whether
    there was one."""
    from .models import ScheduleEntry

    using = using or get_settings().DATABASE
    try:
        entry_id = ScheduleEntry.objects.using(using).filter(name=name).values_list("pk").first()
    except ProgrammingError as exc:
        schema.raise_if_unmigrated(exc, using)  # in the caller's transaction, if any
        raise
    return entry_id is not None and delete_entry(entry_id[0], using=using)


def save_entry(name, fields, *, entry_id=None, using=None):
    """Create (``entry_id`` None and no entry of that ``name``) or edit a stored entry: validate,
    lock, enqueue what came due under the old definition, write. Returns the ``ScheduleEntry``;
    raises ``NotMigrated`` on a database without the queue's tables."""
    conf = get_settings()
    using = using or conf.DATABASE
    fields = _normalised({**DEFAULTS, **fields})
    validate(name, fields, conf)
    try:
        return _save(name, fields, entry_id, using, conf)
    except ProgrammingError as exc:
        # Its statements ran in an atomic block, rolled back: a caller's transaction goes on.
        schema.raise_if_unmigrated(exc, using, aborted=False)
        raise


def _save(name, fields, entry_id, using, conf):
    """:func:`save_entry` once ``fields`` are valid: in an atomic block on ``using``."""
    from .models import ScheduleEntry

    entries = ScheduleEntry.objects.using(using)
    with transaction.atomic(using=using):
        if entry_id is None:
            found = entries.filter(name=name).values_list("pk").first()
            entry_id = found and found[0]
        if entry_id is None:
            try:
                with transaction.atomic(using=using):
                    return entries.create(name=name, **fields)  # last_tick: now()
            except IntegrityError:
                found = entries.filter(name=name).values_list("pk").first()
                if found is None:
                    raise
                entry_id = found[0]  # created meanwhile by someone else: edit it
        locked = store.lock_schedule_entry_for_edit(using, entry_id)
        if locked is None:
            raise ScheduleError(f"schedule entry {name!r} was deleted meanwhile", field="name")
        old, now, was_enabled = locked
        last_tick = _settle(old, now, using, conf) if was_enabled else old.last_tick
        restart = (fields["enabled"] and not was_enabled) or any(
            fields[key] != getattr(old, key) for key in TIMING
        )
        changes = {**fields, "name": name, "updated_at": Now()}
        if restart:
            changes["last_tick"] = max(last_tick, now)
        try:
            with transaction.atomic(using=using):
                entries.filter(pk=entry_id).update(**changes)
        except IntegrityError:
            raise ScheduleError(
                f"schedule entry {name!r}: another entry has that name", field="name"
            ) from None
        return entries.get(pk=entry_id)


def delete_entry(entry_id, using=None):
    """Delete a stored entry after enqueueing the ticks due before now; False if it was gone."""
    conf = get_settings()
    using = using or conf.DATABASE
    with transaction.atomic(using=using):
        locked = store.lock_schedule_entry_for_edit(using, entry_id)
        if locked is None:
            return False
        old, now, was_enabled = locked
        if was_enabled:
            _settle(old, now, using, conf)
        from .models import ScheduleEntry

        ScheduleEntry.objects.using(using).filter(pk=entry_id).delete()
        return True


def _settle(old, now, using, conf):
    """Enqueue what came due under ``old`` (a locked ``store.StoredEntry``) up to ``now``, as a
    worker's pass would; returns the entry's ``last_tick`` after it."""
    try:
        schedule = scheduler.parse_stored(old, conf)
    except ScheduleError as exc:  # it could not tick before either (e.g. a type since removed)
        logger.warning("dbqueue schedule entry %r: not settled before the edit: %s", old.name, exc)
        return old.last_tick
    due, enqueued = scheduler.enqueue_due(schedule, old.last_tick, now, using)
    if due.advance_to is None:
        return old.last_tick
    store.advance_schedule_entry(using, old.id, due.advance_to, enqueued)
    return due.advance_to
