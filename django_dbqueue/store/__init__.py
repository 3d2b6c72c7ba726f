"""The only code that runs django-dbqueue's SQL, and the only writer of job state.

Each module holds one concept's statements, named after what they do with the reason above
each, beside the thin functions that run them. Each function takes the database alias (or a
worker's Session) and plain values and returns plain values; none builds an ORM instance. On an
alias they run on the calling thread's Django connection, so inside ``transaction.atomic`` they
take part in the caller's transaction. Values are always bound parameters; statements that touch
many rows take arrays and ``unnest`` them, so a batch is one round trip; time is always the
database's ``now()``, never a worker's clock.

This module is the interface the rest of the package uses (``from . import store``,
``store.claim(...)``): it re-exports the names callers need, and nothing else.
"""

from ._db import int_array, text_array
from .batches import claim_more_statement
from .claiming import (
    ClaimedRow,
    claim,
    claim_statement,
    claimed_rows,
    count_due,
    new_token,
    read_claimed,
)
from .completion import (
    complete,
    complete_ending,
    complete_statement,
    completed_endings,
    defer_unknown_type,
    end_cancelled,
    fail,
    fail_job,
    read_back,
    snooze,
)
from .dashboard import (
    dashboard_clock,
    dashboard_depth,
    dashboard_finished,
    dashboard_waits,
    dashboard_workers,
    prune_rollup,
    rollup_minute,
)
from .deliveries import begin_delivery, delivery, settle_deliveries, settle_delivery
from .events import (
    event,
    event_by_key,
    event_jobs,
    prune_events,
    publish_event,
    replay_event,
)
from .flow import ensure_queues, flow_state, pause_queue, rate_window, resume_queue
from .jobs import (
    ids_by_keys,
    insert_job,
    insert_jobs,
    insert_unique_job,
    task_result_row,
    unique_holder,
)
from .leases import (
    extend_leases,
    hand_back,
    hand_back_unknown,
    release,
    release_ending,
    release_unknown,
    renew_leases,
    rescue_expired,
)
from .metrics import metrics_snapshot
from .operations import (
    cancel,
    count_dead,
    dead_ids,
    delete_finished,
    job_status,
    job_steps,
    prune,
    request_cancel,
    requeue,
    requeue_blocked,
    run_now,
    status,
)
from .schedule import (
    StoredEntry,
    advance_schedule,
    advance_schedule_entry,
    ensure_schedule,
    lock_schedule,
    lock_schedule_entry,
    lock_schedule_entry_for_edit,
    schedule_state,
    schedule_status,
)
from .schema import applied_migrations, missing_tables, schema_writers
from .steps import (
    db_now,
    list_steps,
    load_held_steps,
    load_steps,
    read_signal,
    save_step,
    signal_job,
)
from .testing import (
    AliasSession,
    advance_clock,
    apply_at_commit,
    find_jobs,
    hold_other_types,
    release_held,
)
from .workers import announce_worker, forget_expired_workers, live_workers, withdraw_worker
from .workflows import dependency_results, insert_workflow, workflow_neighbours

__all__ = [
    "AliasSession",
    "ClaimedRow",
    "StoredEntry",
    "advance_clock",
    "advance_schedule",
    "advance_schedule_entry",
    "announce_worker",
    "applied_migrations",
    "apply_at_commit",
    "begin_delivery",
    "cancel",
    "claim",
    "claim_more_statement",
    "claim_statement",
    "claimed_rows",
    "complete",
    "complete_ending",
    "complete_statement",
    "completed_endings",
    "count_dead",
    "count_due",
    "dashboard_clock",
    "dashboard_depth",
    "dashboard_finished",
    "dashboard_waits",
    "dashboard_workers",
    "db_now",
    "dead_ids",
    "defer_unknown_type",
    "delete_finished",
    "delivery",
    "dependency_results",
    "end_cancelled",
    "ensure_queues",
    "ensure_schedule",
    "event",
    "event_by_key",
    "event_jobs",
    "extend_leases",
    "fail",
    "fail_job",
    "find_jobs",
    "flow_state",
    "forget_expired_workers",
    "hand_back",
    "hand_back_unknown",
    "hold_other_types",
    "ids_by_keys",
    "insert_job",
    "insert_jobs",
    "insert_unique_job",
    "insert_workflow",
    "int_array",
    "job_status",
    "job_steps",
    "list_steps",
    "live_workers",
    "load_held_steps",
    "load_steps",
    "lock_schedule",
    "lock_schedule_entry",
    "lock_schedule_entry_for_edit",
    "metrics_snapshot",
    "missing_tables",
    "new_token",
    "pause_queue",
    "prune",
    "prune_events",
    "prune_rollup",
    "publish_event",
    "rate_window",
    "read_back",
    "read_claimed",
    "read_signal",
    "release",
    "release_ending",
    "release_held",
    "release_unknown",
    "renew_leases",
    "replay_event",
    "request_cancel",
    "requeue",
    "requeue_blocked",
    "rescue_expired",
    "resume_queue",
    "rollup_minute",
    "run_now",
    "save_step",
    "schedule_state",
    "schedule_status",
    "schema_writers",
    "settle_deliveries",
    "settle_delivery",
    "signal_job",
    "snooze",
    "status",
    "task_result_row",
    "text_array",
    "unique_holder",
    "withdraw_worker",
    "workflow_neighbours",
]
